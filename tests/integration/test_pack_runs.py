"""Issue 22, points 3-5 through the real CLI: `-m ... pack=N` trains the jobs that differ only in
packable keys as one packed job, and each member is the run its job alone would be: the same
losses step by step (per packable key), the same params, a full metric history, a loadable model,
a checkpoint, dataset inputs and the pack's tags. A member that diverges ends FAILED while the
others finish; a pack killed with kill -9 after a time-based checkpoint continues with resume=latest."""

from __future__ import annotations

import json
import math
import signal

import numpy as np
import pytest
from conftest import ROOT, artifact_paths, cli_env, runs_of

from seqlab.benchmark.overhead import RUN_PHASES

# 512 samples, 410 for training in batches of 32: 13 steps an epoch; 8 epochs: 104 steps.
SMALL = [
    "data.n_samples=512",
    "data.source.n_features=32",
    "data.batch_size=32",
    "trainer.max_epochs=8",
    "logger.system_metrics=false",
]


def _losses(store, run_id):
    return np.array(
        [
            m.value
            for m in sorted(store.get_metric_history(run_id, "train_loss"), key=lambda m: m.step)
        ]
    )


def _members(store, experiment):
    runs = runs_of(store, experiment)
    return {r.data.tags["hydra_overrides"]: r for r in runs if "pack_id" in r.data.tags}


def _packed_then_alone(run_cli, store, seeds: str, seed: str, args: list[str]):
    """A pack of the jobs seed=`seeds` with `args`, then job seed=`seed` alone with the same args: the
    pack's output, that member's run, the run alone, and each one's train_loss in step order."""
    packed = run_cli(
        "-m",
        f"seed={seeds}",
        f"pack={seeds.count(',') + 1}",
        *args,
        "logger.experiment_name=packed",
    )
    assert packed.returncode == 0, (packed.stdout + packed.stderr)[-3000:]
    alone = run_cli(f"seed={seed}", *args, "logger.experiment_name=alone")
    assert alone.returncode == 0, (alone.stdout + alone.stderr)[-3000:]
    (single,) = runs_of(store, "alone")
    member = next(
        r
        for r in runs_of(store, "packed")
        if r.data.params.get("seed") == seed and "pack_id" in r.data.tags
    )
    return (
        packed,
        member,
        single,
        _losses(store, member.info.run_id),
        _losses(store, single.info.run_id),
    )


# Each member alone: one key away from the first member's values, so every packable key is checked.
ALONE = {
    "a": [
        [
            "seed=1",
            "optimizer.lr=0.001",
            "model.dropout=0.1",
        ],  # seed: weights, data, order, dropout masks
        ["seed=0", "optimizer.lr=0.004", "model.dropout=0.1"],  # the learning rate
        ["seed=0", "optimizer.lr=0.001", "model.dropout=0.3"],
    ],  # the dropout rate
    "b": [
        ["module.l2_regularization=0.01", "module.gradient_threshold=null"],  # MATLAB's L2
        ["module.l2_regularization=0", "module.gradient_threshold=0.05"],
    ],  # the gradient threshold
}
# Issue 32: what packs refused before, shared by b's members: AdamW's decoupled weight decay, clipping
# (after MATLAB's L2 and threshold) and validation every N iterations (MATLAB's ValidationFrequency).
# The packed AdamW of a rate per member: tests/unit/packing/test_model.py.
# a's members share the seed script's settings (experiment=matlab_seed: MATLAB's init, L2 and
# threshold, its piecewise rate, every-50-iterations validation, the last partial batch dropped,
# population BatchNorm statistics at the end), with a validation set and a drop every 2 epochs
# so that each shows within 8 epochs: a pack keeps MATLAB's semantics (issue 32, point 7).
SHARED = {
    "a": ["experiment=matlab_seed", "data.val_fraction=0.18", "scheduler.step_size=2"],
    "b": [
        "optimizer=adamw",
        "optimizer.weight_decay=0.05",
        "trainer.gradient_clip_val=0.1",
        "trainer.check_val_every_n_epoch=null",
        "trainer.val_check_interval=5",
    ],
}
PACKED = {
    "a": ["seed=0,1", "optimizer.lr=0.001,0.004", "model.dropout=0.1,0.3"],
    "b": ["module.l2_regularization=0,0.01", "module.gradient_threshold=null,0.05"],
}


