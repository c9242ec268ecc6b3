"""Real training through the task function, asserting what lands in MLflow."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import TINY, artifact_paths, runs_of
from harness.independent import baseline_rmse, val_rmse_of_checkpoint
from matplotlib.image import imread

from seqlab.benchmark.overhead import RUN_PHASES
from seqlab.train import train


def test_a_run_records_params_metrics_tags_and_artifacts(compose_cfg, store, tmp_path):
    cfg = compose_cfg(*TINY, "data.batch_size=32", "logger.flush_every_n_steps=5")
    result = train(cfg)

    (run,) = runs_of(store, "seqlab")
    assert run.info.status == "FINISHED" and run.info.run_id == result.run_id
    assert run.info.run_name == "cpu-bs32"
    params = run.data.params
    assert params["data.batch_size"] == "32"
    assert params["trainer.accelerator"] == "auto"
    assert params["optimizer._target_"] == "torch.optim.Adam"
    assert params["model.hidden_size"] == "24"

    # 205 training samples in batches of 32 -> 7 steps an epoch, 2 epochs
    steps = [m.step for m in store.get_metric_history(run.info.run_id, "train_loss")]
    assert steps == list(range(1, 15))
    assert len(store.get_metric_history(run.info.run_id, "lr")) == 14
    for name in (
        "val_loss",
        "val_rmse",
        "val_mae",
        "val_r2",
        "epoch_time_s",
        "it_per_s",
        "samples_per_s",
    ):
        history = store.get_metric_history(run.info.run_id, name)
        assert [m.step for m in history] == [7, 14], name
    epoch_s = store.get_metric_history(run.info.run_id, "epoch_time_s")
    it_per_s = store.get_metric_history(run.info.run_id, "it_per_s")
    samples = store.get_metric_history(run.info.run_id, "samples_per_s")
    # 7 steps and 205 samples an epoch: the rates count what the epoch really trained on
    assert samples[1].value / it_per_s[1].value == pytest.approx(205 / 7)
    assert it_per_s[1].value * epoch_s[1].value == pytest.approx(7)
    # The last validation and the final evaluation score the same network (no BatchNorm
    # finalisation here), and that network's RMSE, recomputed from its checkpoint, is the one recorded.
    assert run.data.metrics["val_rmse"] == pytest.approx(
        run.data.metrics["final_val_rmse"], rel=1e-5
    )
    assert run.data.metrics["final_val_rmse"] == pytest.approx(
        val_rmse_of_checkpoint(cfg, tmp_path / "out" / "checkpoints" / "last.ckpt"), rel=1e-4
    )
    assert result.val_rmse == run.data.metrics["final_val_rmse"]

    tags = run.data.tags
    assert tags["accelerator"] == "cpu" and tags["device_name"]
    assert tags["torch_version"] == torch.__version__
    assert tags["cuda_version"] == (torch.version.cuda or "none")
    assert tags["host"]

    files = artifact_paths(store, run.info.run_id)
    assert {"config.yaml", "checkpoints/last.ckpt", "training_curves.png"} <= files
    local = tmp_path / "downloaded"
    local.mkdir()
    png = store.download_artifacts(run.info.run_id, "training_curves.png", str(local))
    assert imread(png).shape[0] > 100
    config = store.download_artifacts(run.info.run_id, "config.yaml", str(local))
    assert "batch_size: 32" in open(config).read()
    ckpt = torch.load(tmp_path / "out" / "checkpoints" / "last.ckpt", weights_only=False)
    assert ckpt["global_step"] == 14

    # What its bookkeeping cost, phase by phase, beside its files (issue 35: benchmark.py --overhead).
    spent = json.loads((tmp_path / "out" / "costs.json").read_text())
    assert set(spent["run"]) == set(RUN_PHASES)
    assert all(s >= 0 for s in spent["run"].values()) and spent["run"]["models"] > 0
    assert spent["training_s"] == pytest.approx(run.data.metrics["train_wall_s"])
    assert spent["process"]["data and networks"] > 0 and spent["job"] is None


def test_training_beats_predicting_the_mean(compose_cfg, store):
    cfg = compose_cfg("data.n_samples=4096", "trainer.max_epochs=8")
    result = train(cfg)
    assert result.val_rmse_baseline > 0.2
    assert result.val_rmse < 0.6 * result.val_rmse_baseline
    (run,) = runs_of(store, "seqlab")
    expected = baseline_rmse(cfg)  # the validation targets around the training mean, computed here
    assert run.data.metrics["val_rmse_baseline"] == pytest.approx(expected, rel=1e-6)
    assert result.val_rmse_baseline == pytest.approx(expected, rel=1e-6)


def test_schedule_and_optimizer_come_from_their_groups(compose_cfg, store):
    cfg = compose_cfg(
        *TINY, "optimizer=sgdm", "optimizer.lr=0.05", "scheduler.step_size=1", "scheduler.gamma=0.5"
    )
    train(cfg)
    (run,) = runs_of(store, "seqlab")
    lrs = {m.step: m.value for m in store.get_metric_history(run.info.run_id, "lr")}
    assert lrs[1] == pytest.approx(0.05) and lrs[4] == pytest.approx(0.05)
    assert lrs[5] == pytest.approx(0.025)  # second epoch, after one drop
    assert run.info.run_name == "cpu-bs64"


def test_daily_profile_trains(compose_cfg, store):
    cfg = compose_cfg(
        "data=daily_profile", "data.n_samples=40", "trainer.max_epochs=1", "data.batch_size=16"
    )
    result = train(cfg)
    assert result.status == "FINISHED"
    (run,) = runs_of(store, "seqlab")
    assert run.data.params["data.source.layout"] == "profile"


@pytest.mark.parametrize("loss", ["half_mse", "mse"])
def test_per_step_rmse_agrees_with_the_epochs_torchmetrics_rmse(compose_cfg, store, loss):
    """train_rmse per step comes from the loss value; train_rmse_epoch from torchmetrics over the
    same predictions. Squared and weighted by batch size, the steps must give the epoch."""
    cfg = compose_cfg(
        "data.n_samples=320", "trainer.max_epochs=1", "data.batch_size=64", f"module.loss={loss}"
    )
    train(cfg)
    (run,) = runs_of(store, "seqlab")
    steps = store.get_metric_history(run.info.run_id, "train_rmse")
    assert len(steps) == 4  # 256 training samples, 4 full batches
    from_steps = (sum(m.value**2 for m in steps) / len(steps)) ** 0.5
    assert from_steps == pytest.approx(run.data.metrics["train_rmse_epoch"], rel=1e-4)


def test_epoch_time_leaves_validation_out(compose_cfg, store, monkeypatch):
    """On a fake clock that only training and validation steps move: each training call takes
    1 s, each validation batch 100 s. The epochs' times hold exactly the training seconds."""
    from seqlab.callbacks import timing
    from seqlab.packing.module import SeqRegressor

    clock = {"now": 0.0, "train_calls": 0}

    def advance(seconds):
        clock["now"] += seconds

    class FakeClockTimer(timing.EpochTimer):
        def __init__(self):
            super().__init__(clock=lambda: clock["now"])

    training_step, validation_step = SeqRegressor.training_step, SeqRegressor.validation_step

    def timed_training_step(self, batch, batch_idx):
        clock["train_calls"] += 1
        advance(1.0)
        return training_step(self, batch, batch_idx)

    def timed_validation_step(self, batch, batch_idx):
        advance(100.0)
        return validation_step(self, batch, batch_idx)

    monkeypatch.setattr(timing, "EpochTimer", FakeClockTimer)
    monkeypatch.setattr(SeqRegressor, "training_step", timed_training_step)
    monkeypatch.setattr(SeqRegressor, "validation_step", timed_validation_step)
    train(compose_cfg(*TINY, "perf.steps_per_call=2"))  # 4 steps an epoch: 2 training calls
    (run,) = runs_of(store, "seqlab")
    history = lambda name: [m.value for m in store.get_metric_history(run.info.run_id, name)]  # noqa: E731
    assert (
        clock["train_calls"] == 4 and clock["now"] >= 4 + 2 * 100
    )  # both kinds of step ran on the clock
    assert history("epoch_time_s") == [2.0, 2.0]  # the validations' 100 s are in neither
    assert history("it_per_s") == [2.0, 2.0]  # 4 steps in 2 s


