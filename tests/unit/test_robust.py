"""Bad input refused with one line, divergence stopped, an absent tracking server reported fast,
and repeatable runs (issue 7's first pieces)."""

from __future__ import annotations

import os
import socket

import pytest
from conftest import ROOT, TINY, runs_of
from harness.robust import _Planted

from seqlab import SeqlabError
from seqlab.train import train


@pytest.mark.parametrize(
    "content, message",
    [(b"", "not a NumPy .npz file"), (b"hello, this is text", "not a NumPy .npz file")],
    ids=["empty", "text"],
)
def test_a_file_that_is_not_npz_is_named(compose_cfg, tmp_path, content, message):
    path = tmp_path / "d.npz"
    path.write_bytes(content)
    with pytest.raises(SeqlabError, match=message):
        train(compose_cfg("data=npz", f"data.path={path}"))


def test_an_empty_csv_is_named(compose_cfg, tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("\n")
    with pytest.raises(SeqlabError, match="the file is empty"):
        train(compose_cfg("data=csv", f"data.path={path}"))


def test_a_diverging_loss_stops_the_run_failed_with_the_step(compose_cfg, store):
    import math
    import re
    import sys

    # 4 steps an epoch in one Lightning call each (perf.steps_per_call=4): the losses are read
    # back after each call, since 2 steps wait by then and flush_every_s=0.
    with pytest.raises(
        SeqlabError, match=r"the training loss became (nan|inf) at step \d+: training diverged"
    ) as caught:
        train(
            compose_cfg(
                *TINY,
                "optimizer.lr=1e30",
                "logger.flush_every_n_steps=2",
                "logger.flush_every_s=0",
                "trainer.max_epochs=20",
                "perf.steps_per_call=4",
            )
        )
    named = int(re.search(r"at step (\d+)", str(caught.value)).group(1))
    (run,) = runs_of(store, "seqlab")
    assert (
        run.info.status == "FAILED"
        and f"at step {named}: training diverged" in run.data.tags["failure_reason"]
    )
    history = store.get_metric_history(run.info.run_id, "train_loss")
    steps = [m.step for m in history]
    # SQL holds no infinity: MLflow stores +-inf as the largest float (and NaN as a flag).
    finite = lambda v: math.isfinite(v) and abs(v) < sys.float_info.max  # noqa: E731
    first_bad = next(m.step for m in history if not finite(m.value))
    assert named == first_bad  # the step named is the first whose loss is not finite
    assert all(finite(m.value) for m in history if m.step < named)
    assert steps == list(range(1, max(steps) + 1))  # every step up to the stop recorded
    assert max(steps) == -(-named // 4) * 4  # stopped at the end of the call that held that step


def test_a_tracking_server_that_does_not_answer_fails_fast(run_cli):
    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = run_cli(*TINY, f"logger.tracking_uri=http://127.0.0.1:{port}")
    assert proc.returncode == 1
    out = proc.stdout + proc.stderr
    assert (
        f"error: logger.tracking_uri=http://127.0.0.1:{port}: no MLflow server answers there" in out
    )
    assert "Traceback" not in out


def test_a_server_that_takes_the_connection_but_never_answers_is_given_up_on_within_seconds(
    compose_cfg, monkeypatch
):
    """The worst case of 'does not answer': a port that accepts and stays silent. The check asks
    once, with its own timeout, and gives up when that runs out (MLflow's client alone would
    retry for minutes). A fake clock stands for the wait: it advances by the timeout asked for."""
    import requests
    from hydra.utils import instantiate

    clock = {"now": 0.0}
    asked = []

    def silent(url, timeout=None, **kwargs):
        asked.append(url)
        clock["now"] += timeout  # a TypeError here: a request without a timeout would hang for good
        raise requests.ReadTimeout(f"{url}: read timed out")

    monkeypatch.setattr(requests, "get", silent)
    tracker = instantiate(compose_cfg("logger.tracking_uri=http://127.0.0.1:9").logger)
    with pytest.raises(
        SeqlabError,
        match=r"^logger.tracking_uri=http://127.0.0.1:9: no MLflow server answers there \(ReadTimeout\)",
    ):
        tracker.connect()
    assert asked == ["http://127.0.0.1:9/health"]  # one question, no retries
    assert 0 < clock["now"] <= 15
    assert tracker.client is None  # nothing went on to MLflow's own client


def test_the_order_of_an_interrupted_epoch_is_replayed_from_where_it_stopped():
    import torch

    from seqlab.data import TensorBatches

    x = torch.arange(40, dtype=torch.float32).reshape(40, 1, 1)

    def epochs(batches, n):
        return [[b[0].flatten().tolist() for b in batches] for _ in range(n)]

    reference = TensorBatches(x, x.clone(), 4, True, False, seed=7, batches_per_item=2)
    first, second, third = epochs(reference, 3)
    interrupted = TensorBatches(x, x.clone(), 4, True, False, seed=7, batches_per_item=2)
    epochs(interrupted, 1)
    iterator = iter(interrupted)
    done = [next(iterator)[0].flatten().tolist() for _ in range(3)]  # 3 of 5 items of epoch 2
    assert done == second[:3]
    state = interrupted.state_dict()["generator"]

    restored = TensorBatches(
        x, x.clone(), 4, True, False, seed=0, batches_per_item=2
    )  # another seed: the state wins
    restored.resume(state, 3)
    assert epochs(restored, 2) == [second[3:], third]


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["resume=0123456789abcdef0123456789abcdef"],
            "resume=0123456789abcdef0123456789abcdef: no such run in this tracking store",
        ),
        (["ckpt_path=/nonexistent.ckpt"], "ckpt_path=/nonexistent.ckpt: no such file"),
        (["resume=abc", "ckpt_path=/x.ckpt"], "resume=RUN_ID and ckpt_path=FILE are two ways"),
    ],
)
def test_a_bad_resume_or_checkpoint_is_one_line(run_cli, args, message):
    proc = run_cli(*TINY, *args)
    assert proc.returncode == 1
    assert f"error: {message}" in proc.stdout
    assert "Traceback" not in proc.stdout + proc.stderr


