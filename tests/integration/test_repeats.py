"""Repeated trials and sweeps that resume, through the real CLI: a sweep with 3 seeds per
configuration ends with a parent whose comparison has n = 3 and intervals; a sweep stopped by
SIGTERM in its third job continues with resume=latest into the same runs; every run records its
best val_rmse and when it was reached."""

from __future__ import annotations

import csv
import signal
import time

import pytest
from conftest import TINY, artifact_paths, runs_of, start_cli

from seqlab.train import train


def test_every_run_records_its_best_val_rmse_and_when(compose_cfg, store):
    train(compose_cfg("data.n_samples=512", "trainer.max_epochs=4"))
    (run,) = runs_of(store, "seqlab")
    history = store.get_metric_history(run.info.run_id, "val_rmse")
    best = min(history, key=lambda m: m.value)
    m = run.data.metrics
    assert m["best_val_rmse"] == pytest.approx(best.value)
    assert m["best_val_rmse_step"] == best.step
    assert (
        m["best_val_rmse_epoch"] == [h.step for h in history].index(best.step) + 1
    )  # validation once an epoch


def test_a_sweep_with_three_seeds_compares_n_3_with_intervals(run_cli, store, tmp_path):
    proc = run_cli(
        "-m", "seed=0,1,2", "data.batch_size=32,64", *TINY, "logger.system_metrics=false"
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "6 jobs, 0 failed" in proc.stdout
    # the seed varies slowest: configurations interleave
    order = [
        line.split(" : ", 1)[1].split()[:2]
        for line in proc.stdout.splitlines()
        if "[HYDRA] \t#" in line
    ]
    assert order == [
        ["seed=0", "data.batch_size=32"],
        ["seed=0", "data.batch_size=64"],
        ["seed=1", "data.batch_size=32"],
        ["seed=1", "data.batch_size=64"],
        ["seed=2", "data.batch_size=32"],
        ["seed=2", "data.batch_size=64"],
    ]
    runs = runs_of(store, "seqlab")
    (parent,) = [r for r in runs if r.data.tags.get("sweep_role") == "parent"]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(children) == 6 and all("best_val_rmse" in c.data.metrics for c in children)
    # One `config` tag per configuration, the same on its three repeats: the MLflow UI groups by it.
    configs = {}
    for c in children:
        configs.setdefault(c.data.tags["config"], set()).add(
            (c.data.params["data.batch_size"], c.data.params["seed"])
        )
    assert sorted(configs.values(), key=sorted) == [
        {("32", s) for s in "012"},
        {("64", s) for s in "012"},
    ]
    assert sorted(tag.split(" #")[0] for tag in configs) == ["cpu-bs32", "cpu-bs64"]
    assert {
        "comparison/comparison.csv",
        "comparison/comparison_runs.csv",
        "comparison/verdict.txt",
        "comparison/throughput_vs_batch.png",
        "comparison/val_rmse_curves.png",
    } <= artifact_paths(store, parent.info.run_id)
    local = store.download_artifacts(parent.info.run_id, "comparison", str(tmp_path / "dl"))
    with open(f"{local}/comparison.csv") as f:
        groups = list(csv.DictReader(f))
    assert [(g["batch_size"], g["n"], g["seeds"]) for g in groups] == [
        ("32", "3", "0 1 2"),
        ("64", "3", "0 1 2"),
    ]
    for g in groups:
        for metric in ("samples_per_s", "best_val_rmse", "val_rmse"):
            lo, mean, hi = (float(g[f"{metric}_{k}"]) for k in ("ci95_lo", "mean", "ci95_hi"))
            assert lo < mean < hi, (metric, g)
    verdict = parent.data.tags["verdict"]
    assert (
        verdict.startswith("n = 3 repeats per configuration (seeds 0, 1, 2)")
        and "Welch's t-test at 5%" in verdict
    )
    assert "±" in proc.stdout[proc.stdout.index("verdict:") :]


def _wait_for(path, text, timeout=180):
    deadline = time.monotonic() + timeout
    while text not in path.read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert text in path.read_text(), path.read_text()[-2000:]


def test_a_sweep_stopped_in_its_third_job_resumes_where_it_stopped(run_cli, store, tmp_path):
    # Four jobs; the third trains long enough to be stopped mid-run (signalled once it has printed its
    # third epoch, it stops at its next step: 27 epochs to spare), the fourth never starts.
    sweep = [
        "-m",
        "trainer.max_epochs=2,3,30,4",
        "data.n_samples=256",
        "logger.system_metrics=false",
    ]
    err = tmp_path / "stderr.txt"
    with open(err, "w") as stderr:
        proc = start_cli(tmp_path, *sweep, stderr=stderr)
        _wait_for(err, "epoch 3/30")
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 143, out[-2000:]
    runs = runs_of(store, "seqlab")
    (parent,) = [r for r in runs if r.data.tags.get("sweep_role") == "parent"]
    sweep_id = parent.data.tags["sweep_id"]
    assert parent.info.status == "KILLED"
    assert f"resume={sweep_id}" in err.read_text()  # the command that continues the sweep
    jobs = {r.data.tags["job_num"]: r for r in runs if "job_num" in r.data.tags}
    assert sorted(jobs) == ["0", "1", "2"] and jobs["2"].info.status == "KILLED"
    killed_id = jobs["2"].info.run_id

    # Other overrides than the sweep's: one line, nothing changes.
    refused = run_cli(
        "-m",
        "trainer.max_epochs=2,3",
        "data.n_samples=256",
        "logger.system_metrics=false",
        "resume=latest",
    )
    assert refused.returncode == 1
    (line,) = [x for x in refused.stderr.splitlines() if x.strip()]
    assert line.startswith(
        f"error: resume=latest: these overrides differ from sweep {sweep_id}'s: trainer.max_epochs=2,3 "
        "(not in the sweep), trainer.max_epochs=2,3,30,4 (missing)"
    )
    assert len(runs_of(store, "seqlab")) == len(runs)

    resumed = run_cli(*sweep, "resume=latest")
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert f"sweep {sweep_id} (resumed): 4 jobs, 0 failed" in resumed.stdout
    assert (
        resumed.stdout.count("FINISHED (done before: skipped)") == 2
        and "FINISHED (continued)" in resumed.stdout
    )

    runs = runs_of(store, "seqlab")
    assert (
        len([r for r in runs if r.data.tags.get("sweep_role") == "parent"]) == 1
    )  # the same parent, reopened
    parent = store.get_run(parent.info.run_id)
    assert parent.info.status == "FINISHED" and parent.data.tags["sweep_resumes"] == "1"
    children = [r for r in runs if r.data.tags.get("sweep_role") != "parent"]
    assert sorted(r.data.params["trainer.max_epochs"] for r in children) == [
        "2",
        "3",
        "30",
        "4",
    ]  # no duplicates
    assert all(r.info.status == "FINISHED" for r in runs)
    assert all(
        r.data.tags["mlflow.parentRunId"] == parent.info.run_id
        and r.data.tags["sweep_id"] == sweep_id
        for r in children
    )
    third = next(r for r in children if r.data.params["trainer.max_epochs"] == "30")
    assert third.info.run_id == killed_id  # continued into its own run
    steps = [m.step for m in store.get_metric_history(killed_id, "train_loss")]
    assert steps == list(
        range(1, 30 * 4 + 1)
    )  # 205 training samples, batch 64: 4 steps an epoch, each once
    assert "Repeats: 4 of 4 runs finished" in parent.data.tags["verdict"]


def test_resume_names_a_run_in_a_single_run_and_a_sweep_in_a_multirun(run_cli, store):
    single = run_cli(*TINY, "resume=latest")
    assert single.returncode == 1
    (line,) = (single.stdout + single.stderr).strip().splitlines()
    assert line.startswith(
        "error: resume=latest: a single run continues an MLflow run (resume=RUN_ID, 32 hex digits)"
    )
    nothing = run_cli("-m", "data.batch_size=32,64", *TINY, "resume=latest")
    assert nothing.returncode == 1
    assert "error: resume=latest: no sweep in experiment 'seqlab' to continue" in nothing.stderr
    run_id = run_cli(
        "-m", "data.batch_size=32,64", *TINY, "resume=0123456789abcdef0123456789abcdef"
    )
    assert (
        run_id.returncode == 1
        and "names a run; a sweep continues with resume=latest" in run_id.stderr
    )
    assert not [r for r in runs_of(store, "seqlab") if r.info.status == "RUNNING"]


def test_resume_from_another_host_leaves_a_job_with_a_live_heartbeat_alone(
    run_cli, store, tmp_path
):
    """A sweep's job still training on a compute node (another host, a fresh heartbeat) is left
    alone by resume=latest from a login node; once its heartbeat has stood still for 15 minutes by
    the asking host's own clock (not by comparing clocks), it counts as dead and runs again."""
    from seqlab.store.ghosts import BeatsSeen

    sweep = ["-m", "seed=0,1", *TINY, "trainer.max_epochs=1", "logger.system_metrics=false"]
    assert run_cli(*sweep).returncode == 0
    (job1,) = [r for r in runs_of(store, "seqlab") if r.data.tags.get("job_num") == "1"]
    # As if job 1 still trained on node9: RUNNING, its process there, a heartbeat written by
    # node9's clock an hour ahead of ours (clocks are not compared).
    store.update_run(job1.info.run_id, "RUNNING")
    beat = str(int(time.time()) + 3600)
    for key, value in {"process_host": "node9", "process_pid": "4242", "heartbeat": beat}.items():
        store.set_tag(job1.info.run_id, key, value)

    alive = run_cli(*sweep, "resume=latest")
    assert alive.returncode == 0, alive.stdout[-3000:] + alive.stderr[-3000:]
    assert "1 still running (their heartbeat is alive) are left alone" in alive.stdout
    assert (
        f"job 1 still trains in run {job1.info.run_name} ({job1.info.run_id}) on node9"
        in alive.stdout
    )
    assert "2 jobs, 0 failed, 1 still running elsewhere" in alive.stdout
    assert store.get_run(job1.info.run_id).info.status == "RUNNING"
    assert (
        len([r for r in runs_of(store, "seqlab") if r.data.tags.get("job_num") == "1"]) == 1
    )  # not run again

    # The same heartbeat value, first seen here 20 minutes ago: stale by this host's own clock.
    seen = BeatsSeen.of_store(f"sqlite:///{tmp_path}/mlruns/mlflow.db")
    seen.seen[job1.info.run_id], seen.changed = [beat, time.time() - 20 * 60], True
    seen.save({job1.info.run_id})
    dead = run_cli(*sweep, "resume=latest")
    assert dead.returncode == 0, dead.stdout[-3000:] + dead.stderr[-3000:]
    ended = store.get_run(job1.info.run_id)
    assert ended.info.status == "KILLED"
    assert (
        "its heartbeat from node9 has not changed for 20 min" in ended.data.tags["failure_reason"]
    )
    again = [r for r in runs_of(store, "seqlab") if r.data.tags.get("job_num") == "1"]
    assert len(again) == 2 and again[-1].info.status == "FINISHED"
