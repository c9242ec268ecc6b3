"""packing.task.packed_update: the pack's optimizer over its packed tensors, and which of them it
trains at all."""

from __future__ import annotations

import pytest
from hydra.utils import instantiate

from seqlab.packing.members import Member
from seqlab.packing.model import PackedCNNLSTM
from seqlab.packing.task import packed_update


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
    members = []
    for k, lr in enumerate([1e-3, 3e-3]):
        cfg = compose_cfg(f"optimizer.lr={lr}", *overrides)
        net = instantiate(cfg.model, n_features=12, n_outputs=1)
        members.append(Member(k, cfg, None, network=net))
    model = PackedCNNLSTM([m.network for m in members])
    optimizer, _, _, lr_scale = packed_update(members[0].cfg, members, model, one_step)
    stepped = {id(p) for group in optimizer.param_groups for p in group["params"]}
    # one step from a zero state: the LSTM's recurrent weights get no gradient either
    assert (id(model.conv_sides) not in stepped) is frozen
    assert (id(model.lstm_weight_hh) not in stepped) is frozen
    assert id(model.conv_centre) in stepped
    assert lr_scale.tolist() == pytest.approx([1e-3, 3e-3])
