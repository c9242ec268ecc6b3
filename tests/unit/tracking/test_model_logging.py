"""Checkpoints as MLflow 3 logged models (logger.log_checkpoints=best|all|none): the run's Models
tab lists them with their step and the validation metrics of that step, and predict.py takes one
by its models:/m-<id> URI."""

from __future__ import annotations


def test_a_bad_log_checkpoints_value_is_one_line(run_cli):
    proc = run_cli("logger.log_checkpoints=some")
    assert proc.returncode == 1
    assert (
        "error: logger.log_checkpoints must be one of best, all, none; got 'some'"
        in proc.stdout + proc.stderr
    )
