"""Bad input refused with one line, divergence stopped, an absent tracking server reported fast,
and repeatable runs (issue 7's first pieces)."""

from __future__ import annotations

import os
import time
from types import SimpleNamespace
from typing import Optional

import numpy as np
import pytest
from conftest import TINY, runs_of, start_cli
from harness.robust import _Planted

from seqlab import SeqlabError
from seqlab.train import train


def _npz(tmp_path, x, y, name="d.npz"):
    path = tmp_path / name
    np.savez(path, X=x, y=y)
    return path


def test_nan_in_the_data_is_refused_or_dropped_with_a_count(compose_cfg, store, tmp_path, caplog):
    x = np.random.default_rng(0).normal(size=(80, 1, 6)).astype(np.float32)
    y = np.ones(80, dtype=np.float32)
    x[3, 0, 2], y[7] = np.nan, np.inf
    path = _npz(tmp_path, x, y)
    with pytest.raises(
        SeqlabError,
        match=r"data: 2 of 80 samples hold NaN or Inf \(the first is sample 3\); .*data.drop_nonfinite=true",
    ):
        train(
            compose_cfg(
                "data=npz", f"data.path={path}", "trainer.max_epochs=1", "data.batch_size=32"
            )
        )
    (run,) = runs_of(store, "seqlab")
    assert run.info.status == "FAILED"
    with caplog.at_level("INFO", logger="seqlab"):
        result = train(
            compose_cfg(
                "data=npz",
                f"data.path={path}",
                "trainer.max_epochs=1",
                "data.batch_size=32",
                "data.drop_nonfinite=true",
            )
        )
    assert (
        result.status == "FINISHED"
        and "dropped 2 of 80 data samples holding NaN or Inf" in caplog.text
    )


def test_the_same_config_and_seed_give_the_same_metrics(compose_cfg, store):
    for name in ("first", "second"):
        train(compose_cfg(*TINY, "deterministic=true", f"logger.experiment_name={name}"))
    (a,), (b,) = runs_of(store, "first"), runs_of(store, "second")
    history = lambda run: [m.value for m in store.get_metric_history(run.info.run_id, "train_loss")]  # noqa: E731
    assert history(a) == history(b) and len(history(a)) == 8
    assert a.data.metrics["final_val_rmse"] == b.data.metrics["final_val_rmse"]


def test_ctrl_c_stops_at_a_step_with_a_checkpoint_and_ends_the_run_killed(tmp_path, store):
    signame = "SIGINT"  # SIGTERM: test_sigterm_mid_training_then_resume_equals_an_uninterrupted_run
    import signal

    err = tmp_path / "stderr.txt"
    with open(err, "w") as stderr:
        proc = start_cli(tmp_path, "trainer.max_epochs=500", "data.n_samples=2048", stderr=stderr)
        deadline = time.monotonic() + 120
        while "epoch 2/" not in err.read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        proc.send_signal(getattr(signal, signame))
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130  # 128 + SIGINT
    assert "interrupted: MLflow run" in out and "ended KILLED" in out
    (run,) = runs_of(store, "seqlab")
    assert run.info.status == "KILLED"
    assert f"stopped by SIGINT at step {run.data.tags['interrupted_at_step']}" in out
    assert f"resume={run.info.run_id}" in out
    assert "checkpoints/interrupted.ckpt" in {
        a.path for a in store.list_artifacts(run.info.run_id, "checkpoints")
    }


# -- interrupted runs: checkpoint, resume, exact continuation ------------------------------------
# 2048 samples: 1639 for training, 26 steps an epoch at batch 64 (the last of 39 samples): signalled
# once epoch 3 is printed, the run stops within a call of 10 steps, 9 epochs before its end.
RESUMABLE = [
    "deterministic=true",
    "data.n_samples=2048",
    "trainer.max_epochs=12",
    "perf.steps_per_call=10",
]
STEPS = 26


