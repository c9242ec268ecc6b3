"""training.perf.DirectFusedStep: torch's fused Adam and AdamW step without its per-step Python,
the same numbers to the bit."""

from __future__ import annotations

import pytest
import torch

from seqlab.model import CNNLSTM
from seqlab.training.loop import gradient_buffers
from seqlab.training.perf import DirectFusedStep


def _trained(make, direct: bool, steps: int = 30, reload_at: int | None = None):
    torch.manual_seed(0)
    net = CNNLSTM(n_features=12, n_outputs=1, filters=3, kernel_size=5, hidden_size=8)
    params = [p for p in net.parameters() if p.requires_grad]
    grads = gradient_buffers(params)
    optimizer = make(net.parameters())
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=7, gamma=0.5)
    step = DirectFusedStep(optimizer) if direct else optimizer.step
    data = torch.Generator().manual_seed(1)
    for i in range(steps):
        if i == reload_at:  # a resume: the optimizer's state replaced by a saved copy of itself
            optimizer.load_state_dict(optimizer.state_dict())
        torch._foreach_zero_(grads)
        x = torch.randn(16, 12, generator=data)
        net.forward_one_step(x).pow(2).mean().backward()
        step()
        scheduler.step()
    return net.state_dict(), optimizer.state_dict()["state"]


@pytest.mark.parametrize(
    "make",
    [
        lambda p: torch.optim.Adam(p, lr=1e-2, fused=True),
        lambda p: torch.optim.Adam(p, lr=1e-2, weight_decay=0.1, amsgrad=True, fused=True),
        lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1, fused=True),
    ],
    ids=["adam", "adam-decay-amsgrad", "adamw"],
)
@pytest.mark.parametrize("reload_at", [None, 11], ids=["straight", "reloaded"])
def test_the_direct_step_trains_to_the_bit_as_torchs_fused_step(make, reload_at):
    (want, want_state), (got, got_state) = (
        _trained(make, direct, reload_at=reload_at) for direct in (False, True)
    )
    assert all(torch.equal(want[key], got[key]) for key in want)
    for k, state in want_state.items():
        assert all(torch.equal(state[name], got_state[k][name]) for name in state)


def test_it_applies_to_fused_adam_alone():
    params = [torch.nn.Parameter(torch.zeros(3))]
    assert DirectFusedStep.applies(torch.optim.Adam(params, fused=True))
    assert not DirectFusedStep.applies(torch.optim.Adam(params, foreach=True))
    assert not DirectFusedStep.applies(torch.optim.SGD(params, lr=0.1))