@pytest.mark.parametrize("which", ["a", "b"])
def test_each_member_trains_as_its_job_alone_per_packable_key(run_cli, store, which, tmp_path):
    packed = run_cli(
        "-m", *PACKED[which], *SHARED[which], "pack=8", *SMALL, "logger.experiment_name=packed"
    )
    assert packed.returncode == 0, (packed.stdout + packed.stderr)[-3000:]
    n = math.prod(o.count(",") + 1 for o in PACKED[which])
    assert f"{n} jobs as 1 launches: 1 pack(s) of {n} members" in packed.stdout
    assert f"{n} jobs, 0 failed" in packed.stdout
    members = _members(store, "packed")
    assert len(members) == n
    (parent,) = [r for r in runs_of(store, "packed") if r.data.tags.get("sweep_role") == "parent"]
    # Packed speeds are never shown as if each run had the machine alone.
    assert "jobs N.k trained packed" in packed.stdout
    # A pack of more than 4 members is one row of the console's summary.
    if n > 4:
        assert (
            f"0.0-{n - 1}" in packed.stdout
            and f"({n} members)" in packed.stdout
            and f"{n} FINISHED" in packed.stdout
        )
    else:
        assert "0.1  " in packed.stdout
    assert "perf=fast, packed" in parent.data.tags["verdict"]
    # The comparison counts a pack's networks whole: model-steps/s = K x each member's it/s.
    assert "Most networks trained per second" in parent.data.tags["verdict"]
    member = next(iter(members.values()))
    m = member.data.metrics
    assert m["pack_model_steps_per_s_median"] == pytest.approx(n * m["it_per_s_median"])
    # Each member's bookkeeping, phase by phase; the pack's process once for all (tracking.costs).
    spent = [json.loads(p.read_text()) for p in tmp_path.glob("logs/**/costs.json")]
    assert len(spent) == n and {s["pack_id"] for s in spent} == {member.data.tags["pack_id"]}
    assert all(set(s["run"]) == set(RUN_PHASES) for s in spent)
    assert len({json.dumps(s["process"]) for s in spent}) == 1
    assert spent[0]["process"]["member configs"] > 0
    for overrides in ALONE[which]:
        alone = run_cli(*overrides, *SHARED[which], *SMALL, "logger.experiment_name=alone")
        assert alone.returncode == 0, (alone.stdout + alone.stderr)[-3000:]
        single = runs_of(store, "alone")[-1]
        member = next(r for key, r in members.items() if set(overrides) <= set(key.split()))
        a, b = _losses(store, member.info.run_id), _losses(store, single.info.run_id)
        assert len(a) == len(b) == 104
        np.testing.assert_allclose(a[:100], b[:100], rtol=1e-4, err_msg=" ".join(overrides))
        # Validation runs on BatchNorm's running mean, which follows the convolution's bias: its true
        # gradient is zero (BatchNorm removes it), so Adam turns rounding noise into full-size steps,
        # and two implementations of the same math drift apart there (1% here) while every training
        # loss agrees to 1e-6. Within the spread of repeats is what "the same training" can promise.
        assert member.data.metrics["final_val_rmse"] == pytest.approx(
            single.data.metrics["final_val_rmse"], rel=0.05
        )
        val_steps = [
            [m.step for m in store.get_metric_history(r.info.run_id, "val_rmse")]
            for r in (member, single)
        ]
        assert (
            val_steps[0] == val_steps[1] == (list(range(5, 105, 5)) if which == "b" else [50, 100])
        )
        differ = {
            k
            for k in member.data.params.keys() | single.data.params.keys()
            if member.data.params.get(k) != single.data.params.get(k)
        }
        assert differ == {"paths.output_dir", "pack", "logger.experiment_name"}, differ
        assert member.info.status == "FINISHED"
        assert member.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert member.data.tags["pack_size"] == str(n) and member.data.tags["pack_id"].endswith(
            "-p0"
        )
        # What its run alone records, the pack's throughput besides.
        assert set(single.data.metrics) | {
            "pack_model_steps_per_s",
            "pack_model_steps_per_s_median",
        } == set(member.data.metrics)
        assert {
            "checkpoints/last.ckpt",
            "config.yaml",
            "training_curves.png",
            "hydra/overrides.yaml",
            "train.log",
        } <= artifact_paths(store, member.info.run_id)
        assert [i.dataset.name for i in member.inputs.dataset_inputs] == [
            i.dataset.name for i in single.inputs.dataset_inputs
        ]
    # One member's model loads and predicts as a run's alone does.
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlruns/mlflow.db")
    try:
        model = mlflow.pyfunc.load_model(f"runs:/{member.info.run_id}/model")
    finally:
        mlflow.set_tracking_uri(None)
    assert model.predict(np.zeros((3, 1, 32), dtype=np.float32)).shape == (3, 1)


