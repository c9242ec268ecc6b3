"""packing.optim.build_update: the optimizer over a network of K members' tensors, and which of
them it trains at all."""

from __future__ import annotations

import pytest
from hydra.utils import instantiate

from seqlab.packing.model import PackedCNNLSTM
from seqlab.packing.optim import build_update


@pytest.mark.parametrize(
    "overrides,one_step,frozen",
    [
        ([], True, True),
        ([], False, False),  # more steps a sample: every tap of the convolution takes part
        (["module.l2_regularization=0.001"], True, False),  # MATLAB's L2 moves the other taps
        (["optimizer=adamw"], True, False),  # so does weight decay
        (["optimizer.weight_decay=0.01"], True, False),
    ],
    ids=["one-step", "more-steps", "l2", "adamw", "weight-decay"],
)
def test_weights_one_step_leaves_unused_leave_the_optimizer_only_where_nothing_moves_them(
    compose_cfg, overrides, one_step, frozen
):
    cfgs = [compose_cfg(f"optimizer.lr={lr}", *overrides) for lr in (1e-3, 3e-3)]
    networks = [instantiate(cfg.model, n_features=12, n_outputs=1) for cfg in cfgs]
    model = PackedCNNLSTM(networks)
    update = build_update(
        model,
        networks=networks,
        optimizers=[instantiate(cfg.optimizer) for cfg in cfgs],
        scheduler=None,
        l2=[cfg.module.l2_regularization for cfg in cfgs],
        threshold=[None, None],
        method="l2norm",
        one_step=one_step,
    )
    stepped = {id(p) for group in update.optimizer.param_groups for p in group["params"]}
    # one step from a zero state: the LSTM's recurrent weights get no gradient either
    assert (id(model.conv_sides) not in stepped) is frozen
    assert (id(model.lstm_weight_hh) not in stepped) is frozen
    assert id(model.conv_centre) in stepped
    assert update.lr_scale == pytest.approx([1e-3, 3e-3])
