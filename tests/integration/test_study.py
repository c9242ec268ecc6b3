"""The device x batch-size study: time to target, system metrics, the comparison (table,
crossover, plots, verdict, artifacts on the parent run) and the sweep preset through the CLI."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import ROOT, artifact_paths, runs_of
from harness.inprocess import run_script
from matplotlib.image import imread

from seqlab.sweeps.compare import compare
from seqlab.train import train


def test_time_to_target_is_the_training_time_when_val_rmse_first_reached_it(compose_cfg, store):
    train(
        compose_cfg(
            "data.n_samples=4096",
            "trainer.max_epochs=6",
            "metrics.target_rmse=0.25",
            # The run lasts about a second on a quick host: samples every 0.1 s leave margin (at
            # 0.5 s, the first sample sometimes came after the run's end: none recorded).
            "logger.system_metrics_interval_s=0.1",
        )
    )
    (run,) = runs_of(store, "seqlab")
    vals = store.get_metric_history(run.info.run_id, "val_rmse")
    first = next(m for m in vals if m.value <= 0.25)
    assert run.data.tags["target_reached"] == "true"
    assert run.data.metrics["steps_to_target"] == first.step
    steps_per_epoch = vals[0].step  # validation once an epoch
    assert run.data.metrics["epochs_to_target"] == first.step / steps_per_epoch
    # the training time of the epochs up to that validation, validation excluded
    epochs = store.get_metric_history(run.info.run_id, "epoch_time_s")
    expected = sum(m.value for m in epochs if m.step <= first.step)
    assert run.data.metrics["time_to_target_s"] == pytest.approx(expected, rel=0.05)
    # system metrics sampled alongside
    assert any(k.startswith("system/cpu_utilization") for k in run.data.metrics)


def test_a_target_never_reached_is_said(compose_cfg, store):
    train(compose_cfg("data.n_samples=256", "trainer.max_epochs=1", "metrics.target_rmse=0.0001"))
    (run,) = runs_of(store, "seqlab")
    assert run.data.tags["target_reached"] == "false" and "time_to_target_s" not in run.data.metrics


def test_the_study_through_the_cli_compares_on_the_parent_run(run_cli, store, tmp_path):
    # replicas=1,2 in the place of the preset's 1,8,32: each perf=fast job also as a pack of 2.
    proc = run_cli(
        "-m",
        "sweep=device_batch",
        "seed=0",
        "data.batch_size=32,128",
        "replicas=1,2",
        "data.n_samples=1024",
        "trainer.max_time=00:00:00:01",
        "metrics.target_rmse=0.3",
        "logger.system_metrics=false",
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (
        "replicas  2 job(s) left out: perf=naive trains through Lightning's own loop, and replicas train packed"
        in proc.stdout
    )
    assert "8 jobs, 0 failed" in proc.stdout
    assert "Only cpu runs finished: no CPU/GPU crossover to report." in proc.stdout
    runs = runs_of(store, "device-batch")
    parent = next(r for r in runs if r.data.tags.get("sweep_role") == "parent")
    members = [r for r in runs if "pack_id" in r.data.tags]
    # Each pack: the job's config twice, seeds 0, 1 (seed*2 + i of its seed 0).
    assert sorted(
        (r.data.params["data.batch_size"], r.data.params["seed"], r.data.params["perf.name"])
        for r in members
    ) == [(b, s, "fast") for b in ("128", "32") for s in ("0", "1")]
    assert len({r.data.tags["pack_id"] for r in members}) == 2
    # a pack's members are repeats (seeds 0, 1) of one configuration: one config tag each pack
    assert {r.data.tags["pack_id"]: r.data.tags["config"] for r in members} == {
        r.data.tags["pack_id"]: r.data.tags["config"] for r in reversed(members)
    }
    assert len({r.data.tags["config"] for r in members}) == 2
    assert all(r.data.tags["mlflow.parentRunId"] == parent.info.run_id for r in members)
    verdict = parent.data.tags["verdict"]
    assert (
        "Most networks trained per second (a pack counts all its members; the machine used fully)"
        in verdict
    )
    children = [
        r
        for r in runs
        if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id
        and "pack_id" not in r.data.tags
    ]
    assert sorted(
        (c.data.params["perf.name"], c.data.params["data.batch_size"]) for c in children
    ) == [("fast", "128"), ("fast", "32"), ("naive", "128"), ("naive", "32")]
    # the preset sweeps the seed (given once here): names say it, as every swept key
    assert {c.info.run_name for c in children} == {
        "cpu-bs32-seed=0-perf=naive-replicas=1",
        "cpu-bs32-seed=0-perf=fast-replicas=1",
        "cpu-bs128-seed=0-perf=naive-replicas=1",
        "cpu-bs128-seed=0-perf=fast-replicas=1",
    }
    files = artifact_paths(store, parent.info.run_id)
    expected = {
        "comparison/comparison.csv",
        "comparison/comparison.md",
        "comparison/verdict.txt",
        "comparison/throughput_vs_batch.png",
        "comparison/time_to_target_vs_batch.png",
        "comparison/val_rmse_curves.png",
    }
    assert expected <= files
    local = store.download_artifacts(parent.info.run_id, "comparison", str(tmp_path / "dl"))
    for name in ("throughput_vs_batch.png", "time_to_target_vs_batch.png", "val_rmse_curves.png"):
        assert imread(f"{local}/{name}").shape[0] > 100
    # The comparison's packed rows: K networks a step, counted whole (model-steps/s), labelled as packed.
    table = (Path(local) / "comparison.md").read_text()
    assert "model-steps/s" in table.splitlines()[0]
    packed_rows = [
        line
        for line in table.splitlines()
        if line.startswith("| cpu | ") and "| fast, packed x2 |" in line
    ]
    assert len(packed_rows) == 2, table
    # One run of each configuration alone, two members of each pack: the packs' seeds are repeats.
    assert parent.data.tags["verdict"].startswith("n = 1-2 repeats per configuration (seeds 0, 1)")

    # and on demand, from the script
    again = run_script(
        ROOT / "scripts" / "compare.py",
        [
            "--experiment",
            "device-batch",
            "--sweep",
            "latest",
            "--tracking-uri",
            f"sqlite:///{tmp_path}/mlruns/mlflow.db",
            "--out",
            str(tmp_path / "cmp"),
            "--no-log",
        ],
    )
    assert again.returncode == 0, again.stderr
    assert again.stdout.count("FINISHED") == 8 and "perf" in again.stdout.splitlines()[0]
    assert "n: finished repeats" in again.stdout


def test_compare_shows_failed_runs_and_rejects_unknown_experiments(compose_cfg, store, tmp_path):
    import torch

    train(compose_cfg("data.n_samples=256", "trainer.max_epochs=1"))
    if not torch.cuda.is_available():
        with pytest.raises(Exception):
            train(
                compose_cfg("data.n_samples=256", "trainer.max_epochs=1", "trainer.accelerator=gpu")
            )
    report = compare(store, "seqlab", tmp_path / "out", log_to_parent=False)
    statuses = sorted(r.status for r in report.rows)
    assert statuses == (["FINISHED"] if torch.cuda.is_available() else ["FAILED", "FINISHED"])
    assert (tmp_path / "out" / "comparison_runs.csv").read_text().count("\n") == len(
        report.rows
    ) + 1
    with pytest.raises(ValueError, match="no MLflow experiment named 'nope'"):
        compare(store, "nope", tmp_path / "out")