# The pack's checkpoint saved every 0.2 s of training; once every member's run has it as its resume point,
# the process is killed with SIGKILL at once (a kill -9 right after a time-based checkpoint, whatever the
# machine's speed).
KILL_AFTER_A_CHECKPOINT = """
import math, os, runpy, signal, sys, time
sys.argv.pop(0)
from seqlab import train
from seqlab.packing import module
from seqlab.resume import points
from seqlab.resume.checkpoints import TimedCheckpoint
publish = points.publish_resume_point
published = []
after_step = module.SeqRegressor.after_step

def step_then_due_at(self):  # the time-based checkpoint comes due once step {at} is trained
    after_step(self)
    timed = next(c for c in self.trainer.callbacks if isinstance(c, TimedCheckpoint))
    timed._last = -math.inf if self.trained >= {at} else time.monotonic()

module.SeqRegressor.after_step = step_then_due_at

def publish_then_die(tracker, path, step):
    publish(tracker, path, step)
    published.append(step)
    if len(published) == 3:  # the pack's three members
        os.kill(os.getpid(), signal.SIGKILL)

points.publish_resume_point = publish_then_die
train.publish_resume_point = publish_then_die  # the harness's process has imported it already
runpy.run_path(sys.argv[0], run_name="__main__")
"""
# 819 training samples in batches of 32: 26 steps an epoch (the last of 19 samples), 4 epochs. Losses are sent at each epoch's end
# only (flush_every_n_steps=1000), so a checkpoint inside an epoch has steps not yet sent: they must be
# sent before it, or the resume, which continues after it, would never send them. The checkpoint comes
# due after one chosen step (the checkpoint's clock is set so) and is taken at the next Lightning call
# (2 steps a call here): mid-epoch, or after an epoch's last step and its end (validation, best).
KILLABLE = [
    "-m",
    "seed=0,1,2",
    "pack=3",
    "data.n_samples=1024",
    "data.source.n_features=32",
    "data.batch_size=32",
    "trainer.max_epochs=4",
    "trainer.max_time=00:00:30:00",
    "perf.steps_per_call=2",
    "checkpoint.interval_s=0.2",
    "logger.flush_every_n_steps=1000",
    "logger.flush_every_s=0",
    "logger.system_metrics=false",
]


# At an epoch's end (mid-epoch, on a tracking server: the outage test below).
def test_a_pack_killed_after_its_checkpoint_continues_with_resume_latest(tmp_path, store, run_cli):
    from harness import zygote

    at, args, experiment = 26, [*KILLABLE], "seqlab"
    killed = zygote.run(
        [str(ROOT / "train.py"), *args, f"paths.root_dir={tmp_path}"],
        tmp_path,
        cli_env(),
        timeout=300,
        code=KILL_AFTER_A_CHECKPOINT.replace("{at}", str(at)),
    )
    assert killed.returncode == -signal.SIGKILL, (killed.stdout + killed.stderr)[-3000:]
    members = {r.info.run_id: r for r in runs_of(store, experiment) if "pack_id" in r.data.tags}
    assert len(members) == 3 and all(
        r.info.status == "RUNNING" for r in members.values()
    )  # what kill -9 leaves
    stopped = {r.data.tags["interrupted_at_step"] for r in members.values()}
    assert stopped == {str(at)}  # one checkpoint for the whole pack, where it was due
    # trainer.max_time counts across starts: the checkpoint holds the time trained (Lightning's Timer).
    import torch

    (ckpt,) = tmp_path.glob("logs/multiruns/*/*/checkpoints/interrupted.ckpt")  # the pack job's own
    timer = next(
        v
        for k, v in torch.load(ckpt, weights_only=False)["callbacks"].items()
        if k.startswith("Timer")
    )
    assert timer["time_elapsed"]["train"] > 0

    resumed = run_cli(*args, "resume=latest")
    out = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, out[-3000:]
    assert (
        "3 KILLED continue from their checkpoint" in out
        and "continues its 3 members from step" in out
    )
    after = {r.info.run_id: r for r in runs_of(store, experiment) if "pack_id" in r.data.tags}
    assert after.keys() == members.keys()  # the same runs, continued
    for run_id, run in after.items():
        assert run.info.status == "FINISHED", run.data.tags.get("failure_reason")
        steps = sorted(m.step for m in store.get_metric_history(run_id, "train_loss"))
        assert steps == list(range(1, 4 * 26 + 1))  # every step once: none lost, none stored twice
        assert (
            len(store.get_metric_history(run_id, "val_rmse")) == 4
        )  # every epoch ended, the one of the checkpoint too


