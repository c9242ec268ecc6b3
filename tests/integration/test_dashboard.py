"""`make dashboard`: optuna-dashboard over a search's study storage (issue 36, point 3), the study
and its trials' values read in a real headless Chromium; the storage reaches it in the
environment, never on a command line."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request

import pytest
from conftest import ROOT

from seqlab.store.server import free_port
from seqlab.sweeps.dashboard import STORAGE_VARIABLE

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _page_text(url: str, wait_for: str, timeout: float = 60.0) -> str:
    """The page's text once it shows `wait_for`, in a fresh headless Chromium: scripts/ui_screenshot.py
    --text, a process of its own (Chromium's pipe takes file descriptors 3 and 4, which a test
    worker's own channel may hold)."""
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "ui_screenshot.py"),
            url,
            "-",
            "--text",
            wait_for,
            "--wait",
            str(timeout),
        ],
        capture_output=True,
        text=True,
        timeout=timeout + 60,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def _dashboard(url: str):
    """`python -m seqlab.sweeps.dashboard` (what make dashboard runs) over `url`, handed over as make
    hands it, in the environment; (its process, its address, the studies its API lists)."""
    port = free_port()
    env = {**os.environ, STORAGE_VARIABLE: url}
    proc = subprocess.Popen(
        [sys.executable, "-m", "seqlab.sweeps.dashboard", "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    for _ in range(120):
        try:
            with urllib.request.urlopen(f"{base}/api/studies", timeout=2) as answer:
                return proc, base, json.load(answer)["study_summaries"]
        except OSError:
            if proc.poll() is not None:
                pytest.fail(proc.stdout.read())
            time.sleep(0.5)
    proc.terminate()
    pytest.fail("optuna-dashboard did not answer in 60 s")


def _three_trials(url: str) -> None:
    import optuna

    study = optuna.create_study(study_name="seqlab-dashboard-test", storage=url)
    for x in (0.5, 1.0, 1.5):
        study.enqueue_trial({"x": x})
    study.optimize(lambda trial: trial.suggest_float("x", 0.0, 2.0) ** 2, n_trials=3)


@pytest.mark.skipif(
    CHROMIUM is None, reason="needs Chromium (apt-get install chromium; .ci/run installs it)"
)
def test_make_dashboard_shows_the_study_and_its_trials_values_in_a_browser(tmp_path):
    url = f"sqlite:///{tmp_path}/mlruns/optuna.db"
    (tmp_path / "mlruns").mkdir(exist_ok=True)
    _three_trials(url)
    proc, base, studies = _dashboard(url)
    try:
        assert [s["study_name"] for s in studies] == ["seqlab-dashboard-test"]
        with open(f"/proc/{proc.pid}/cmdline", "rb") as f:
            assert b"optuna.db" not in f.read()  # the storage came in the environment
        listed = _page_text(f"{base}/dashboard", "seqlab-dashboard-test")
        assert "seqlab-dashboard-test" in listed and "MINIMIZE" in listed.upper()
        trials = _page_text(f"{base}/dashboard/studies/{studies[0]['study_id']}/trials", "3 Trials")
        assert "3 Trials" in trials and all(f"Trial {n}" in trials for n in range(3))
        # The best trial, shown first: its value and its parameter.
        assert "0.25" in trials and "x 0.5" in trials
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_a_postgresql_study_that_wants_a_password_never_shows_it(postgres):
    from conftest import POSTGRES_PASSWORD

    url = postgres.replace("postgresql://", "postgresql+psycopg://").replace("/mlflow", "/optuna")
    _three_trials(url)
    proc, _, studies = _dashboard(url)
    try:
        assert [s["study_name"] for s in studies] == ["seqlab-dashboard-test"]
        with open(f"/proc/{proc.pid}/cmdline", "rb") as f:
            assert POSTGRES_PASSWORD.encode() not in f.read()
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    assert POSTGRES_PASSWORD not in out and "over postgresql+psycopg://seqlab:***@127.0.0.1:" in out