def test_a_file_that_is_not_a_checkpoint_is_named(tmp_path):
    import torch

    from seqlab.resume.interrupt import check_checkpoint

    model = torch.nn.Linear(2, 1)
    not_a_checkpoint = tmp_path / "notes.ckpt"
    not_a_checkpoint.write_text("hello")
    with pytest.raises(
        SeqlabError, match=r"^ckpt_path=x: not a PyTorch Lightning checkpoint \(\w+\)$"
    ):
        check_checkpoint(not_a_checkpoint, model, "ckpt_path=x")
    torch.save({"weights": 1}, tmp_path / "other.ckpt")
    with pytest.raises(SeqlabError, match=r"no state_dict"):
        check_checkpoint(tmp_path / "other.ckpt", model, "ckpt_path=x")
    torch.save({"state_dict": {"weight": torch.zeros(1, 2)}}, tmp_path / "part.ckpt")
    with pytest.raises(
        SeqlabError, match=r"the checkpoint has no bias: it was saved from another model"
    ):
        check_checkpoint(tmp_path / "part.ckpt", model, "ckpt_path=x")
    torch.save({"state_dict": model.state_dict()}, tmp_path / "good.ckpt")
    check_checkpoint(tmp_path / "good.ckpt", model, "ckpt_path=x")
    # Issue 34, point 2: a checkpoint someone else wrote runs no code (before: it ran at this check).
    marker = tmp_path / "planted-code-ran"
    torch.save(
        {"state_dict": model.state_dict(), "planted": _Planted(marker)}, tmp_path / "planted.ckpt"
    )
    with pytest.raises(
        SeqlabError, match=r"^ckpt_path=x: the checkpoint holds more than tensors and plain values"
    ):
        check_checkpoint(tmp_path / "planted.ckpt", model, "ckpt_path=x")
    assert not marker.exists(), "the checkpoint's planted code ran"


def test_a_second_ctrl_c_stops_at_once_without_a_checkpoint(
    compose_cfg, store, tmp_path, monkeypatch
):
    """The first Ctrl-C asks for a stop at the step's end with a checkpoint; a second one before
    that stops at once: no checkpoint, the run KILLED with the steps trained so far."""
    import signal

    from seqlab.tracking import StepLog

    add = StepLog.add

    def add_then_two_ctrl_cs(self, loss, step, lr):
        add(self, loss, step, lr)
        if step == 6:  # inside a call of 4 steps (perf.steps_per_call=4): the first cannot act yet
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(StepLog, "add", add_then_two_ctrl_cs)
    with pytest.raises(KeyboardInterrupt):
        train(compose_cfg("data.n_samples=256", "trainer.max_epochs=4", "perf.steps_per_call=4"))
    (run,) = runs_of(store, "seqlab")
    assert run.info.status == "KILLED"
    assert (
        "interrupted_at_step" not in run.data.tags
    )  # resume= refuses it: nothing saved to continue from
    assert not (tmp_path / "out" / "checkpoints" / "interrupted.ckpt").exists()
    assert not [a for a in store.list_artifacts(run.info.run_id, "checkpoints")]
    assert [m.step for m in store.get_metric_history(run.info.run_id, "train_loss")] == list(
        range(1, 7)
    )


