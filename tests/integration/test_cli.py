"""The real CLI in a subprocess: multiruns grouped under a parent run, and a missing device failing
its job but not the sweep (a tracking server over http: test_scale.py)."""

from __future__ import annotations

import pytest
import torch
from conftest import TINY, artifact_paths, runs_of


def _children_and_parent(store, experiment="seqlab"):
    runs = runs_of(store, experiment)
    parents = [r for r in runs if r.data.tags.get("sweep_role") == "parent"]
    assert len(parents) == 1, [r.info.run_name for r in runs]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id]
    return parents[0], sorted(children, key=lambda r: int(r.data.tags["job_num"]))


def test_multirun_records_one_child_run_per_job_under_a_parent(run_cli, store, tmp_path):
    proc = run_cli("-m", "data.batch_size=32,64", *TINY)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "2 jobs, 0 failed" in proc.stdout

    parent, children = _children_and_parent(store)
    assert len(runs_of(store, "seqlab")) == 3
    assert [c.info.run_name for c in children] == ["cpu-bs32", "cpu-bs64"]
    assert [c.data.params["data.batch_size"] for c in children] == ["32", "64"]
    assert parent.info.status == "FINISHED"
    assert all(c.info.status == "FINISHED" for c in children)
    sweep_id = parent.data.tags["sweep_id"]
    assert all(c.data.tags["sweep_id"] == sweep_id for c in children)
    assert (
        children[0]
        .data.tags["hydra_overrides"]
        .startswith("data.batch_size=32 data.n_samples=256 trainer.max_epochs=2 ")
    )

    files = artifact_paths(store, children[0].info.run_id)
    assert {
        "hydra/config.yaml",
        "hydra/overrides.yaml",
        "hydra/hydra.yaml",
        "config.yaml",
        "train.log",
    } <= files
    assert {"sweep_summary.txt", "sweep_summary.csv"} <= artifact_paths(store, parent.info.run_id)
    summary = (next((tmp_path / "logs" / "multiruns").iterdir()) / "sweep_summary.csv").read_text()
    assert summary.count("FINISHED") == 2


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a sweep on a CPU-only machine")
def test_a_missing_gpu_fails_its_jobs_not_the_sweep(run_cli, store):
    proc = run_cli("-m", "trainer.accelerator=cpu,gpu", *TINY)
    assert proc.returncode == 1
    out = proc.stdout
    assert "2 jobs, 1 failed" in out
    assert (
        "error: trainer.accelerator=gpu asked for a CUDA GPU, but this machine has only: cpu" in out
    )
    table = out[out.index("2 jobs, 1 failed") :]
    assert (
        "FINISHED" in table and "FAILED" in table and "Traceback" not in proc.stdout + proc.stderr
    )

    parent, (cpu, gpu) = _children_and_parent(store)
    assert cpu.info.status == "FINISHED" and cpu.data.tags["accelerator"] == "cpu"
    assert gpu.info.status == "FAILED" and gpu.info.run_name == "gpu-bs64"
    assert "asked for a CUDA GPU" in gpu.data.tags["failure_reason"]
    assert parent.info.status == "FAILED" and parent.data.tags["n_failed"] == "1"
    assert not [r for r in runs_of(store, "seqlab") if r.info.status == "RUNNING"]


def test_a_sweep_cut_short_does_not_leave_its_parent_running(run_cli, store):
    proc = run_cli("-m", "data.batch_size=abc,def", *TINY)  # no job's config composes
    assert proc.returncode != 0
    (parent,) = runs_of(store, "seqlab")
    assert parent.data.tags["sweep_role"] == "parent"
    assert parent.info.status == "FAILED"
    assert "stopped before its summary" in parent.data.tags["failure_reason"]
