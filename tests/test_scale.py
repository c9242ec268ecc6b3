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
import torch
from conftest import CONF_DIR, ROOT, TINY, artifact_paths, no_runs, runs_of
from hydra import compose, initialize_config_dir
from inprocess import run_script

from seqlab import SeqlabError
from seqlab.data import TensorBatches
from seqlab.hydra_version import VERSION_BASE
from seqlab.store.server import LocalServer
from seqlab.store.server_command import check_backend
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


# -- the tracking server ------------------------------------------------------------------------
def test_a_server_store_must_be_a_database():
    with pytest.raises(SeqlabError, match="needs a database"):
        check_backend("./mlruns")
    proc = run_script("seqlab.store.server", ["--backend-store-uri", "file:./mlruns"])
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: --backend-store-uri file:./mlruns: MLflow 3 needs a database here "
        "(sqlite:///path/mlflow.db or postgresql://user:password@host/db), not a folder"
    ]


def test_the_server_preset_takes_its_address_from_the_environment(compose_cfg, monkeypatch):
    assert compose_cfg("logger=mlflow_server").logger.tracking_uri == "http://127.0.0.1:5000"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://tracking.example:5001")
    assert compose_cfg("logger=mlflow_server").logger.tracking_uri == "http://tracking.example:5001"
    # MLflow's own variable also moves the default logger off the local store.
    assert compose_cfg().logger.tracking_uri == "http://tracking.example:5001"


@pytest.mark.slow
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
@pytest.mark.slow
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


@pytest.mark.slow
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


def test_a_closed_terminal_ends_a_parallel_sweeps_waiting_parent_as_sigterm_does(
    monkeypatch, tmp_path
):
    """SIGHUP (the terminal closed) and SIGTERM reach the parent of a parallel sweep the same way:
    SystemExit with 128 + the signal, marked interrupted, so that atexit ends its run KILLED."""
    from types import SimpleNamespace

    from omegaconf import OmegaConf

    from seqlab.store import server as server_module
    from seqlab.sweeps.callback import LOCAL_PARALLEL_LAUNCHERS, MlflowSweepCallback

    class NoServer:  # the loopback server itself is the test above's
        def __init__(self, *args, **kwargs):
            self.uri = "http://127.0.0.1:9"

        def start(self, wait=True):
            return self

    monkeypatch.setattr(server_module, "LocalServer", NoServer)
    monkeypatch.setenv(
        "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "false"
    )  # _serve sets it; undone after
    callback = MlflowSweepCallback()
    callback.tracker = SimpleNamespace(
        tracking_uri=f"sqlite:///{tmp_path}/mlflow.db", artifact_root=None, connect=lambda: None
    )
    config = OmegaConf.create({"hydra": {"launcher": {"_target_": LOCAL_PARALLEL_LAUNCHERS[0]}}})
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:

        def unhandled(signum, frame):
            raise AssertionError(f"{signal.Signals(signum).name} did not reach the sweep's handler")

        for signum in before:
            signal.signal(signum, unhandled)
        assert callback._serve(config, tmp_path) == "http://127.0.0.1:9"
        for signum in (signal.SIGHUP, signal.SIGTERM):
            callback.interrupted = False
            with pytest.raises(SystemExit) as stopped:
                os.kill(os.getpid(), signum)  # the handler runs before the next line
            assert stopped.value.code == 128 + signum and callback.interrupted
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