OUTAGE_THEN_DIE = """
import math, os, runpy, signal, sys, time
sys.argv.pop(0)
from seqlab import train
from seqlab.delivery.helper import Delivery
from seqlab.packing import module
from seqlab.resume import points
from seqlab.resume.checkpoints import TimedCheckpoint
publish = points.publish_resume_point
published = []
after_step = module.SeqRegressor.after_step

def step(self):  # one checkpoint, due after step 20; the outage after it; kill -9 at step 60
    after_step(self)
    timed = next(c for c in self.trainer.callbacks if isinstance(c, TimedCheckpoint))
    timed._last = -math.inf if self.trained == 20 else time.monotonic()
    if self.trained == 60:
        os.kill(os.getpid(), signal.SIGKILL)

module.SeqRegressor.after_step = step

def publish_then_outage(tracker, path, at):
    publish(tracker, path, at)
    published.append(at)
    if len(published) < int(os.environ["MEMBERS"]):
        return
    if "SERVER_PGID" in os.environ:  # the server and its workers stopped
        os.killpg(int(os.environ["SERVER_PGID"]), signal.SIGSTOP)
    else:  # the local store's delivery process killed
        for delivery in Delivery._running.values():
            os.kill(delivery.proc.pid, signal.SIGKILL)

points.publish_resume_point = publish_then_outage
train.publish_resume_point = publish_then_outage
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.parametrize("where", ["server-pack", "sqlite-run"])
def test_an_outage_then_kill_9_then_resume_stores_every_step_exactly_once(
    tmp_path, store, run_cli, where, request
):
    """Issue 33. server-pack: a pack of 4 on a tracking server that is stopped (SIGSTOP) after the
    pack's checkpoint at step 20. sqlite-run: a run alone on the local store whose delivery process
    is killed there. Either trains on to step 60 (two epochs' metrics into the journals) and is
    killed -9; then (the server continued) its resume delivers the journals first (or the orphaned
    helper has), trains on from step 20, and stores the steps it trains again once: every run has
    every step exactly once, those trained in the outage from the killed process's journal."""
    import os
    import time

    import mlflow
    from harness import zygote

    common = [a for a in KILLABLE if not a.startswith(("-m", "seed=", "pack="))]
    common += ["checkpoint.interval_s=3600", "logger.outage_wait_s=5"]
    env, server = {}, None
    if where == "server-pack":
        from seqlab.store.server import LocalServer

        server = LocalServer(
            f"sqlite:///{tmp_path}/server/mlflow.db", str(tmp_path / "server" / "art")
        ).start()
        args = ["-m", "seed=0,1,2,3", "pack=4", *common, "logger=mlflow_server"]
        args += [f"logger.tracking_uri={server.uri}"]
        env = {"SERVER_PGID": str(server.proc.pid), "MEMBERS": "4"}
        store = mlflow.MlflowClient(server.uri)
    else:
        args, env = [*common], {"MEMBERS": "1"}
    try:
        killed = zygote.run(
            [str(ROOT / "train.py"), *args, f"paths.root_dir={tmp_path}"],
            tmp_path,
            cli_env(env),
            timeout=300,
            code=OUTAGE_THEN_DIE,
        )
        assert killed.returncode == -signal.SIGKILL, (killed.stdout + killed.stderr)[-3000:]
        killed_ms = int(time.time() * 1000)
        if server is not None:
            os.killpg(server.proc.pid, signal.SIGCONT)

        def trained():  # the runs that train (a sweep's parent run does not)
            found = runs_of(store, "seqlab")
            return {r.info.run_id: r for r in found if server is None or "pack_id" in r.data.tags}

        runs = trained()
        assert len(runs) == (4 if server else 1)
        resume = "resume=latest" if server else f"resume={next(iter(runs))}"
        resumed = run_cli(*args, resume)
        out = resumed.stdout + resumed.stderr
        assert resumed.returncode == 0, out[-3000:]
        after = trained()
        assert after.keys() == runs.keys()  # the same runs, continued
        for run_id, run in after.items():
            assert run.info.status == "FINISHED", run.data.tags.get("failure_reason")
            history = store.get_metric_history(run_id, "train_loss")
            steps = sorted(m.step for m in history)
            assert steps == list(range(1, 4 * 26 + 1))  # every step once: none lost, none twice
            assert len(store.get_metric_history(run_id, "val_rmse")) == 4
            # Steps 21-52, trained in the outage, are the killed process's: from its journal (the
            # resume trained them again and did not store them twice).
            outage = [m for m in history if 21 <= m.step <= 52]
            assert len(outage) == 32 and all(m.timestamp < killed_ms for m in outage)
    finally:
        if server is not None:
            os.killpg(server.proc.pid, signal.SIGCONT)
            server.stop()


@pytest.mark.gpu
def test_a_pack_trains_on_the_gpu_and_each_member_is_a_run(run_cli, store):
    proc = run_cli(
        "-m", "seed=0,1", "optimizer.lr=0.001,0.003", "pack=4", "trainer.accelerator=gpu", *SMALL
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    members = [r for r in runs_of(store, "seqlab") if "pack_id" in r.data.tags]
    assert len(members) == 4 and {r.data.tags["accelerator"] for r in members} == {"gpu"}
    assert all(
        r.info.status == "FINISHED" and len(_losses(store, r.info.run_id)) == 104 for r in members
    )
    assert all(
        np.isfinite(r.data.metrics["final_val_rmse"])
        and r.data.metrics["pack_model_steps_per_s"] > 0
        for r in members
    )


# Issue 32: a member whose loss diverged keeps its status through the pack's checkpoint. Member 1
# (lr 1000) diverges within its first steps; the pack stops (Ctrl-C, or kill -9 right after a
# time-based checkpoint) at the end of the Lightning call that trains step {at}, well after. The stop
# is asked for from inside the step, so it lands where asked whatever the machine's speed.
STOP_AFTER_DIVERGENCE = """
import math, os, runpy, signal, sys, time
sys.argv.pop(0)
from seqlab import train
from seqlab.packing import module
from seqlab.resume import points
from seqlab.resume.checkpoints import TimedCheckpoint
how = "{how}"
after_step, publish = module.SeqRegressor.after_step, points.publish_resume_point
published = []

def step_then_stop(self):
    after_step(self)
    timed = next(c for c in self.trainer.callbacks if isinstance(c, TimedCheckpoint))
    if self.trained == {at} and how == "ctrl-c":
        os.kill(os.getpid(), signal.SIGINT)  # the pack stops after this call, with a checkpoint
    elif how == "kill":  # the time-based checkpoint comes due once step {at} is trained
        timed._last = -math.inf if self.trained >= {at} else time.monotonic()

def publish_then_die(tracker, path, step):
    publish(tracker, path, step)
    published.append(step)
    if how == "kill" and len(published) == 2:  # both members' runs have it, the failed one's too
        os.kill(os.getpid(), signal.SIGKILL)

module.SeqRegressor.after_step = step_then_stop
points.publish_resume_point = publish_then_die
train.publish_resume_point = publish_then_die  # the harness's process has imported it already
runpy.run_path(sys.argv[0], run_name="__main__")
"""
# Member 2 (lr 1e-9) learns nothing: module.validation_patience=2 stops it at epoch 3 (step 39), and
# its run ends FINISHED there, before the stop; the continued pack keeps it as it ended.
DIVERGING = [
    "-m",
    "optimizer=sgdm",
    "optimizer.lr=0.01,1000,1e-9",
    "pack=3",
    "module.validation_patience=2",
    *SMALL,
    "checkpoint.interval_s=1000",
]


@pytest.mark.parametrize("how", ["ctrl-c", "kill"])
def test_a_diverged_member_stays_failed_through_a_stop_and_resume_while_the_other_continues(
    tmp_path, store, run_cli, how
):
    from harness import zygote

    at = 40
    stopped = zygote.run(
        [str(ROOT / "train.py"), *DIVERGING, f"paths.root_dir={tmp_path}"],
        tmp_path,
        cli_env(),
        timeout=300,
        code=STOP_AFTER_DIVERGENCE.replace("{at}", str(at)).replace("{how}", how),
    )
    assert stopped.returncode == (-signal.SIGKILL if how == "kill" else 130), (
        stopped.stdout + stopped.stderr
    )[-3000:]
    before = {
        r.data.params["optimizer.lr"]: r
        for r in runs_of(store, "seqlab")
        if "pack_id" in r.data.tags
    }
    assert set(before) == {"0.01", "1000", "1e-09"}
    diverged_steps = len(_losses(store, before["1000"].info.run_id))
    early = before["1e-09"]
    assert (
        early.info.status == "FINISHED" and early.outputs.model_outputs
    )  # its run ended where it stopped
    assert len(_losses(store, early.info.run_id)) == 39 and early.data.metrics["final_val_rmse"] > 0

    resumed = run_cli(*DIVERGING, "resume=latest")
    out = resumed.stdout + resumed.stderr
    assert resumed.returncode == 1, out[-3000:]  # the sweep has a failed job
    assert "3 jobs, 1 failed" in out and "continues its 3 members from step" in out
    after = {
        r.data.params["optimizer.lr"]: r
        for r in runs_of(store, "seqlab")
        if "pack_id" in r.data.tags
    }
    # The same two runs: nothing trained anew.
    assert {k: r.info.run_id for k, r in after.items()} == {
        k: r.info.run_id for k, r in before.items()
    }
    diverged, fine = after["1000"], after["0.01"]
    assert diverged.info.status == "FAILED"
    assert "training diverged" in diverged.data.tags["failure_reason"]
    assert len(_losses(store, diverged.info.run_id)) == diverged_steps  # not trained again
    assert not diverged.outputs.model_outputs  # its NaN network is not logged
    assert fine.info.status == "FINISHED", fine.data.tags.get("failure_reason")
    steps = sorted(m.step for m in store.get_metric_history(fine.info.run_id, "train_loss"))
    assert steps == list(range(1, 105))  # continued from step 40: every step once
    assert fine.outputs.model_outputs
    # The member that stopped early kept its slot, frozen: its run as it ended, not reopened or trained again.
    stayed = after["1e-09"]
    assert stayed.info.status == "FINISHED" and stayed.info.end_time == early.info.end_time
    assert len(_losses(store, stayed.info.run_id)) == 39


def test_a_members_run_deleted_mid_pack_fails_that_member_only(run_cli, store, monkeypatch):
    """Issue 32: one member's own MLflow failure (its run deleted in the UI) ends that member FAILED
    with the reason; the pack's other members train on and finish."""
    from seqlab.packing import module

    after_step = module.SeqRegressor.after_step

    def step_then_delete(self):
        after_step(self)
        if self.trained == 30:
            m = self.members[1]
            m.tracker.client.delete_run(m.tracker.run_id)  # what the UI's Delete does

    monkeypatch.setattr(module.SeqRegressor, "after_step", step_then_delete)
    proc = run_cli(
        "-m",
        "seed=0,1",
        "pack=2",
        *SMALL,
        "logger.system_metrics=true",
        "logger.system_metrics_interval_s=0.1",
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    assert (
        "2 jobs, 1 failed" in out and "its MLflow run refused" in out and "the pack goes on" in out
    )
    kept = [
        r for r in runs_of(store, "seqlab") if "pack_id" in r.data.tags
    ]  # the deleted one is not listed
    (fine,) = kept
    assert fine.data.params["seed"] == "0" and fine.info.status == "FINISHED"
    assert len(_losses(store, fine.info.run_id)) == 104 and fine.outputs.model_outputs
    # The pack's process sampled into each member's run, as into a run alone (system/...).
    assert "system/cpu_utilization_percentage" in fine.data.metrics


def test_members_of_one_file_share_its_samples_and_each_trains_as_its_job_alone(
    run_cli, store, tmp_path, monkeypatch
):
    """Issue 32, point 4: members whose data differs only in its seed (one file, each its own split and
    order) hold the file's samples once on the device, and each member still trains as its job alone."""
    from seqlab.packing.data import PackData

    rng = np.random.default_rng(3)
    x = rng.normal(size=(512, 1, 32)).astype(np.float32)
    y = (x[:, 0, :4].sum(axis=1, keepdims=True) + 0.1 * rng.normal(size=(512, 1))).astype(
        np.float32
    )
    path = tmp_path / "load.npz"
    np.savez(path, X=x, y=y)
    built = []
    of = PackData.of.__func__
    monkeypatch.setattr(
        PackData,
        "of",
        classmethod(
            lambda cls, members, device: built.append(of(cls, members, device)) or built[-1]
        ),
    )
    own = [
        "data=npz",
        f"data.path={path}",
        "data.batch_size=32",
        "trainer.max_epochs=8",
        "logger.system_metrics=false",
    ]
    _, member, single, a, b = _packed_then_alone(run_cli, store, "0,1,2", "2", own)
    data, alone = built  # the pack's, then the job alone's (a pack of one)
    assert data.x.shape == alone.x.shape == (512, 32)  # the file's rows once, not 3 sets of them
    assert alone.train_rows.shape == (1, 410)
    assert (
        data.train_rows.shape == (3, 410) and len({tuple(r.tolist()) for r in data.train_rows}) == 3
    )  # 3 splits
    assert len(a) == len(b) == 8 * 13
    np.testing.assert_allclose(a[:100], b[:100], rtol=1e-4)
    assert [i.dataset.digest for i in member.inputs.dataset_inputs] == [
        i.dataset.digest for i in single.inputs.dataset_inputs
    ]


def test_members_of_1440_step_data_train_packed_each_as_its_job_alone(run_cli, store):
    """Issue 32, point 5: data of many steps a sample (data=daily_profile: 1440 one-minute readings as one
    univariate series) trains packed, each member's own LSTM inside the one step, and a member trains as
    its job alone."""
    small = [
        "data=daily_profile",
        "data.n_samples=80",
        "data.batch_size=16",
        "trainer.max_epochs=2",
        "model.hidden_size=8",
        "logger.system_metrics=false",
    ]
    packed, member, single, a, b = _packed_then_alone(run_cli, store, "0,1", "1", small)
    assert (
        "2 jobs as 1 launches: 1 pack(s) of 2 members" in packed.stdout
        and "train one by one" not in packed.stdout
    )
    assert len(a) == len(b) == 2 * 4  # 64 training samples in batches of 16, 2 epochs
    np.testing.assert_allclose(a, b, rtol=1e-4)
    assert member.data.metrics["final_val_rmse"] == pytest.approx(
        single.data.metrics["final_val_rmse"], rel=1e-3
    )


def test_a_pack_in_bf16_mixed_precision_trains_each_member_as_its_job_alone(run_cli, store):
    """Issue 32, point 5: mixed precision (Lightning's bf16-mixed autocast, through its optimizer wrapper)
    packs; a member's losses agree with its job alone's in bf16 as closely as bf16 allows (both run the
    same precision; the pack's batched products round differently from a run alone's)."""
    small = [
        *SMALL[:3],
        "trainer.max_epochs=2",
        "trainer.precision=bf16-mixed",
        "logger.system_metrics=false",
    ]
    packed, _, _, a, b = _packed_then_alone(run_cli, store, "0,1", "1", small)
    assert "1 pack(s) of 2 members" in packed.stdout
    assert len(a) == len(b) == 2 * 13
    np.testing.assert_allclose(a, b, rtol=1e-3)  # measured: at most 1.6e-4 here