def test_metrics_a_killed_process_journaled_are_delivered_from_where_the_store_stopped(
    tmp_path, store
):
    """A job killed outright while its store was away (SIGKILL after SIGTERM within SLURM's
    KillWait, the OOM killer): every row is in the journal in the job's folder, with the count the
    store confirmed, and resume= (the reaper, a new helper) delivers exactly the rest."""
    from mlflow.entities import Metric

    from seqlab.delivery.journal import (
        MetricJournal,
        deliver,
        deliver_journal,
        journal_paths,
        open_tail,
    )

    run_id = store.create_run(store.get_experiment_by_name("Default").experiment_id).info.run_id
    journal = MetricJournal(tmp_path, run_id)

    def batch(first):  # 25 steps
        return [
            Metric("train_loss", float(s), 1_700_000_000_000 + s, s)
            for s in range(first, first + 25)
        ]

    class AwayAfterOne:  # takes the first batch, then is away
        def __init__(self):
            self.taken = []

        def write(self, run_id, rows):
            if self.taken:
                raise ConnectionError("no answer")
            self.taken.append(len(rows))

    server, tail = AwayAfterOne(), open_tail(tmp_path, run_id)
    journal.extend(batch(1))
    tail.read()
    assert deliver(tail, server, run_id) == 25
    for first in (26, 51, 76):
        journal.extend(batch(first))
    tail.read()
    with pytest.raises(ConnectionError):
        deliver(tail, server, run_id)
    tail.close()  # the process is killed here
    assert server.taken == [25] and journal.sent == 25 and len(journal.unsent()) == 75
    assert all(p.is_file() for p in journal_paths(tmp_path, run_id))

    assert deliver_journal(store.tracking_uri, run_id, tmp_path) == 75
    assert [m.step for m in store.get_metric_history(run_id, "train_loss")] == list(range(26, 101))
    assert not any(p.exists() for p in journal_paths(tmp_path, run_id))  # delivered once: gone
    assert deliver_journal(store.tracking_uri, run_id, tmp_path) == 0


def test_an_unreachable_tracking_database_is_one_line_with_its_password_masked(run_cli):
    # Issue 24, point 8, beyond the study: an MLflow store on a PostgreSQL server that is down. MLflow
    # itself would retry for about 100 s and print a warning per try.
    from seqlab.store.server import free_port

    url = f"postgresql://bob:pg-pass-4711@127.0.0.1:{free_port()}/mlflow"
    proc = run_cli(*TINY, f"logger.tracking_uri={url}")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    assert "Traceback" not in out and "pg-pass-4711" not in out and "retried" not in out
    (line,) = [line for line in out.splitlines() if line.startswith("error: ")]
    assert line.startswith("error: postgresql://bob:***@127.0.0.1:"), line
    assert "the tracking database does not answer" in line and "Connection refused" in line, line
    # The same for the scripts that open a store (compare.py; sync.py opens it the same way).
    from harness.inprocess import run_script

    compare = run_script(ROOT / "scripts" / "compare.py", ["--tracking-uri", url])
    assert compare.returncode == 1 and "pg-pass-4711" not in compare.stdout + compare.stderr
    assert compare.stderr.strip().startswith("error: postgresql://bob:***@127.0.0.1:")


def test_a_journal_write_that_finds_no_room_is_one_line_and_ends_the_run_killed(tmp_path):
    """Issue 34, point 7: a full disk under a journal is one line naming it (as under a checkpoint),
    and the run it stops ends KILLED, resumable, not FAILED with a traceback."""
    import errno

    from mlflow.entities import Metric

    from seqlab import ending_status
    from seqlab.delivery.journal import MetricJournal, journal_paths
    from seqlab.safe_writes import WriteFailed

    journal = MetricJournal(tmp_path, "r1")

    class FullDisk:
        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")

    journal.file = FullDisk()
    with pytest.raises(WriteFailed) as full:
        journal.extend([Metric("train_loss", 1.0, 1_700_000_000_001, 1)])
    line = str(full.value)
    assert line.startswith(
        f"could not write {journal_paths(tmp_path, 'r1')[0]}: No space left on device; free space"
    )
    assert ending_status(full.value) == ("KILLED", line)
    assert ending_status(ValueError("a bug")) == ("FAILED", "a bug")