def test_a_loopback_server_starts_uvicorn_as_mlflow_server_would():
    """LocalServer starts `mlflow server`'s uvicorn process itself: the environment names it sets
    must be the pinned MLflow's (a rename would leave the server without its store)."""
    import mlflow.server
    from mlflow.server import constants

    from seqlab.store.server_command import ARTIFACTS_ENV, BACKEND_ENV, uvicorn_command, uvicorn_env

    env = uvicorn_env({BACKEND_ENV: "sqlite:///s.db", ARTIFACTS_ENV: "/a"})
    assert (
        env[constants.BACKEND_STORE_URI_ENV_VAR]
        == env[constants.REGISTRY_STORE_URI_ENV_VAR]
        == "sqlite:///s.db"
    )
    assert (
        env[constants.ARTIFACTS_DESTINATION_ENV_VAR] == "/a"
        and env[constants.SERVE_ARTIFACTS_ENV_VAR] == "true"
    )
    assert env[constants.ARTIFACT_ROOT_ENV_VAR] == "mlflow-artifacts:/"
    assert env[mlflow.environment_variables._MLFLOW_SGI_NAME.name] == "uvicorn"
    assert mlflow.environment_variables._MLFLOW_SERVER_BOOT_ID.name in env
    assert uvicorn_command("127.0.0.1", 5123) == mlflow.server._build_uvicorn_command(
        None, "127.0.0.1", 5123, 1, "mlflow.server.fastapi_app:app"
    )


def test_the_sweep_callback_travels_to_launcher_workers_without_its_server():
    import pickle

    from seqlab.sweeps.callback import MlflowSweepCallback

    callback = MlflowSweepCallback()
    callback.server = object()  # stands for a process handle, which does not pickle
    callback.tracker = object()
    copy = pickle.loads(pickle.dumps(callback))
    assert copy.server is None and copy.tracker is None and copy.serve_local_store == "auto"


# -- DDP -------------------------------------------------------------------------------------------
def test_ddp_shards_cover_each_sample_at_most_once_per_epoch():
    x = torch.arange(103, dtype=torch.float32).reshape(103, 1, 1)
    y = x.clone()
    shards = [TensorBatches(x, y, 8, True, False, seed=3, rank=r, world_size=2) for r in (0, 1)]
    for _ in range(2):  # two epochs, each reshuffled
        seen = [torch.cat([b[0].flatten() for b in shard]) for shard in shards]
        assert len(seen[0]) == len(seen[1]) == 51  # equal shares keep the processes in step
        assert len(shards[0]) == len(shards[1]) == math.ceil(51 / 8)
        both = torch.cat(seen)
        assert len(set(both.tolist())) == 102  # disjoint: one sample left for a later shuffle
    in_order = [TensorBatches(x, y, 8, False, False, seed=3, rank=r, world_size=2) for r in (0, 1)]
    assert torch.cat([b[0].flatten() for b in in_order[1]]).tolist() == list(range(51, 102))


# A DDP job of two CPU processes in a sweep, one run for the job: tests/test_rank_failure.py
# (test_a_ddp_jobs_overrides_reach_its_ranks_through_the_environment_not_their_command_lines), whose
# sweep of one DDP job is checked for both.


def test_multi_process_training_needs_the_cli(compose_cfg):
    from seqlab.train import train

    cfg = compose_cfg(*TINY, "trainer.accelerator=cpu", "trainer.devices=2", "trainer.strategy=ddp")
    with pytest.raises(SeqlabError, match="starts through the CLI"):
        train(cfg)


def test_an_unknown_strategy_is_refused_up_front(run_cli):
    proc = run_cli(*TINY, "trainer.strategy=ddp_spawn")
    assert proc.returncode == 1
    assert "trainer.strategy must be one of auto, ddp; got 'ddp_spawn'" in proc.stdout + proc.stderr


# -- SLURM -------------------------------------------------------------------------------------
def test_the_slurm_launcher_config_composes():
    with initialize_config_dir(str(CONF_DIR), **VERSION_BASE):
        cfg = compose(
            "train",
            overrides=["hydra/launcher=slurm", "trainer.devices=4", "hydra.launcher.partition=gpu"],
            return_hydra_config=True,
        )
    launcher = cfg.hydra.launcher
    assert (
        launcher._target_ == "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"
    )
    assert launcher.partition == "gpu" and launcher.timeout_min == 60
    assert launcher.tasks_per_node == launcher.gpus_per_node == 4 and launcher.nodes == 1
    assert launcher.submitit_folder.endswith("/.submitit/%j")


