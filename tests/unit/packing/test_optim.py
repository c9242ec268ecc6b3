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


@pytest.mark.parametrize("name", ["adam", "adamw", "sgdm", "rmsprop"])
def test_a_restarted_member_steps_as_a_fresh_optimizer_while_the_other_goes_on(compose_cfg, name):
    """hydra.sweeper.refill (issue 36, point 4): member 1 of a pack is replaced after 7 steps by a
    new network at another rate (packing.refill.take_slot): restart gives it a fresh optimizer's
    state (moments, momentum, Adam's bias corrections from its own first step), while member 0
    keeps its own. Each against its network trained alone with torch's optimizer, 15 steps."""
    import torch

    from seqlab.packing.optim import packed_optimizer

    cfg = compose_cfg(f"optimizer={name}")
    torch.manual_seed(0)
    nets = [torch.nn.Linear(6, 2) for _ in range(3)]  # member 0, member 1, then its replacement
    alone = [torch.nn.Linear(6, 2) for _ in range(3)]
    for net, copy in zip(nets, alone):
        copy.load_state_dict(net.state_dict())
    lrs = [1e-2, 3e-2, 5e-3]
    x, y = torch.randn(15, 4, 6), torch.randn(15, 4, 2)

    def loss(w, b, i):
        return ((x[i] @ w.T + b - y[i]) ** 2).sum()

    # Alone: member 0 for 15 steps; the replacement for the last 8, from its first.
    expected = []
    for net, lr, steps in ((alone[0], lrs[0], range(15)), (alone[2], lrs[2], range(7, 15))):
        optimizer = instantiate(cfg.optimizer)(params=net.parameters(), lr=lr)
        for i in steps:
            optimizer.zero_grad()
            loss(net.weight, net.bias, i).backward()
            optimizer.step()
        expected.append(net)

    # Packed: weights (2, 2, 6) and biases (2, 2), member k's slice its network's.
    w = torch.nn.Parameter(torch.stack([nets[0].weight.detach(), nets[1].weight.detach()]))
    b = torch.nn.Parameter(torch.stack([nets[0].bias.detach(), nets[1].bias.detach()]))
    own = [instantiate(cfg.optimizer)(params=nets[k].parameters(), lr=lrs[k]) for k in (0, 1)]
    optimizer = packed_optimizer(own, [w, b])
    for i in range(15):
        if i == 7:  # member 1's slot to the replacement
            with torch.no_grad():
                w[1].copy_(nets[2].weight)
                b[1].copy_(nets[2].bias)
            optimizer.restart(1, lrs[2])
        optimizer.zero_grad()
        (loss(w[0], b[0], i) + loss(w[1], b[1], i)).backward()
        optimizer.step()
    for k, net in enumerate(expected):
        torch.testing.assert_close(w[k].detach(), net.weight.detach(), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(b[k].detach(), net.bias.detach(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "overrides",
    [["optimizer=adam"], ["optimizer=adam", "optimizer.weight_decay=0.1"], ["optimizer=adamw"]],
    ids=["adam", "adam-weight-decay", "adamw"],
)
def test_a_packed_adam_over_one_buffer_steps_each_member_as_its_own_through_a_checkpoint(
    compose_cfg, overrides
):
    """PackedAdam moves the parameters, gradients and moments into one buffer each (FlatState)
    and re-points the tensors at it: the gradient list the fused loop took before the first step
    (zeroed in place, the backward adding into it) still is each parameter's gradient, and an
    gradients made anew (step 3) and an optimizer state loaded from a checkpoint (new tensors) are
    bound again: steps 6-8 trained, then undone by resuming from the checkpoint at 6. Each member against its network alone with
    torch's optimizer at its own rate, 12 steps."""
    import copy

    import torch

    from seqlab.packing.optim import packed_optimizer
    from seqlab.training.loop import gradient_buffers

    cfg = compose_cfg(*overrides)
    torch.manual_seed(0)
    nets = [torch.nn.Linear(6, 2) for _ in range(2)]
    lrs = [1e-2, 4e-2]
    x, y = torch.randn(12, 4, 6), torch.randn(12, 4, 2)

    def loss(w, b, i):
        return ((x[i] @ w.T + b - y[i]) ** 2).sum()

    w = torch.nn.Parameter(torch.stack([n.weight.detach() for n in nets]))
    b = torch.nn.Parameter(torch.stack([n.bias.detach() for n in nets]))
    own = [instantiate(cfg.optimizer)(params=n.parameters(), lr=lr) for n, lr in zip(nets, lrs)]
    optimizer = packed_optimizer(own, [w, b])
    grads = [torch.zeros_like(w), torch.zeros_like(b)]
    w.grad, b.grad = grads  # as the fused loop holds them (training.loop.gradient_buffers)
    for n, opt in zip(nets, own):  # alone: 12 steps
        for i in range(12):
            opt.zero_grad()
            loss(n.weight, n.bias, i).backward()
            opt.step()
    i, saved = 0, None
    while i < 12:
        if i == 6 and saved is None:  # a checkpoint: weights and optimizer state
            saved = (w.detach().clone(), b.detach().clone(), copy.deepcopy(optimizer.state_dict()))
        if i == 9 and saved[0] is not None:  # stopped, resumed from it into the same objects
            with torch.no_grad():  # as Lightning loads them: in place, and the state anew
                w.copy_(saved[0])
                b.copy_(saved[1])
            optimizer.load_state_dict(saved[2])
            i, saved = 6, (None, None, None)
        if i == 3:  # the gradients freed and made anew (Lightning may, around a validation)
            w.grad = b.grad = None
            grads = gradient_buffers([w, b])
        torch._foreach_zero_(grads)
        (loss(w[0], b[0], i) + loss(w[1], b[1], i)).backward()
        optimizer.step()
        i += 1
    assert w.grad is grads[0] and b.grad is grads[1]
    assert w.grad.untyped_storage().data_ptr() == b.grad.untyped_storage().data_ptr()  # one buffer
    for k, net in enumerate(nets):
        torch.testing.assert_close(w[k].detach(), net.weight.detach(), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(b[k].detach(), net.bias.detach(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_a_packed_adams_step_reads_nothing_back_from_the_device(compose_cfg, monkeypatch, device):
    """The fused loop never waits for a GPU (training.loop), so neither may PackedAdam's step:
    whether a member restarted is asked of member_start once after it changed (a restart, a
    checkpoint's state loaded), not at every step. On a CPU every read-back of a tensor's value
    (bool, item, tolist) is counted; on a GPU, CUDA's sync debug mode raises at one."""
    import torch

    from seqlab.packing.optim import packed_optimizer

    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    cfg = compose_cfg("optimizer=adam")
    w = torch.nn.Parameter(torch.randn(2, 3, 4, device=device))
    own = [
        instantiate(cfg.optimizer)(params=[torch.nn.Parameter(w[k].detach())], lr=lr)
        for k, lr in enumerate((1e-2, 3e-2))
    ]
    optimizer = packed_optimizer(own, [w])
    w.grad = torch.ones_like(w)
    reads = []
    for name in ("__bool__", "item", "tolist"):
        real = getattr(torch.Tensor, name)
        monkeypatch.setattr(
            torch.Tensor,
            name,
            lambda self, *a, _real=real, _name=name: reads.append(_name) or _real(self, *a),
        )

    def steps(n: int) -> list[str]:
        reads.clear()
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
        try:
            for _ in range(n):
                optimizer.step()
        finally:
            if device == "cuda":
                torch.cuda.set_sync_debug_mode("default")
        return list(reads)

    optimizer.step()  # the first: the state made
    assert steps(3) == []
    before = w.detach().clone()
    optimizer.restart(1, 5e-3)  # member 1 a fresh optimizer's: its first step is its rate
    w.grad.fill_(-2.0)  # a turn: member 0's moments, four steps old, still lean the other way
    optimizer.step()  # the restart found (once)
    moved = w.detach() - before
    torch.testing.assert_close(moved[1], torch.full_like(moved[1], 5e-3), rtol=1e-4, atol=0)
    assert moved[0].abs().max().item() < 1e-2 / 2  # not its first step's full rate
    assert steps(3) == []
    optimizer.load_state_dict(optimizer.state_dict())
    optimizer.step()  # once after a checkpoint's state
    assert steps(3) == []