def test_sigterm_mid_training_then_resume_equals_an_uninterrupted_run(
    tmp_path, store, run_cli, compose_cfg
):
    import signal

    import torch

    err = tmp_path / "stderr.txt"
    with open(err, "w") as stderr:
        proc = start_cli(tmp_path, *RESUMABLE, stderr=stderr)
        deadline = time.monotonic() + 120
        while "epoch 3/" not in err.read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 143, out[-2000:]
    (run,) = runs_of(store, "seqlab")
    run_id = run.info.run_id
    assert run.info.status == "KILLED"
    stopped_at = int(run.data.tags["interrupted_at_step"])
    assert 0 < stopped_at < 12 * STEPS
    hint = next(
        line.strip() for line in out.splitlines() if line.strip().startswith("python train.py")
    )
    assert hint.endswith(f"resume={run_id}") and "trainer.max_epochs=12" in hint

    resumed = run_cli(*RESUMABLE, f"resume={run_id}")
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    (run,) = runs_of(store, "seqlab")  # the same run, continued
    assert run.info.run_id == run_id and run.info.status == "FINISHED"
    assert "interrupted_at_step" not in run.data.tags  # its checkpoint is used up
    steps = [m.step for m in store.get_metric_history(run_id, "train_loss")]
    assert steps == list(range(1, 12 * STEPS + 1))  # every step once: none lost, none repeated
    assert len(store.get_metric_history(run_id, "val_rmse")) == 12

    train(
        compose_cfg(*RESUMABLE, "logger.experiment_name=uninterrupted")
    )  # the same task, in this process
    (other,) = runs_of(store, "uninterrupted")

    def final_weights(r):
        path = store.download_artifacts(
            r.info.run_id, "checkpoints/last.ckpt", str(tmp_path / r.info.run_id)
        )
        return torch.load(path, map_location="cpu", weights_only=False)["state_dict"]

    a, b = final_weights(run), final_weights(other)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), (
        f"stopped at step {stopped_at}"
    )
    assert run.data.metrics["final_val_rmse"] == other.data.metrics["final_val_rmse"]


def test_resume_refuses_a_finished_run_another_config_and_another_model_shape(
    run_cli, compose_cfg, store, tmp_path
):
    first = run_cli(*TINY, "model.hidden_size=8")
    assert first.returncode == 0
    (run,) = runs_of(store, "seqlab")
    with pytest.raises(SeqlabError, match="that run finished; there is nothing to continue"):
        train(compose_cfg(*TINY, "model.hidden_size=8", f"resume={run.info.run_id}"))

    store.set_terminated(run.info.run_id, "KILLED")  # as if it had been killed without a checkpoint
    with pytest.raises(SeqlabError, match="the run's last stop saved no checkpoint"):
        train(compose_cfg(*TINY, "model.hidden_size=8", f"resume={run.info.run_id}"))
    store.set_tag(run.info.run_id, "interrupted_at_step", "4")  # as if stopped with one
    with pytest.raises(SeqlabError) as refused:
        train(compose_cfg(*TINY, f"resume={run.info.run_id}"))
    assert "this config differs from the run's: model.hidden_size=24 (the run had 8)" in str(
        refused.value
    )
    assert (
        "give the run's overrides: data.n_samples=256 trainer.max_epochs=2 model.hidden_size=8 "
        f"paths.root_dir={tmp_path} resume={run.info.run_id}"
    ) in str(refused.value)
    assert store.get_run(run.info.run_id).info.status == "KILLED"  # nothing reopened
    assert len(runs_of(store, "seqlab")) == 1  # nor created

    ckpt = next((tmp_path / "logs").glob("runs/*/checkpoints/last.ckpt"))
    proc = run_cli(*TINY, f"ckpt_path={ckpt}")  # hidden_size 24 here
    assert proc.returncode == 1
    line = next(line for line in proc.stdout.splitlines() if line.startswith("error:"))
    assert line.startswith(
        f"error: ckpt_path={ckpt}: the checkpoint is for another model shape (model.lstm."
    )
    assert "Traceback" not in proc.stdout + proc.stderr


