"""Past one process: a real MLflow server, parallel sweep jobs on the SQLite store, DDP with two
CPU processes, and the SLURM launcher's config."""

from __future__ import annotations

import math
import os
import signal
import socket
import subprocess
from pathlib import Path

import mlflow
import pytest
from conftest import ROOT, TINY, artifact_paths, no_runs, runs_of

from seqlab import SeqlabError
from seqlab.store.server import LocalServer
from seqlab.sweeps.job import cpu_count

N_TRAIN = 205  # TINY: 256 samples, 20% held out for validation


def _children(client, experiment="seqlab"):
    runs = runs_of(client, experiment)
    parents = [r for r in runs if r.data.tags.get("sweep_role") == "parent"]
    children = [r for r in runs if r.data.tags.get("sweep_role") != "parent"]
    return parents, children


def _port_closed(uri: str) -> bool:
    host, port = uri.removeprefix("http://").split(":")
    with socket.socket() as s:
        return s.connect_ex((host, int(port))) != 0


def test_a_multirun_sent_to_a_real_server(run_cli, store, tmp_path, mlflow_server):
    server = mlflow_server  # the session's server, in an experiment of this test's own
    proc = run_cli(
        "-m",
        "data.batch_size=32,64",
        "logger=mlflow_server",
        *TINY,
        "logger.experiment_name=to-a-server",
        env={"MLFLOW_TRACKING_URI": server.uri},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    client = mlflow.MlflowClient(server.uri)
    (parent,), children = _children(client, "to-a-server")
    assert parent.info.status == "FINISHED"
    assert sorted(r.info.run_name for r in children) == ["cpu-bs32", "cpu-bs64"]
    for run in children:
        bs = int(run.data.params["data.batch_size"])
        assert run.info.status == "FINISHED"
        assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id
        steps = client.get_metric_history(run.info.run_id, "train_loss")
        assert [m.step for m in steps] == list(range(1, 2 * math.ceil(N_TRAIN / bs) + 1))
        assert len(client.get_metric_history(run.info.run_id, "val_rmse")) == 2
        # Artifacts went through the server (no path on this client's disk in their location).
        assert run.info.artifact_uri.startswith("mlflow-artifacts:")
        assert {"config.yaml", "checkpoints/last.ckpt"} <= artifact_paths(client, run.info.run_id)
    assert any(
        p.name.startswith("comparison")
        for p in map(Path, artifact_paths(client, parent.info.run_id))
    )
    assert no_runs(store)  # nothing went to the local store


# -- parallel sweep jobs ------------------------------------------------------------------------
@pytest.mark.fresh_store  # the sweep makes a new store's tables before its jobs race to
def test_parallel_jobs_on_the_sqlite_store_lose_nothing(run_process, store, tmp_path):
    proc = run_process(
        "-m",
        "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=2",
        "data.batch_size=16,32,64",
        *TINY,
        timeout=600,
    )  # 3 jobs: a worker takes a second
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "database is locked" not in out
    (parent,), children = _children(store)
    assert parent.info.status == "FINISHED" and parent.data.tags["n_jobs"] == "3"
    assert len(children) == 3
    threads = str(max(1, cpu_count() // 2))
    for run in children:
        bs = int(run.data.params["data.batch_size"])
        assert run.info.status == "FINISHED", run.data.tags.get("failure_reason")
        assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert run.data.tags["torch_threads"] == threads  # the cores shared between the two jobs
        losses = store.get_metric_history(run.info.run_id, "train_loss")
        assert [m.step for m in losses] == list(range(1, 2 * math.ceil(N_TRAIN / bs) + 1))
        assert len(store.get_metric_history(run.info.run_id, "val_rmse")) == 2
        assert "checkpoints/last.ckpt" in artifact_paths(store, run.info.run_id)
    # The jobs logged through the sweep's own server, which is gone now.
    (sweep_dir,) = (tmp_path / "logs" / "multiruns").iterdir()
    info = __import__("json").loads((sweep_dir / "sweep.json").read_text())
    assert info["store_uri"] == f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    assert info["tracking_uri"].startswith("http://127.0.0.1:") and _port_closed(
        info["tracking_uri"]
    )
    assert (sweep_dir / "mlflow_server.log").is_file()


@pytest.mark.fresh_store
def test_a_parallel_sweep_stopped_by_a_signal_ends_its_parent_killed_and_its_server(
    tmp_path, store
):
    """docs/scaling.md: the parent process of a parallel sweep only waits for its workers; a
    SIGTERM (scancel, kill) ends it with 128 + the signal, its parent run KILLED with the command
    that continues the sweep, and its loopback server stopped. SIGHUP takes the same handler (below)."""
    signame = "SIGTERM"
    import json
    import signal
    import time

    from conftest import start_cli

    out = tmp_path / "out.txt"
    with open(out, "w") as sink:
        proc = start_cli(
            tmp_path,
            "-m",
            "hydra/launcher=joblib",
            "hydra.launcher.n_jobs=2",
            "data.batch_size=32,64",
            "data.n_samples=256",
            "trainer.max_epochs=2000",
            "logger.system_metrics=false",
            stdout=sink,
            stderr=subprocess.STDOUT,
            new_session=True,
        )
    try:
        deadline = time.monotonic() + 240
        while (
            "epoch 2/" not in out.read_text()
            and proc.poll() is None
            and time.monotonic() < deadline
        ):
            time.sleep(0.2)
        assert "epoch 2/" in out.read_text(), out.read_text()[-3000:]  # the jobs are training
        _only_the_sweeps_jobs_get_in(tmp_path, proc.pid)
        proc.send_signal(getattr(signal, signame))  # to the parent process alone
        proc.wait(timeout=120)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the launcher's workers, if any are left
        except ProcessLookupError:
            pass
    text = out.read_text()
    assert proc.returncode == 128 + getattr(signal, signame), text[-3000:]
    (sweep_dir,) = (tmp_path / "logs" / "multiruns").iterdir()
    info = json.loads((sweep_dir / "sweep.json").read_text())
    parent = store.get_run(info["parent_run_id"])
    assert parent.info.status == "KILLED" and parent.data.tags["sweep_role"] == "parent"
    assert "the sweep stopped before its summary" in parent.data.tags["failure_reason"]
    assert "ended KILLED; continue it (finished jobs are skipped) with:" in text
    assert f"resume={info['sweep_id']}" in text
    assert _port_closed(info["tracking_uri"])  # the sweep's server is gone with it


def _only_the_sweeps_jobs_get_in(tmp_path, sweep_pid: int) -> None:
    """Issue 34, point 2: a parallel sweep's loopback server signs its jobs in with a password of the
    sweep's, which is in the environment of the sweep's processes and on no command line; another user
    of the machine, without it, reads and writes nothing (before: every run, to anyone)."""
    import json

    import requests

    (sweep_dir,) = (tmp_path / "logs" / "multiruns").iterdir()
    search = (
        json.loads((sweep_dir / "sweep.json").read_text())["tracking_uri"]
        + "/api/2.0/mlflow/runs/search"
    )
    assert requests.post(search, json={"experiment_ids": ["0"]}, timeout=30).status_code == 401
    assert (
        requests.post(
            search,
            json={"experiment_ids": ["0"]},
            auth=("seqlab-sweep", "a-guess-at-it"),
            timeout=30,
        ).status_code
        == 401
    )
    # The jobs' processes (the launcher's workers, started after the server) hold the password.
    found = set()
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            values = dict(
                v.split("=", 1) for v in environ.read_text(errors="replace").split("\0") if "=" in v
            )
        except OSError:
            continue
        if values.get("MLFLOW_TRACKING_USERNAME") == "seqlab-sweep" and values.get(
            "MLFLOW_TRACKING_PASSWORD"
        ):
            found.add(values["MLFLOW_TRACKING_PASSWORD"])
    signed_in = [
        p
        for p in found
        if requests.post(
            search, json={"experiment_ids": ["0"]}, auth=("seqlab-sweep", p), timeout=30
        ).status_code
        == 200
    ]
    assert len(signed_in) == 1, (
        f"{len(found)} password(s) in the sweep's processes, {len(signed_in)} signed in"
    )
    password = signed_in[0]
    assert len(password) >= 24
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            assert password not in cmdline.read_bytes().decode(errors="replace"), cmdline
        except OSError:
            pass  # a process that ended meanwhile


def test_a_server_whose_port_another_program_took_starts_on_another(tmp_path, monkeypatch):
    """A loopback server's port is chosen free, then bound seconds later by the server: another
    program (here one that answers /health too, as a served model does) can take it in between.
    The server is not taken to be up on the other program's answer; it starts again on a new port."""
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    from seqlab.store import server as server_module

    class Health(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()

        def log_message(self, *args):
            pass

    squatter = HTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=squatter.serve_forever, daemon=True).start()
    taken = squatter.server_address[1]
    try:
        db, art = f"sqlite:///{tmp_path}/server/mlflow.db", str(tmp_path / "server" / "art")
        with pytest.raises(
            SeqlabError, match=rf"the MLflow server for http://127.0.0.1:{taken} exited with status"
        ):
            LocalServer(
                db, art, port=taken, log_path=tmp_path / "given.log"
            ).start()  # a port given is kept

        # A sweep's job knows its server by pid: the other program's answer is not taken for it,
        # and a server that is gone is one line.
        alive_elsewhere = subprocess.Popen(["sleep", "30"])
        try:
            with pytest.raises(
                SeqlabError,
                match=rf"the MLflow server for http://127.0.0.1:{taken} did not answer within 2 s",
            ):
                server_module.wait_until_up(
                    f"http://127.0.0.1:{taken}", timeout_s=2, pid=alive_elsewhere.pid
                )
        finally:
            alive_elsewhere.kill()
            alive_elsewhere.wait()
        with pytest.raises(
            SeqlabError,
            match=rf"the MLflow server for http://127.0.0.1:{taken} \(pid {alive_elsewhere.pid}\) is gone",
        ):
            server_module.wait_until_up(
                f"http://127.0.0.1:{taken}", timeout_s=30, pid=alive_elsewhere.pid
            )

        ports = iter([taken])
        free = server_module.free_port
        monkeypatch.setattr(
            server_module, "free_port", lambda host="127.0.0.1": next(ports, None) or free(host)
        )
        with LocalServer(db, art, log_path=tmp_path / "chosen.log") as server:
            assert server.port != taken
            assert (
                mlflow.MlflowClient(server.uri).search_experiments()[0].name == "Default"
            )  # MLflow, not the other program
    finally:
        squatter.shutdown()


def test_make_server_keeps_the_databases_password_off_every_command_line(
    postgres, run_cli, tmp_path
):
    # Issue 24, point 6: `make server BACKEND_STORE_URI=postgresql://user:password@...` echoed the
    # password and left it on the command lines of seqlab.store.server and mlflow server (ps).
    # The server on PostgreSQL it starts is also where a run is logged: its metrics and artifacts land.
    import psutil
    from conftest import POSTGRES_PASSWORD

    from seqlab.store.server import free_port, wait_until_up

    port = free_port()
    # As docs/scaling.md says to start it: the URL in make's environment (BACKEND_STORE_URI=... make server).
    make = subprocess.Popen(
        ["make", "-s", "server", f"ARTIFACTS={tmp_path / 'art'}", f"PORT={port}"],
        cwd=ROOT,
        env={**os.environ, "BACKEND_STORE_URI": postgres},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        wait_until_up(f"http://127.0.0.1:{port}", timeout_s=120)
        tree = [psutil.Process(make.pid), *psutil.Process(make.pid).children(recursive=True)]
        lines = []
        for p in tree:
            try:
                lines.append(" ".join(p.cmdline()))
            except psutil.Error:  # ended (a zombie, gone) since the tree was read
                pass
        assert any("mlflow" in line and "server" in line for line in lines), lines
        assert [line for line in lines if POSTGRES_PASSWORD in line] == []
        client = mlflow.MlflowClient(f"http://127.0.0.1:{port}")
        assert client.search_experiments()  # it serves the PostgreSQL store
        proc = run_cli(
            *TINY, "logger=mlflow_server", f"logger.tracking_uri=http://127.0.0.1:{port}"
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        (run,) = runs_of(client, "seqlab")
        assert run.info.status == "FINISHED"
        assert len(client.get_metric_history(run.info.run_id, "train_loss")) == 8
        assert "checkpoints/last.ckpt" in artifact_paths(client, run.info.run_id)
    finally:
        os.killpg(make.pid, signal.SIGTERM)
        out, _ = make.communicate(timeout=60)
    assert POSTGRES_PASSWORD not in out
    assert "store postgresql://seqlab:***@127.0.0.1" in out
