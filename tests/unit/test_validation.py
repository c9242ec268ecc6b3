"""Every kind of bad input through the real CLI, as a user meets it: one line that says what to
fix, a non-zero exit, no traceback, and no MLflow run left RUNNING."""

from __future__ import annotations

from conftest import TINY


def test_an_unknown_config_option_lists_the_valid_ones(run_cli):
    proc = run_cli(*TINY, "optimizer=lbfgs")  # Hydra's own message, which names the choices
    assert proc.returncode == 1
    assert "Could not find 'optimizer/lbfgs'" in proc.stderr
    assert "Available options in 'optimizer':\n\tadam\n\tadamw\n\trmsprop\n\tsgdm" in proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
