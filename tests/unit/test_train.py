"""Real training through the task function, asserting what lands in MLflow."""

from __future__ import annotations

import pytest
import torch
from conftest import TINY, runs_of
from hydra.errors import ConfigCompositionException

from seqlab import SeqlabError
from seqlab.train import train


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only case")
def test_gpu_without_cuda_fails_the_run_with_the_reason(compose_cfg, store):
    cfg = compose_cfg(*TINY, "trainer.accelerator=gpu")
    with pytest.raises(SeqlabError, match="trainer.accelerator=gpu asked for a CUDA GPU"):
        train(cfg)
    (run,) = runs_of(store, "seqlab")
    assert run.info.status == "FAILED"
    assert run.info.run_name == "gpu-bs64"
    assert "asked for a CUDA GPU" in run.data.tags["failure_reason"]
    assert run.data.params["trainer.accelerator"] == "gpu"  # the config is recorded even so


def test_bad_config_makes_no_run_and_an_error_in_the_task_ends_it_failed(compose_cfg, store):
    with pytest.raises(ConfigCompositionException) as caught:
        train(compose_cfg(*TINY, "model.init=bogus"))  # refused before any run exists
    assert "expected one of [pytorch, matlab]" in str(caught.value.__cause__)
    assert store.get_experiment_by_name("seqlab") is None

    cfg = compose_cfg(*TINY, "+trainer.extra.not_a_trainer_argument=1")
    with pytest.raises(TypeError, match="not_a_trainer_argument"):
        train(cfg)  # an unexpected error, raised after the run was opened
    (run,) = runs_of(store, "seqlab")
    assert run.info.status == "FAILED"
    assert "not_a_trainer_argument" in run.data.tags["failure_reason"]


def test_a_file_that_does_not_load_ends_the_run_failed(compose_cfg, store, tmp_path):
    import numpy as np

    np.savez(tmp_path / "missing_keys.npz", inputs=np.ones((4, 2)))
    cfg = compose_cfg("data=npz", f"data.path={tmp_path / 'missing_keys.npz'}")
    with pytest.raises(SeqlabError, match="no array named X"):
        train(cfg)
    (run,) = runs_of(store, "seqlab")
    assert run.info.status == "FAILED" and "no array named X" in run.data.tags["failure_reason"]


@pytest.mark.gpu
def test_trains_on_a_gpu(compose_cfg, store):
    cfg = compose_cfg(*TINY, "trainer.accelerator=gpu")
    result = train(cfg)
    (run,) = runs_of(store, "seqlab")
    assert run.info.status == "FINISHED" and run.data.tags["accelerator"] == "gpu"
    assert run.data.tags["device_name"] == torch.cuda.get_device_name(0)
    assert result.it_per_s > 0
