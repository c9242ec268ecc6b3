"""What the tests in `integration/test_checkpoint_models.py`, `integration/test_onnx.py`,
`integration/test_run_to_use.py` and `unit/test_predict.py` share (under tests/)."""

from __future__ import annotations

import mlflow


# -- predict.py ---------------------------------------------------------------------------------
def _cli(root, *args):
    """`python predict.py ARGS...` as a user runs it, in this process (tests/inprocess.py)."""
    from conftest import cli_env

    from harness.inprocess import run_in_process

    return run_in_process([*args, f"paths.root_dir={root}"], root, cli_env(), script="predict.py")


def _new_data(n=48, seed=7):
    from seqlab.data import synthetic_daily_load

    data = synthetic_daily_load(n_samples=n, seed=seed)
    return data.x, data.y


def _pyfunc(root, uri):
    mlflow.set_tracking_uri(f"sqlite:///{root}/mlruns/mlflow.db")
    try:
        return mlflow.pyfunc.load_model(uri)
    finally:
        mlflow.set_tracking_uri(None)