def test_ckpt_path_starts_a_new_run_from_the_checkpoint(compose_cfg, store, tmp_path):
    """docs/troubleshooting.md: ckpt_path=FILE starts a new run from a checkpoint (resume=RUN_ID continues one).
    The new run starts where the checkpoint's training stopped: its first step is the 9th."""
    import shutil

    import torch

    first = train(compose_cfg(*TINY, "logger.experiment_name=first"))  # 4 steps an epoch, 2 epochs
    saved = tmp_path / "saved.ckpt"
    shutil.copy(tmp_path / "out" / "checkpoints" / "last.ckpt", saved)
    second = train(
        compose_cfg(
            "data.n_samples=256",
            "trainer.max_epochs=3",
            f"ckpt_path={saved}",
            "logger.experiment_name=second",
        )
    )
    assert second.run_id != first.run_id
    (a,), (b,) = runs_of(store, "first"), runs_of(store, "second")
    assert a.info.status == b.info.status == "FINISHED"
    assert [m.step for m in store.get_metric_history(a.info.run_id, "train_loss")] == list(
        range(1, 9)
    )  # untouched
    assert [m.step for m in store.get_metric_history(b.info.run_id, "train_loss")] == [
        9,
        10,
        11,
        12,
    ]  # epoch 3 only
    assert b.data.params["ckpt_path"] == str(saved)
    assert (
        torch.load(tmp_path / "out" / "checkpoints" / "last.ckpt", weights_only=False)[
            "global_step"
        ]
        == 12
    )


# -- a tracking server that goes away mid-run ------------------------------------------------------
OUTAGE_RUN = [
    "data.n_samples=2048",
    "trainer.max_epochs=8",
]  # 1639 training samples: 26 steps an epoch
OUTAGE_KEYS = (
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES",
    "MLFLOW_HTTP_REQUEST_TIMEOUT",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR",
)


@pytest.fixture
def outage(monkeypatch, caplog):
    """In-process training against a server that the training itself stops at the end of epoch
    `stop_after` and (optionally) starts again at the end of epoch `back_after`, once the run has
    said that the server does not answer: the outage is known to span whole epochs of training,
    with no sleep that the run could outlast. Records the wall clock (ms) at the stop and restart."""
    from seqlab.callbacks.timing import EpochTimer
    from seqlab.delivery.helper import Delivery

    for (
        key
    ) in OUTAGE_KEYS:  # the tracker sets MLflow's retry settings for a server; undone afterwards
        monkeypatch.setenv(key, os.environ.get(key, ""))
        monkeypatch.delenv(key)
    # A user's own retry settings are kept (tracking.connect sets only those unset): here none,
    # since what is tested is the journal, not MLflow's retries, which spend 3 s of back-off on
    # each request to the stopped server (a logged model's, a run's end).
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "0")
    clock = {}

    def arrange(restart, stop_after: int, back_after: Optional[int] = None):
        epoch_end = EpochTimer.on_train_epoch_end

        def on_train_epoch_end(self, trainer, pl_module):
            epoch_end(self, trainer, pl_module)
            epoch = trainer.current_epoch + 1
            if epoch == stop_after:
                clock["stop_ms"] = int(time.time() * 1000)
                restart.server.stop()
            elif epoch == back_after:
                deadline = time.monotonic() + 120
                while (
                    "does not answer: training goes on" not in caplog.text
                    and time.monotonic() < deadline
                ):
                    # What the delivery process said is logged as training sends rows; here
                    # training waits for this loop, so it is heard from here.
                    Delivery.to(restart.server.uri).check()
                    time.sleep(0.1)
                clock["restart_ms"] = int(time.time() * 1000)
                restart.server = restart.server.__class__(
                    restart.db, restart.artifacts, port=restart.port
                ).start()

        monkeypatch.setattr(EpochTimer, "on_train_epoch_end", on_train_epoch_end)
        return clock

    caplog.set_level("INFO", logger="seqlab")
    return arrange


def _steps_between(client, run_id: str, start_ms: int, end_ms: int) -> list[int]:
    return [
        m.step
        for m in client.get_metric_history(run_id, "train_loss")
        if start_ms <= m.timestamp <= end_ms
    ]


