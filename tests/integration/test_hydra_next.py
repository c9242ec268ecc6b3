"""Hydra's next line: seqlab composes and runs on Hydra 1.4 (a prerelease, with OmegaConf 2.4) as on
the pinned 1.3, without a warning of either (version_base, config-store collisions, resolvers,
instantiate's execution whitelist). `make install` puts the prerelease in .venv/hydra-next, which
these tests put first on PYTHONPATH."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import ROOT, TINY, cli_env

NEXT = ROOT / ".venv" / "hydra-next"
WARNED = ("Warning", "deprecated", "execution_whitelist", "Please report to plugin author")

COMPOSE_EVERY_OPTION = """
import warnings
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as caught:
    import hydra, omegaconf
    from hydra import compose, initialize_config_dir
    import seqlab.schema
    from seqlab.hydra_version import VERSION_BASE
    from seqlab.validation import validate
    from pathlib import Path
    conf = Path("conf").resolve()
    options = [f"{p.parent.name}={p.stem}" for p in conf.glob("*/*.yaml")
               if p.parent.name not in ("hydra", "paths", "logger", "trainer", "model")]
    with initialize_config_dir(str(conf), **VERSION_BASE):
        for option in options:
            extra = [f"data.path={conf}/../README.md"] if option.startswith("data=") and option[5:] in ("npz", "csv", "mat", "parquet") else []
            validate(compose("train", overrides=[option, *extra]))
        compose("train", overrides=["hparams_search=optuna", "hydra/launcher=slurm"], return_hydra_config=True)
print("versions", hydra.__version__, omegaconf.__version__, len(options))
for w in caught:
    print("warned:", w.category.__name__, str(w.message).splitlines()[0])
"""


def _next_env(tmp_path) -> dict[str, str]:
    if not (NEXT / "hydra" / "__init__.py").is_file():
        pytest.skip(f"Hydra 1.4's prerelease is not in {NEXT}: `make install` could not fetch it")
    return cli_env(
        {
            "PYTHONPATH": os.pathsep.join([str(NEXT), str(ROOT / "src")]),
            "XDG_CACHE_HOME": str(tmp_path / "cache"),
        }
    )


def test_every_option_composes_on_hydra_1_4_without_a_warning(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", COMPOSE_EVERY_OPTION],
        cwd=ROOT,
        env=_next_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    versions = next(
        line for line in proc.stdout.splitlines() if line.startswith("versions")
    ).split()
    assert versions[1].startswith("1.4") and versions[2].startswith("2.4") and int(versions[3]) > 20
    assert not [line for line in proc.stdout.splitlines() if line.startswith("warned:")], (
        proc.stdout
    )
    assert not any(word in proc.stderr for word in WARNED), proc.stderr[-3000:]


def test_a_sweep_trains_on_hydra_1_4_without_a_warning(tmp_path):
    import mlflow

    proc = subprocess.run(
        [
            sys.executable,
            "train.py",
            "-m",
            "seed=0,1",
            *TINY,
            "logger.system_metrics=false",
            f"paths.root_dir={tmp_path}",
        ],
        cwd=ROOT,
        env=_next_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "2 jobs, 0 failed" in out
    assert not any(word in out for word in WARNED), out[-3000:]
    runs = mlflow.MlflowClient(f"sqlite:///{tmp_path}/mlruns/mlflow.db").search_runs(
        [
            e.experiment_id
            for e in mlflow.MlflowClient(
                f"sqlite:///{tmp_path}/mlruns/mlflow.db"
            ).search_experiments()
        ]
    )
    assert sorted(r.info.status for r in runs) == ["FINISHED"] * 3  # the parent and its two jobs
    # Each job's config.yaml (tracking.omegaconf_private.config_yaml: OmegaConf's own dumper, of
    # the config resolved once) is what OmegaConf 2.4 writes of it.
    written = sorted(tmp_path.glob("logs/multiruns/*/*/config.yaml"))
    check = (
        "import sys; from omegaconf import OmegaConf\n"
        "for path in sys.argv[1:]:\n"
        "    text = open(path).read()\n"
        "    assert OmegaConf.to_yaml(OmegaConf.create(text)) == text, path\n"
    )
    assert len(written) == 2
    done = subprocess.run(
        [sys.executable, "-c", check, *map(str, written)],
        env=_next_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]
