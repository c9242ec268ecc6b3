"""Bad input refused with one line, divergence stopped, an absent tracking server reported fast,
and repeatable runs (issue 7's first pieces)."""

from __future__ import annotations

import socket
import time

import numpy as np
import pytest

from conftest import TINY, runs_of
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
    with pytest.raises(SeqlabError, match=r"data: 2 of 80 samples hold NaN or Inf \(the first is sample 3\); .*data.drop_nonfinite=true"):
        train(compose_cfg("data=npz", f"data.path={path}", "trainer.max_epochs=1"))
    (run,) = runs_of(store, "seqlab")
    assert run.info.status == "FAILED"
    with caplog.at_level("INFO", logger="seqlab"):
        result = train(compose_cfg("data=npz", f"data.path={path}", "trainer.max_epochs=1", "data.drop_nonfinite=true"))
    assert result.status == "FINISHED" and "dropped 2 of 80 data samples holding NaN or Inf" in caplog.text


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
    with pytest.raises(SeqlabError, match=r"the training loss became (nan|inf) at step \d+: training diverged"):
        train(compose_cfg(*TINY, "optimizer.lr=1e30", "logger.flush_every_n_steps=2", "trainer.max_epochs=20"))
    (run,) = runs_of(store, "seqlab")
    assert run.info.status == "FAILED" and "training diverged" in run.data.tags["failure_reason"]
    steps = [m.step for m in store.get_metric_history(run.info.run_id, "train_loss")]
    assert steps and max(steps) < 80  # stopped, not trained on for 20 epochs


def test_a_tracking_server_that_does_not_answer_fails_fast(run_cli):
    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    start = time.monotonic()
    proc = run_cli(*TINY, f"logger.tracking_uri=http://127.0.0.1:{port}")
    assert time.monotonic() - start < 60  # Python start-up included; the check itself takes under 15 s
    assert proc.returncode == 1
    out = proc.stdout + proc.stderr
    assert f"error: logger.tracking_uri=http://127.0.0.1:{port}: no MLflow server answers there" in out
    assert "Traceback" not in out


def test_the_same_config_and_seed_give_the_same_metrics(compose_cfg, store):
    for name in ("first", "second"):
        train(compose_cfg(*TINY, "deterministic=true", f"logger.experiment_name={name}"))
    (a,), (b,) = runs_of(store, "first"), runs_of(store, "second")
    history = lambda run: [m.value for m in store.get_metric_history(run.info.run_id, "train_loss")]  # noqa: E731
    assert history(a) == history(b) and len(history(a)) == 8
    assert a.data.metrics["final_val_rmse"] == b.data.metrics["final_val_rmse"]


@pytest.mark.slow
@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM"])
def test_ctrl_c_or_sigterm_ends_the_run_killed_with_one_line(tmp_path, store, signame):
    import os
    import signal
    import subprocess
    import sys

    from conftest import ROOT

    err = tmp_path / "stderr.txt"
    with open(err, "w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "train.py"), "trainer.max_epochs=500", "data.n_samples=2048",
             f"paths.root_dir={tmp_path}"],
            cwd=tmp_path, stdout=subprocess.PIPE, stderr=stderr, text=True,
            env={k: v for k, v in os.environ.items() if not k.startswith("HYDRA_")},
        )
        deadline = time.monotonic() + 120
        while "epoch 2/" not in err.read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        proc.send_signal(getattr(signal, signame))
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == (143 if signame == "SIGTERM" else 130)  # 128 + the signal
    assert "interrupted: MLflow run" in out and "ended KILLED" in out
    (run,) = runs_of(store, "seqlab")
    assert run.info.status == "KILLED"
