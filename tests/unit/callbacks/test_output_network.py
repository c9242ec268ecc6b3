"""module.output_network (MATLAB's OutputNetwork) and module.validation_patience
(ValidationPatience): which network a run ends with, and when it stops."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from conftest import runs_of
from omegaconf import OmegaConf
from pytorch_lightning.trainer.states import TrainerFn

from seqlab.callbacks.output_network import OutputNetwork
from seqlab.model import CNNLSTM
from seqlab.packing.members import Member
from seqlab.packing.model import OneMember, PackedCNNLSTM
from seqlab.packing.module import SeqRegressor
from seqlab.tracking.records import Stopped
from seqlab.train import train


class _Trainer:
    """What the callback reads of a Lightning trainer, validation by validation."""

    def __init__(self) -> None:
        self.sanity_checking, self.should_stop, self.is_global_zero = False, False, True
        self.state = SimpleNamespace(fn=TrainerFn.FITTING)
        self.current_epoch = 0


class _Run:
    """A member's run: what it was sent."""

    def __init__(self) -> None:
        self.logged: list[tuple[dict, int]] = []

    def log_metrics(self, metrics: dict, step: int) -> None:
        self.logged.append((dict(metrics), step))


class _Module:
    """What the callback reads of the job's module: a run alone's one member and its network."""

    members_stopped = SeqRegressor.members_stopped

    def __init__(self, keep: str) -> None:
        self.model = OneMember(torch.nn.Linear(1, 1))
        cfg = OmegaConf.create({"module": {"output_network": keep}})
        order = torch.Generator().manual_seed(0)
        self.members = [Member(0, cfg, job=None, tracker=_Run(), order=order)]
        self.val, self.trained = None, 0


def _validate(callback, trainer, module, values):
    """One validation per value, 10 steps and one epoch apart; the weights hold the validation's index."""
    for i, value in enumerate(values):
        module.trained, trainer.current_epoch = 10 * (i + 1), i
        with torch.no_grad():
            module.model.net.weight.fill_(float(i))
        module.val = {"rmse": [value]}
        callback.on_validation_end(trainer, module)
        if trainer.should_stop:
            return i
    return None


def _kept(module):
    """The network the member ends with put back (member_runs' end), and which it is."""
    (m,) = module.members
    weights, kept = m.kept(module.model.member(0), module.trained)
    module.model.load_member(0, weights)
    return kept


def test_best_keeps_the_lowest_validation_and_patience_counts_ties_as_no_better():
    module = _Module("best")
    callback, trainer = OutputNetwork(keep="best", patience=3), _Trainer()
    # new bests at validations 0, 1, 3; then 0.31, 0.3 (a tie is no better, as in MATLAB), 0.35
    stopped = _validate(callback, trainer, module, [0.5, 0.4, 0.45, 0.3, 0.31, 0.3, 0.35, 0.1])
    (m,) = module.members
    assert stopped == 6 and m.stopped == Stopped(step=70, epoch=7) and not m.active
    assert [step for _, step in m.tracker.logged] == [10, 20, 40]  # best_val_rmse at each new best
    tags = _kept(module).tags()
    assert module.model.net.weight.item() == 3.0  # the weights of validation 3
    assert tags == {
        "output_network": "best",
        "output_network_step": "40",
        "output_network_epoch": "4",
        "stopped_early": "step 70 (epoch 7)",
    }


def test_last_keeps_the_last_weights_and_no_patience_never_stops():
    module = _Module("last")
    callback, trainer = OutputNetwork(keep="last"), _Trainer()
    assert _validate(callback, trainer, module, [0.5, 0.6, 0.7, 0.8, 0.9]) is None
    kept = _kept(module)
    assert (
        kept.tags() == {"output_network": "last", "output_network_step": "50"}
        and kept.name == "last"
    )
    assert module.model.net.weight.item() == 4.0
    assert module.members[0].record.value == pytest.approx(0.5)  # best_val_rmse is still tracked


def test_a_resumed_run_keeps_the_best_weights_and_the_count():
    first, trainer = _Module("best"), _Trainer()
    _validate(OutputNetwork(keep="best", patience=2), trainer, first, [0.5, 0.4, 0.45])
    second = _Module("best")  # the job started again, its member from the checkpoint
    second.members[0].load_state(first.members[0].state())
    # one more validation without a new best: the patience of 2 runs out
    second.trained, second.val = 40, {"rmse": [0.41]}
    OutputNetwork(keep="best", patience=2).on_validation_end(trainer, second)
    assert trainer.should_stop
    _kept(second)
    assert second.model.net.weight.item() == 1.0


def test_a_pack_member_out_of_patience_stops_while_the_others_train():
    """Member by member: one member's patience runs out, the other trains on, and the job stops only
    once none trains."""
    module = _Module("last")
    module.model = PackedCNNLSTM([CNNLSTM(3), CNNLSTM(3)])
    order = torch.Generator().manual_seed(0)
    module.members.append(Member(1, module.members[0].cfg, job=None, tracker=_Run(), order=order))
    callback, trainer = OutputNetwork(keep="last", patience=1), _Trainer()
    for i, (a, b) in enumerate([(0.5, 0.5), (0.6, 0.4), (0.7, 0.3), (0.8, 0.35)]):
        module.trained, trainer.current_epoch, module.val = 10 * (i + 1), i, {"rmse": [a, b]}
        callback.on_validation_end(trainer, module)
        if i == 1:
            assert not module.members[0].active and module.members[1].active
            assert module.members[0].final_step == 20 and not trainer.should_stop
    assert module.members[1].stopped == Stopped(step=40, epoch=4) and trainer.should_stop


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