# A run logged to a server on PostgreSQL: test_make_server_keeps_the_databases_password_off_every_command_line
# trains one on the server it starts.


def test_only_launchers_on_this_machine_get_the_loopback_server(tmp_path):
    from types import SimpleNamespace

    from omegaconf import OmegaConf

    from seqlab.sweeps.callback import MlflowSweepCallback

    callback = MlflowSweepCallback()
    callback.tracker = SimpleNamespace(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    for target in (
        "hydra._internal.core_plugins.basic_launcher.BasicLauncher",  # one job at a time
        "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher",
    ):  # other hosts
        config = OmegaConf.create({"hydra": {"launcher": {"_target_": target}}})
        assert callback._serve(config, tmp_path) is None and callback.server is None


def test_ranks_other_than_the_first_process_are_never_zero(monkeypatch):
    from seqlab.ddp.ranks import process_rank

    for key in ("RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK", "NODE_RANK"):
        monkeypatch.delenv(key, raising=False)
    assert process_rank() == 0
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert process_rank() == 1
    monkeypatch.setenv("NODE_RANK", "1")  # the second machine of a multi-node job
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert process_rank() != 0
    monkeypatch.setenv("RANK", "0")  # a global rank wins
    assert process_rank() == 0


def test_ddp_hands_lightning_a_plain_dataloader_to_shard_and_refuses_too_small_shares():
    from types import SimpleNamespace

    from torch.utils.data import DataLoader

    from seqlab.data import SeqDataModule, synthetic_daily_load

    dm = SeqDataModule(
        lambda n_samples, seed: synthetic_daily_load(n_samples, seed), n_samples=200, batch_size=16
    )
    dm.setup()
    dm.configure_batching("dataloader", on_device=False, batches_per_item=1)
    dm.trainer = SimpleNamespace(global_rank=1, world_size=2)
    assert isinstance(
        dm.train_dataloader(), DataLoader
    )  # Lightning swaps in its DistributedSampler
    dm.batch_size = 128  # 160 training samples: 80 a process
    with pytest.raises(
        SeqlabError,
        match="give each of the 2 processes 80, fewer than one batch of data.batch_size=128",
    ):
        dm.train_dataloader()


def test_under_ddp_train_loss_is_the_mean_over_the_processes(monkeypatch):
    """docs/scaling.md: under DDP, train_loss is averaged over the processes. The recorder's flush with a
    process group of two, the other process's losses known: the logged values are the means."""
    from types import SimpleNamespace

    import torch.distributed as dist

    from seqlab.tracking import StepMetricsRecorder

    other = torch.tensor([0.5, 1.5, 2.5])  # process 1's losses at steps 1-3

    def all_reduce(tensor):
        tensor += other  # SUM over the group, in place, as torch.distributed does

    monkeypatch.setattr(dist, "is_available", lambda: True)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda: 2)
    monkeypatch.setattr(dist, "all_reduce", all_reduce)
    logged = {}
    tracker = SimpleNamespace(
        log_series=lambda series, steps, times: logged.update(series, steps=steps)
    )
    recorder = StepMetricsRecorder(
        tracker, every_n_steps=3, loss_to_mse=lambda loss: 2.0 * loss, every_s=0.0
    )
    for step, loss in enumerate([1.5, 0.5, 4.5], start=1):  # this process's (rank 0's) losses
        recorder.steps.add(torch.tensor(loss), step, 0.01)
    recorder.flush()
    assert logged["steps"] == [1, 2, 3]
    assert logged["train_loss"] == pytest.approx([1.0, 1.0, 3.5])
    assert logged["train_rmse"] == pytest.approx([math.sqrt(2.0), math.sqrt(2.0), math.sqrt(7.0)])


@pytest.mark.slow
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


@pytest.mark.slow
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
        lines = [" ".join(p.cmdline()) for p in tree if p.is_running()]
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