def test_a_server_stopped_and_restarted_mid_run_gets_every_metric(
    tmp_path, compose_cfg, outage, caplog
):
    import mlflow

    from seqlab.store.server import LocalServer, free_port

    port, db, artifacts = (
        free_port(),
        f"sqlite:///{tmp_path}/server/mlflow.db",
        str(tmp_path / "server" / "art"),
    )
    handle = SimpleNamespace(
        port=port, db=db, artifacts=artifacts, server=LocalServer(db, artifacts, port=port).start()
    )
    clock = outage(handle, stop_after=2, back_after=5)  # away for epochs 3 to 5
    try:
        result = train(
            compose_cfg(
                *OUTAGE_RUN, f"logger.tracking_uri={handle.server.uri}", "logger.outage_wait_s=120"
            )
        )
        client = mlflow.MlflowClient(handle.server.uri)
        run = client.get_run(result.run_id)
        assert run.info.status == "FINISHED"
        steps = [m.step for m in client.get_metric_history(result.run_id, "train_loss")]
        assert steps == list(range(1, 8 * 26 + 1))  # nothing lost while the server was away
        assert len(client.get_metric_history(result.run_id, "val_rmse")) == 8
        assert not list(
            (tmp_path / "out").glob(".seqlab-metrics-*")
        )  # the journal goes once the server has the run
        assert "checkpoints/last.ckpt" in {
            a.path for a in client.list_artifacts(result.run_id, "checkpoints")
        }
        # Training went on while the server was away: epochs 3 to 5 were trained in the outage.
        assert _steps_between(client, result.run_id, clock["stop_ms"], clock["restart_ms"]) == list(
            range(2 * 26 + 1, 5 * 26 + 1)
        )
        out = caplog.text
        assert "does not answer: training goes on" in out and "the store is back" in out
        assert out.index("does not answer: training goes on") < out.index("the store is back")
    finally:
        handle.server.stop()


def test_a_server_that_does_not_come_back_leaves_the_journal_for_the_next_command(
    tmp_path, compose_cfg, outage, caplog
):
    """Issue 33, point 4: a run ends only after its journal is delivered. A server that takes
    nothing for outage_wait_s leaves the journal (and the status the run ends with) in the job's
    folder, said in one line; once the server is back, the next command that opens it (its reaper)
    delivers every row and ends the run FINISHED."""
    import subprocess
    import sys

    import mlflow

    from seqlab.store.ghosts import end_dead_runs
    from seqlab.store.server import LocalServer, free_port

    port, db, artifacts = (
        free_port(),
        f"sqlite:///{tmp_path}/server/mlflow.db",
        str(tmp_path / "server" / "art"),
    )
    handle = SimpleNamespace(server=LocalServer(db, artifacts, port=port).start())
    clock = outage(handle, stop_after=2)  # gone from epoch 3 on
    train(
        compose_cfg(
            *OUTAGE_RUN, f"logger.tracking_uri={handle.server.uri}", "logger.outage_wait_s=3"
        )
    )
    (line,) = [r.getMessage() for r in caplog.records if "took nothing for" in r.getMessage()]
    assert "took nothing for 3 s" in line and "stays RUNNING" in line
    assert "delivers them and ends the run FINISHED" in line
    (journal,) = (tmp_path / "out").glob(".seqlab-metrics-*.journal")
    run_id = journal.name.split("-")[2].split(".")[0]
    assert str(journal) in line and run_id in line

    server = LocalServer(db, artifacts, port=port).start()  # back
    try:
        client = mlflow.MlflowClient(server.uri)
        assert client.get_run(run_id).info.status == "RUNNING"
        # This process is alive: as the next command would see it, the run's process has gone.
        ended = subprocess.Popen([sys.executable, "-c", "pass"])
        ended.wait()
        client.set_tag(run_id, "process_pid", str(ended.pid))
        client.set_tag(run_id, "process_start_ticks", "1")
        assert dict(end_dead_runs(client)).keys() == {run_id}
        run = client.get_run(run_id)
        assert run.info.status == "FINISHED" and "failure_reason" not in run.data.tags
        steps = [m.step for m in client.get_metric_history(run_id, "train_loss")]
        assert steps == list(range(1, 8 * 26 + 1))  # every step once
        # Epochs 3 to 8 were trained after the server had gone.
        assert _steps_between(client, run_id, clock["stop_ms"], int(time.time() * 1000)) == list(
            range(2 * 26 + 1, 8 * 26 + 1)
        )
        assert len(client.get_metric_history(run_id, "val_rmse")) == 8
        assert not list((tmp_path / "out").glob(".seqlab-metrics-*"))
    finally:
        server.stop()


