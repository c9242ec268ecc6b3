"""Composition, the typed schema, up-front validation, and a CLI start-up free of heavy imports."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import ROOT
from hydra.errors import ConfigCompositionException


@pytest.mark.parametrize(
    "override",
    ["data.batchsize=3", "data.batch_size=abc", "trainer.max_epochs=1.5", "model.hidden=3"],
)
def test_schema_rejects_unknown_keys_and_wrong_types(compose_cfg, override):
    with pytest.raises(ConfigCompositionException):
        compose_cfg(override)


def test_a_sweep_list_is_checked_value_by_value_before_anything_runs():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), "-m", "trainer.accelerator=cpu,tpu"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert proc.returncode == 1
    assert (
        proc.stderr.strip()
        == "error: trainer.accelerator must be one of auto, cpu, gpu, cuda, mps; got 'tpu'"
    )


@pytest.mark.parametrize("args", [["--help"], ["--cfg", "job"]])
def test_cli_start_up_imports_no_torch_lightning_or_mlflow(args):
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", str(ROOT / "train.py"), *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    imported = {
        line.split("|")[-1].strip().split(".")[0]
        for line in proc.stderr.splitlines()
        if "|" in line
    }
    assert "hydra" in imported  # the check sees imports at all
    assert not imported & {
        "torch",
        "pytorch_lightning",
        "lightning",
        "mlflow",
        "torchmetrics",
        "scipy",
        "matplotlib",
    }
    if args == ["--cfg", "job"]:
        assert "batch_size: 64" in proc.stdout


def test_cli_bad_value_is_one_line_and_exit_1(run_process):
    proc = run_process("data.batch_size=0")  # a real process: its exit status
    assert proc.returncode == 1
    out = proc.stdout + proc.stderr
    assert "error: data.batch_size must be a positive integer, got 0" in out
    assert "Traceback" not in out
