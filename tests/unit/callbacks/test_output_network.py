"""module.output_network (MATLAB's OutputNetwork) and module.validation_patience
(ValidationPatience): which network a run ends with, and when it stops."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from conftest import runs_of
from pytorch_lightning.trainer.states import TrainerFn

from seqlab.callbacks.output_network import OutputNetwork
from seqlab.train import train


class _Trainer:
    """What the callback reads of a Lightning trainer, validation by validation."""

    def __init__(self) -> None:
        self.sanity_checking, self.should_stop = False, False
        self.state = SimpleNamespace(fn=TrainerFn.FITTING)
        self.callback_metrics, self.global_step, self.current_epoch = {}, 0, 0


def _validate(callback, trainer, module, values):
    """One validation per value, 10 steps and one epoch apart; the weights hold the validation's index."""
    for i, value in enumerate(values):
        trainer.global_step, trainer.current_epoch = 10 * (i + 1), i
        with torch.no_grad():
            module.model.weight.fill_(float(i))
        trainer.callback_metrics = {"val_rmse": torch.tensor(value)}
        callback.on_validation_end(trainer, module)
        if trainer.should_stop:
            return i
    return None


def test_best_keeps_the_lowest_validation_and_patience_counts_ties_as_no_better():
    module = SimpleNamespace(model=torch.nn.Linear(1, 1))
    callback, trainer = OutputNetwork(keep="best", patience=3), _Trainer()
    # new bests at validations 0, 1, 3; then 0.31, 0.3 (a tie is no better, as in MATLAB), 0.35
    stopped = _validate(callback, trainer, module, [0.5, 0.4, 0.45, 0.3, 0.31, 0.3, 0.35, 0.1])
    assert stopped == 6 and callback.stopped == {"step": 70, "epoch": 7}
    tags = callback.restore(module.model, trainer.global_step).tags()
    assert module.model.weight.item() == 3.0  # the weights of validation 3
    assert tags == {
        "output_network": "best",
        "output_network_step": "40",
        "output_network_epoch": "4",
        "stopped_early": "step 70 (epoch 7)",
    }


def test_last_keeps_the_last_weights_and_no_patience_never_stops():
    module = SimpleNamespace(model=torch.nn.Linear(1, 1))
    callback, trainer = OutputNetwork(keep="last"), _Trainer()
    assert _validate(callback, trainer, module, [0.5, 0.6, 0.7, 0.8, 0.9]) is None
    kept = callback.restore(module.model, 50)
    assert (
        kept.tags() == {"output_network": "last", "output_network_step": "50"}
        and kept.name == "last"
    )
    assert module.model.weight.item() == 4.0
    assert callback.value == pytest.approx(0.5)  # best_val_rmse is still tracked


def test_a_resumed_run_keeps_the_best_weights_and_the_count():
    module = SimpleNamespace(model=torch.nn.Linear(1, 1))
    first, trainer = OutputNetwork(keep="best", patience=2), _Trainer()
    _validate(first, trainer, module, [0.5, 0.4, 0.45])
    second = OutputNetwork(keep="best", patience=2)
    second.load_state_dict(first.state_dict())
    assert second.state_key == "BestValRmse"  # older checkpoints' best loads too
    # one more validation without a new best: the patience of 2 runs out
    trainer.callback_metrics = {"val_rmse": torch.tensor(0.41)}
    second.on_validation_end(trainer, module)
    assert trainer.should_stop
    second.restore(module.model, 30)
    assert module.model.weight.item() == 1.0


def test_best_without_validation_data_is_one_line_before_training(compose_cfg, store):
    from seqlab import SeqlabError

    cfg = compose_cfg("data.n_samples=128", "data.val_fraction=0", "module.output_network=best")
    with pytest.raises(
        SeqlabError, match=r"^module.output_network=best needs validation data.*val_fraction"
    ):
        train(cfg)
    (run,) = runs_of(store, "seqlab")
    assert run.info.status == "FAILED"
    assert store.get_metric_history(run.info.run_id, "train_loss") == []


def test_matlab_seed_maps_trainnetwork_defaults_and_bad_values_are_one_line(compose_cfg):
    from hydra.errors import ConfigCompositionException

    from seqlab.schema import ConfigError
    from seqlab.validation import bad_choice, validate

    m = compose_cfg("experiment=matlab_seed").module
    assert (m.output_network, m.validation_patience) == ("last", None)  # 'last-iteration', Inf
    # A choice: an Enum field, refused while composing; the CLI says so in one line first.
    assert (
        bad_choice(["module.output_network=best-validation"])
        == "module.output_network must be one of last, best; got 'best-validation'"
    )
    with pytest.raises(ConfigCompositionException) as caught:
        compose_cfg("module.output_network=best-validation")
    assert "expected one of [last, best]" in str(caught.value.__cause__)
    with pytest.raises(
        ConfigError, match=r"^module.validation_patience must be a positive integer"
    ):
        validate(compose_cfg("module.validation_patience=0"))
