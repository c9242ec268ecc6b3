"""The house's floor plan (issue 21): packages named for what they hold, no import circle (imports
inside functions count: a circle hidden in a function body is still one), small modules, and the
shipped configs naming each class where it is."""

from __future__ import annotations

import subprocess
import sys

from conftest import cli_env


def test_the_light_modules_stay_light():
    """What every multirun (the sweep callback, the packing sweeper and its plan), every job (its sweep and trial), the store's reaper
    and the delivery process (one per training process) import pulls in neither torch, Lightning,
    MLflow nor Optuna: a new Python, as Hydra and a run start one."""
    code = (
        "import sys\n"
        "import seqlab.sweeps.callback, seqlab.sweeps.job, seqlab.sweeps.trial, seqlab.sweeps.study, "
        "seqlab.sweeps.summary, seqlab.resume.points, seqlab.store.ghosts, seqlab.delivery.helper, seqlab.task, "
        "seqlab.sweeps.packs, hydra_plugins.seqlab_pack_sweeper.sweeper\n"
        "print(sorted(m for m in ('torch', 'pytorch_lightning', 'mlflow', 'optuna') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=cli_env(), timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"
