"""`make dashboard`: optuna-dashboard over a search's study storage (issue 36, point 3), the study
and its trials' values read in a real headless Chromium; the storage reaches it in the
environment, never on a command line."""

from __future__ import annotations

from harness.inprocess import run_script

from seqlab.sweeps.dashboard import STORAGE_VARIABLE, storage_url


def test_the_storage_is_make_s_then_the_search_s_then_this_project_s(tmp_path):
    assert (
        storage_url(
            {STORAGE_VARIABLE: "sqlite:///a.db", "OPTUNA_STORAGE": "sqlite:///b.db"}, tmp_path
        )
        == "sqlite:///a.db"
    )
    assert (
        storage_url({STORAGE_VARIABLE: "", "OPTUNA_STORAGE": "sqlite:///b.db"}, tmp_path)
        == "sqlite:///b.db"
    )
    assert storage_url({}, tmp_path) == f"sqlite:///{tmp_path}/mlruns/optuna.db"
    missing = run_script(
        "seqlab.sweeps.dashboard", ["--root", str(tmp_path)], env={STORAGE_VARIABLE: ""}
    )
    assert missing.returncode == 1 and missing.stderr.startswith(
        f"error: no study storage at sqlite:///{tmp_path}/mlruns/optuna.db"
    )
