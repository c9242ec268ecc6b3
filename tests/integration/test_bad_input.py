"""Every kind of bad input through the real CLI, as a user meets it: one line that says what to
fix, a non-zero exit, no traceback, and no MLflow run left RUNNING."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from conftest import TINY, cli_env, no_runs
from harness.inprocess import run_in_process


def _write(tmp_path, name, content):
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif isinstance(content, str):
        path.write_text(content)
    else:
        np.savez(path, **content)
    return path


def _csv_rows(n, bad_line=None):
    rows = ["1,2,3,0.5" for _ in range(n)]
    if bad_line is not None:
        rows[bad_line - 1] = "1,two,3,0.5"
    return "\n".join(rows) + "\n"


# Refused by the schema or the range checks, before anything heavy is imported: no run at all.
CONFIG_CASES = {
    "zero batch size": (
        ["data.batch_size=0"],
        "error: data.batch_size must be a positive integer, got 0",
    ),
    "negative batch size": (
        ["data.batch_size=-8"],
        "error: data.batch_size must be a positive integer, got -8",
    ),
    "zero epochs": (["trainer.max_epochs=0"], "error: trainer.max_epochs must be positive, got 0"),
    "negative epochs": (
        ["trainer.max_epochs=-2"],
        "error: trainer.max_epochs must be positive, got -2",
    ),
    "zero learning rate": (
        ["optimizer.lr=0"],
        "error: optimizer.lr must be a positive number, got 0",
    ),
    "negative learning rate": (
        ["optimizer.lr=-0.01"],
        "error: optimizer.lr must be a positive number, got -0.01",
    ),
    "unknown accelerator": (
        ["trainer.accelerator=tpu"],
        "error: trainer.accelerator must be one of auto, cpu, gpu, cuda, mps; got 'tpu'",
    ),
    "misspelled key": (
        ["data.batch_sise=32"],
        "error: data.batch_sise is not a config key; did you mean data.batch_size?",
    ),
    "misspelled top-level key": (
        ["seeed=3"],
        "error: seeed is not a config key; did you mean seed?",
    ),
    "zero threads": (
        ["perf.threads=0"],
        "error: perf.threads must be a positive integer (or null: one per core), got 0",
    ),
    "missing data file": (
        ["data=csv", "data.path=/nonexistent/load.csv"],
        "error: data.path=/nonexistent/load.csv: no such file",
    ),
}


@pytest.mark.parametrize("case", list(CONFIG_CASES))
def test_a_bad_config_value_is_one_line(run_cli, store, case):
    args, message = CONFIG_CASES[case]
    proc = run_cli(*TINY, *args)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-2000:]
    assert message in out
    assert "Traceback" not in out
    assert no_runs(store)  # refused before any run was opened


# Found when the data is read: the run is opened, then ends FAILED with the line as its reason.
# The cases run as two multiruns (one per file format), so the CLI starts twice, not seven times;
# each job prints its line and ends its run FAILED as a single run would.
DATA_CASES = {
    "empty csv": ("empty.csv", "", "the file is empty"),
    "non-numeric csv cell": (
        "cell.csv",
        _csv_rows(20, bad_line=7),
        "cell.csv:7: not a number: 'two'",
    ),
    "fewer samples than a batch": (
        "few.csv",
        _csv_rows(20),
        "20 training samples are fewer than one batch of data.batch_size=64",
    ),
    "not the declared format": ("text.npz", "just some text\n", "not a NumPy .npz file"),
    "x of the wrong rank": (
        "rank.npz",
        {"X": np.zeros((4, 3, 2, 2), np.float32), "y": np.zeros(4, np.float32)},
        "X must be (N, features) or (N, steps, features), got shape (4, 3, 2, 2)",
    ),
    "mismatched x and y": (
        "lengths.npz",
        {"X": np.zeros((10, 3), np.float32), "y": np.zeros(9, np.float32)},
        "y must be (N,) or (N, responses) with N=10 as in X, got shape (9,)",
    ),
    "NaN in the inputs": (
        "nan.npz",
        {
            "X": np.r_[np.full((1, 3), np.nan), np.ones((99, 3))].astype(np.float32),
            "y": np.ones(100, np.float32),
        },
        "1 of 100 samples hold NaN or Inf (the first is sample 0)",
    ),
}


@pytest.fixture(scope="module")
def bad_data_sweeps(tmp_path_factory, _empty_store):
    import mlflow

    root = tmp_path_factory.mktemp("bad_data")
    (root / "mlruns").mkdir()
    shutil.copy(_empty_store, root / "mlruns" / "mlflow.db")
    paths = {case: _write(root, name, content) for case, (name, content, _) in DATA_CASES.items()}
    output = ""
    for fmt in ("csv", "npz"):
        files = ",".join(str(p) for p in paths.values() if p.suffix == f".{fmt}")
        proc = run_in_process(
            [
                "-m",
                f"data={fmt}",
                f"data.path={files}",
                "data.batch_size=64",
                "data.val_fraction=0",
                "trainer.max_epochs=1",
                f"paths.root_dir={root}",
            ],
            root,
            cli_env(),
        )
        assert proc.returncode == 1, (
            proc.stdout[-2000:] + proc.stderr[-2000:]
        )  # a sweep with failed jobs
        output += proc.stdout + proc.stderr
    return output, paths, mlflow.MlflowClient(f"sqlite:///{root}/mlruns/mlflow.db")


@pytest.mark.parametrize("case", list(DATA_CASES))
def test_bad_data_is_one_line_and_a_failed_run(bad_data_sweeps, case):
    output, paths, client = bad_data_sweeps
    message = DATA_CASES[case][2]
    lines = [line for line in output.splitlines() if line.startswith("error:") and message in line]
    assert len(lines) == 1, output[-3000:]
    assert "Traceback" not in output
    runs = [
        r
        for r in client.search_runs([client.get_experiment_by_name("seqlab").experiment_id])
        if r.data.params.get("data.path") == str(paths[case])
    ]
    assert [r.info.status for r in runs] == ["FAILED"]
    assert message in runs[0].data.tags["failure_reason"]


def test_gpu_without_cuda_is_one_line_and_a_failed_run(run_cli, store):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    proc = run_cli(*TINY, "trainer.accelerator=gpu")
    assert proc.returncode == 1
    assert (
        "error: trainer.accelerator=gpu asked for a CUDA GPU, but this machine has only: cpu"
        in proc.stdout
    )
    assert "Traceback" not in proc.stdout + proc.stderr
    (run,) = store.search_runs([store.get_experiment_by_name("seqlab").experiment_id])
    assert run.info.status == "FAILED"