def test_tiny_data_edge_cases_train(compose_cfg, store):
    """A last batch of one sample (BatchNorm cannot train on it) is dropped; a validation set
    is never a single sample (R2 needs two)."""
    result = train(
        compose_cfg(
            "data.n_samples=11",
            "data.val_fraction=0.1",
            "data.batch_size=4",
            "trainer.max_epochs=1",
        )
    )
    assert result.status == "FINISHED"
    (run,) = runs_of(store, "seqlab")
    # 11 samples -> 2 validation, 9 training: batches of 4, 4 and a dropped 1
    assert len(store.get_metric_history(run.info.run_id, "train_loss")) == 2
    assert "final_val_r2" in run.data.metrics


def test_logger_run_name_names_the_run_everywhere(compose_cfg, store):
    result = train(compose_cfg(*TINY, "logger.run_name=my-baseline"))
    (run,) = runs_of(store, "seqlab")
    assert run.info.run_name == "my-baseline" == result.run_name


def test_every_metric_and_tag_the_readme_lists_is_recorded(compose_cfg, store, tmp_path):
    """docs/models.md, 'What each run records': the names a user looks for in the UI, with the values
    that can be derived from others checked against them. The project root here is a git
    repository of its own, so git_commit has a known value."""
    import subprocess

    def git(*args):
        return subprocess.run(
            ["git", "-C", str(tmp_path), *args], check=True, capture_output=True, text=True
        )

    git("init", "-q")
    git(
        "-c",
        "user.name=t",
        "-c",
        "user.email=t@example.com",
        "commit",
        "-q",
        "--allow-empty",
        "-m",
        "x",
    )
    head = git("rev-parse", "HEAD").stdout.strip()
    train(
        compose_cfg(*TINY, "trainer.max_epochs=3", "data.batch_size=32", "metrics.target_rmse=1000")
    )
    (run,) = runs_of(store, "seqlab")
    history = lambda name: store.get_metric_history(run.info.run_id, name)  # noqa: E731
    for name in (
        "train_rmse_epoch",
        "train_mae_epoch",
        "train_r2_epoch",
        "val_loss",
        "val_mae",
        "val_r2",
    ):
        assert [m.step for m in history(name)] == [7, 14, 21], name  # 7 steps an epoch
    m = run.data.metrics
    for name in (
        "final_val_rmse",
        "final_val_loss",
        "final_val_mae",
        "final_val_r2",
        "train_wall_s",
        "best_val_rmse",
        "best_val_rmse_step",
        "best_val_rmse_epoch",
    ):
        assert name in m, name
    # medians over the epochs after the first: of epochs 2 and 3
    for key in ("it_per_s", "samples_per_s"):
        later = [x.value for x in history(key)][1:]
        assert len(later) == 2 and m[f"{key}_median"] == pytest.approx(sum(later) / 2), key
    # a target any network reaches: at the first validation
    assert (m["steps_to_target"], m["epochs_to_target"]) == (7, 1)
    assert m["time_to_target_s"] == pytest.approx(history("epoch_time_s")[0].value)
    tags = run.data.tags
    assert tags["git_commit"] == tags["mlflow.source.git.commit"] == head
    assert tags["target_rmse"] == "1000.0" and tags["target_reached"] == "true"
    assert tags["accelerator_requested"] == "auto" and tags["data"] == "synthetic"
    import mlflow
    import pytorch_lightning

    assert (
        tags["lightning_version"] == pytorch_lightning.__version__
        and tags["mlflow_version"] == mlflow.__version__
    )
    assert tags["hydra_overrides"] == ""  # composed in-process: no command line
    assert tags["torch_threads"] == str(torch.get_num_threads())


def test_perf_threads_is_the_runs_thread_count_and_the_process_gets_its_own_back(
    compose_cfg, store
):
    # Two commands at once on one machine: each given its share of the cores (docs/performance.md).
    before = torch.get_num_threads()
    train(compose_cfg(*TINY, "perf.threads=1", "logger.system_metrics=false"))
    (run,) = runs_of(store, "seqlab")
    assert run.info.status == "FINISHED"
    assert run.data.tags["torch_threads"] == "1"
    assert torch.get_num_threads() == before  # a notebook's next run starts from torch's own


@pytest.mark.parametrize("on", [False, True], ids=["off", "on"])
def test_logger_system_metrics_switches_the_system_metrics(compose_cfg, store, on):
    train(
        compose_cfg(
            *TINY,
            f"logger.system_metrics={str(on).lower()}",
            "logger.system_metrics_interval_s=0.1",
            "trainer.max_epochs=4",
        )
    )
    (run,) = runs_of(store, "seqlab")
    system = {k for k in run.data.metrics if k.startswith("system/")}
    assert ("system/cpu_utilization_percentage" in system) is on and bool(system) is on