def _stopped_by_sigterm_after(stop_after: int, monkeypatch, cfg) -> None:
    """In-process training of `cfg` that SIGTERM stops after step `stop_after` (its run KILLED, resumable)."""
    import os
    import signal

    from seqlab.tracking import StepLog

    add = StepLog.add

    def add_then_signal(self, loss, step, lr):
        add(self, loss, step, lr)
        if step == stop_after:
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(StepLog, "add", add_then_signal)
    with pytest.raises(SystemExit):
        train(cfg)
    monkeypatch.setattr(StepLog, "add", add)


@pytest.mark.parametrize("stop_after", [7, 13], ids=["mid-epoch", "epoch-end"])
def test_resume_is_exact_wherever_the_stop_lands(
    compose_cfg, store, tmp_path, monkeypatch, stop_after
):
    """In-process and deterministic: SIGTERM arrives after step `stop_after`; with 13 steps an
    epoch in items of 5, training stops at step 10 (mid-epoch) or 13 (the epoch's last item)."""
    import shutil

    import torch

    args = [
        "data.n_samples=512",
        "data.batch_size=32",
        "trainer.max_epochs=4",
        "perf.steps_per_call=5",
        "deterministic=true",
    ]  # 410 training samples: 13 steps an epoch
    _stopped_by_sigterm_after(stop_after, monkeypatch, compose_cfg(*args))
    (run,) = runs_of(store, "seqlab")
    assert run.info.status == "KILLED"
    assert run.data.tags["interrupted_at_step"] == ("10" if stop_after == 7 else "13")

    train(compose_cfg(*args, f"resume={run.info.run_id}"))
    resumed = tmp_path / "resumed.ckpt"
    shutil.copy(tmp_path / "out" / "checkpoints" / "last.ckpt", resumed)
    train(compose_cfg(*args, "logger.experiment_name=uninterrupted"))

    a = torch.load(resumed, weights_only=False)["state_dict"]
    b = torch.load(tmp_path / "out" / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    steps = [m.step for m in store.get_metric_history(run.info.run_id, "train_loss")]
    assert steps == list(range(1, 4 * 13 + 1))


def test_a_slow_store_is_waited_for_while_an_away_one_is_given_up(tmp_path):
    """Slow is not down: the end of a run waits as long as the store keeps taking rows (a server
    slower than training), and gives up only after a wait in which it took none."""
    import threading
    import time as clock

    from seqlab.delivery.helper import Delivery

    delivery = Delivery.to(f"sqlite:///{tmp_path}/unused.db")

    class Journal:  # what wait() reads: the rows journaled and those the store confirmed
        def __init__(self, count):
            self.count, self.sent = count, 0

    slow = Journal(30)

    def take_one_every_50_ms():
        for _ in range(30):  # 1.5 s of work, never 0.4 s without progress
            clock.sleep(0.05)
            slow.sent += 1

    threading.Thread(target=take_one_every_50_ms, daemon=True).start()
    assert delivery.wait(slow, 0.4) and slow.sent == 30

    away = Journal(1)
    started = clock.monotonic()
    assert not delivery.wait(away, 0.4)
    assert 0.35 < clock.monotonic() - started < 3
    delivery.stop()


def test_the_reaper_delivers_a_dead_runs_journal_before_ending_it(tmp_path, store):
    """The next command that opens the store (the reaper, seqlab.store.ghosts) sends a dead run's
    unconfirmed metrics from its job's folder, then ends it KILLED: no resume= needed."""
    import subprocess
    import sys

    from mlflow.entities import Metric

    from seqlab.delivery.journal import MetricJournal, journal_paths, open_tail
    from seqlab.store.ghosts import end_dead_runs, identity

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a process of this machine that has ended
    tags = {**identity(), "process_pid": str(gone.pid), "process_start_ticks": "1"}
    run = store.create_run(store.get_experiment_by_name("Default").experiment_id, tags=tags)
    run_id = run.info.run_id
    folder = tmp_path / "job"
    store.log_param(run_id, "paths.output_dir", str(folder))
    journal = MetricJournal(folder, run_id)
    journal.extend([Metric("train_loss", float(s), 1_700_000_000_000 + s, s) for s in range(1, 11)])
    # the server had taken steps 1-4 (here they never reached this store: only 5-10 may come)
    open_tail(folder, run_id).confirm(4)
    journal.file.close()  # the process is gone

    (ended,) = end_dead_runs(store)
    assert ended[0] == run_id and store.get_run(run_id).info.status == "KILLED"
    assert [m.step for m in store.get_metric_history(run_id, "train_loss")] == list(range(5, 11))
    assert not any(p.exists() for p in journal_paths(folder, run_id))


def test_a_journal_is_data_read_only_where_this_user_owns_it_and_up_to_a_torn_record(
    tmp_path, store
):
    """Issue 33: the reaper and resume= read a run's journal from the folder its params name, which
    anyone who can write to the store can set. A pickle planted there is not loaded (before: its
    code ran), nor a journal reached through a link or owned by another user; a journal cut off
    mid-record delivers the rows before the cut."""
    import os
    import pickle
    import subprocess
    import sys

    from mlflow.entities import Metric

    from seqlab.delivery.journal import MetricJournal, deliver_journal, journal_paths
    from seqlab.store.ghosts import end_dead_runs, identity

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    experiment = store.get_experiment_by_name("Default").experiment_id

    def dead_run(folder):
        run_id = store.create_run(
            experiment,
            tags={**identity(), "process_pid": str(gone.pid), "process_start_ticks": "1"},
        ).info.run_id
        store.log_param(run_id, "paths.output_dir", str(folder))
        return run_id

    # A planted pickle, named as the dead run's journal: the reaper ends the run, runs nothing.
    marker = tmp_path / "planted-code-ran"
    planted = dead_run(tmp_path / "planted")
    journal, sent = journal_paths(tmp_path / "planted", planted)
    journal.parent.mkdir()
    journal.write_bytes(pickle.dumps([_Planted(marker)]))
    (ended,) = end_dead_runs(store)
    assert ended[0] == planted and store.get_run(planted).info.status == "KILLED"
    assert not marker.exists(), "the planted journal's code ran"
    assert store.get_metric_history(planted, "train_loss") == []

    # A whole journal, its last record torn by a kill mid-write: the records before it are delivered.
    torn = dead_run(tmp_path / "torn")
    rows = MetricJournal(tmp_path / "torn", torn)
    rows.extend([Metric("train_loss", float(s), 1_700_000_000_000 + s, s) for s in range(1, 6)])
    rows.extend(
        [Metric("train_loss", float("nan"), 1_700_000_000_006, 6)]
    )  # a diverged step's value, as it is
    rows.extend([Metric("train_loss", float(s), 1_700_000_000_000 + s, s) for s in range(7, 10)])
    rows.file.close()
    path = journal_paths(tmp_path / "torn", torn)[0]
    assert (
        oct(path.stat().st_mode & 0o777) == "0o600"
        and oct(path.parent.stat().st_mode & 0o777) == "0o700"
    )
    path.write_bytes(path.read_bytes()[:-7])  # the last record cut off
    (ended,) = end_dead_runs(store)
    history = store.get_metric_history(torn, "train_loss")
    assert [m.step for m in history] == [1, 2, 3, 4, 5, 6] and history[-1].value != history[
        -1
    ].value  # NaN kept

    # A record whose checksum fails ends the reading there, as a torn one does.
    bad = tmp_path / "bad"
    bad_run = store.create_run(experiment).info.run_id
    rows = MetricJournal(bad, bad_run)
    rows.extend([Metric("train_loss", 1.0, 1_700_000_000_001, 1)])
    rows.extend([Metric("train_loss", 2.0, 1_700_000_000_002, 2)])
    rows.file.close()
    path = journal_paths(bad, bad_run)[0]
    path.write_bytes(path.read_bytes().replace(b"2.0", b"9.0"))
    assert deliver_journal(store.tracking_uri, bad_run, bad) == 1

    # A journal reached through a link, and one another user owns: not opened.
    linked_run = store.create_run(experiment).info.run_id
    elsewhere = tmp_path / "elsewhere"
    rows = MetricJournal(elsewhere, linked_run)
    rows.extend([Metric("train_loss", 1.0, 1_700_000_000_001, 1)])
    rows.file.close()
    (tmp_path / "linked").mkdir()
    journal_paths(tmp_path / "linked", linked_run)[0].symlink_to(
        journal_paths(elsewhere, linked_run)[0]
    )
    assert deliver_journal(store.tracking_uri, linked_run, tmp_path / "linked") == 0
    # A journal in a folder others may write into (anyone could have put it there): not opened.
    elsewhere.chmod(0o777)
    assert deliver_journal(store.tracking_uri, linked_run, elsewhere) == 0
    elsewhere.chmod(0o700)
    if os.getuid() == 0:  # only root can give a file to another user here
        os.chown(journal_paths(elsewhere, linked_run)[0], 65534, 65534)
        assert deliver_journal(store.tracking_uri, linked_run, elsewhere) == 0
    assert store.get_metric_history(linked_run, "train_loss") == []


def test_a_resume_on_changed_data_is_refused_in_one_line_unless_resume_data_changed(
    compose_cfg, store, tmp_path, monkeypatch
):
    """Issue 34, point 3: a data file that grew between the stop and the resume moves validation
    samples into training; the resume compares the sets' digests with the run's and refuses, naming
    the file, unless resume_data=changed (then it goes on, tagged)."""

    import numpy as np

    rng = np.random.default_rng(0)
    path = tmp_path / "load.npz"
    x, y = (
        rng.normal(size=(300, 1, 1440)).astype(np.float32),
        rng.normal(size=(300, 1)).astype(np.float32),
    )
    np.savez(path, X=x, y=y)
    args = ["data=npz", f"data.path={path}", "trainer.max_epochs=2", "logger.system_metrics=false"]
    _stopped_by_sigterm_after(2, monkeypatch, compose_cfg(*args))
    (run,) = runs_of(store, "seqlab")
    run_id = run.info.run_id
    assert run.info.status == "KILLED"

    grown = rng.normal(size=(40, 1, 1440)).astype(np.float32)
    np.savez(
        path,
        X=np.concatenate([x, grown]),
        y=np.concatenate([y, rng.normal(size=(40, 1)).astype(np.float32)]),
    )
    with pytest.raises(SeqlabError) as refused:
        train(compose_cfg(*args, f"resume={run_id}"))
    line = str(refused.value)
    assert line.startswith(
        f"resume={run_id}: the data differ from the run's: the training set (load-train) had digest "
    )
    assert f"{path} now gives " in line and "(240 samples)" in line and "(272 samples)" in line, (
        line
    )
    assert line.endswith("or go on with these with resume_data=changed") and "\n" not in line
    assert "resume_data" not in store.get_run(run_id).data.tags

    train(compose_cfg(*args, f"resume={run_id}", "resume_data=changed"))
    after = store.get_run(run_id)
    assert after.info.status == "FINISHED" and after.data.tags["resume_data"] == "changed"
    contexts = sorted(
        next(t.value for t in d.tags if t.key == "mlflow.data.context")
        for d in after.inputs.dataset_inputs
    )
    assert contexts == [
        "training",
        "training",
        "validation",
        "validation",
    ]  # what it trained on before, and after
