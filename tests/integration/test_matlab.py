"""MATLAB fidelity: the matlab_seed preset's settings, each checked numerically, and .mat files
in every supported layout and version loading to the same tensors."""

from __future__ import annotations

import pytest
from conftest import runs_of
from harness.independent import val_rmse_of_checkpoint
from harness.matfiles import MatCell, write_v73

from seqlab.data import synthetic_daily_load
from seqlab.train import train
from seqlab.validation import validate

# -- the preset ---------------------------------------------------------------------------------


def test_preset_sets_the_scripts_training_options_and_matlabs_implicit_defaults(compose_cfg):
    cfg = compose_cfg("experiment=matlab_seed")
    validate(cfg)
    assert cfg.optimizer._target_ == "torch.optim.Adam" and cfg.optimizer.lr == 1e-3
    assert list(cfg.optimizer.betas) == [0.9, 0.999] and cfg.optimizer.eps == 1e-8
    assert cfg.trainer.max_epochs == 200 and cfg.data.batch_size == 64
    assert cfg.data.shuffle and cfg.data.drop_last
    assert (cfg.scheduler.step_size, cfg.scheduler.gamma) == (96, 0.25)
    assert cfg.model.init == "matlab"
    m = cfg.module
    assert (
        m.loss,
        m.l2_regularization,
        m.gradient_threshold,
        m.gradient_threshold_method,
        m.bn_statistics,
    ) == ("half_mse", 1e-4, 1.0, "l2norm", "population")
    assert cfg.trainer.check_val_every_n_epoch is None and cfg.trainer.val_check_interval == 50


# -- end to end ----------------------------------------------------------------------------------


def test_preset_records_matlabs_per_iteration_info_with_validation_every_50(
    compose_cfg, store, tmp_path
):
    cfg = compose_cfg(
        "experiment=matlab_seed",
        "data.n_samples=2000",
        "data.val_fraction=0.2",
        "trainer.max_epochs=4",
    )
    result = train(cfg)
    (run,) = runs_of(store, "seqlab")
    history = lambda name: store.get_metric_history(run.info.run_id, name)  # noqa: E731
    # 1600 training samples, 64 a batch, last partial batch dropped: 25 iterations an epoch
    assert [m.step for m in history("train_loss")] == list(range(1, 101))
    assert len(history("train_rmse")) == 100
    assert all(m.value == pytest.approx(1e-3) for m in history("lr"))
    assert [m.step for m in history("val_rmse")] == [50, 100]
    assert [m.step for m in history("val_loss")] == [50, 100]
    # FinalValidation: the network as saved (after the BatchNorm population pass), scored here anew
    assert run.data.metrics["final_val_rmse"] == pytest.approx(
        val_rmse_of_checkpoint(cfg, tmp_path / "out" / "checkpoints" / "last.ckpt"), rel=1e-4
    )
    assert result.val_rmse == run.data.metrics["final_val_rmse"]


def test_matlab_seed_on_a_mat_file_through_the_cli(run_cli, store, tmp_path):
    path = tmp_path / "seed.mat"
    data = synthetic_daily_load(300, seed=1)
    write_v73(path, {"XrTrain": MatCell([day.T for day in data.x]), "YrTrain": data.y})
    proc = run_cli(
        "experiment=matlab_seed", "trainer.max_epochs=2", "data=mat", f"data.path={path}"
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (
        "XrTrain = 300x1 cell array of 1440x1 arrays -> N=300, 1440 feature(s), steps 1"
        in proc.stdout
    )
    assert "batchnorm population statistics" in proc.stdout
    (run,) = runs_of(store, "seqlab")
    assert run.info.status == "FINISHED"
    # 300 samples, 4 full batches of 64 an epoch, 2 epochs
    assert [m.step for m in store.get_metric_history(run.info.run_id, "train_loss")] == list(
        range(1, 9)
    )
    assert run.data.params["module.l2_regularization"] == "0.0001"
