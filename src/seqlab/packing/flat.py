"""A packed optimizer's tensors in one buffer of each kind (PackedAdam's update, packing.optim): each
operation of a step once over all the parameters rather than once per tensor."""

from __future__ import annotations

from typing import Optional

import torch


class FlatState:
    """An optimizer's tensors of each kind (parameters, gradients, first and second moments) moved
    into one buffer a kind, every tensor object kept and re-pointed at its part of the buffer
    (Tensor.set_): the model, the fused loop's gradient list, autograd (which adds into a
    parameter's .grad in place) and a checkpoint hold the same objects, now views of it. An update
    then runs each operation once over a buffer. `rate`: each element's member's learning rate."""

    def __init__(
        self,
        tensors: tuple[list[torch.Tensor], ...],
        buffers: list[torch.Tensor],
        member_lr: torch.Tensor,
    ) -> None:
        self.tensors = [t for kind in tensors for t in kind]
        self.pointers = [t.data_ptr() for t in self.tensors]
        self.param, self.grad, self.exp_avg, self.exp_avg_sq = buffers
        self.member_sizes = [p[0].numel() for p in tensors[0]]  # a member's part of each parameter
        self.member_lr, self.lr_version = member_lr, member_lr._version
        self.rate = self.spread(member_lr)
        self.start: Optional[tuple[torch.Tensor, int, bool]] = None  # restarted()'s last answer
        self._scratch: Optional[tuple[torch.Tensor, torch.Tensor]] = None

    @classmethod
    @torch.no_grad()
    def bind(cls, tensors: tuple[list[torch.Tensor], ...], member_lr: torch.Tensor) -> "FlatState":
        """Each kind's tensors copied into a new buffer, in order, and re-pointed at it."""
        first = tensors[0][0]
        if any(t.dtype != first.dtype or t.device != first.device for ts in tensors for t in ts):
            raise ValueError("a packed optimizer's tensors must share one type and one device")
        size = sum(t.numel() for t in tensors[0])
        buffers = []
        for kind in tensors:
            buffer = torch.empty(size, dtype=first.dtype, device=first.device)
            at = 0
            for t in kind:
                n = t.numel()
                buffer[at : at + n].copy_(t.reshape(-1))
                t.set_(buffer.untyped_storage(), at, t.size())
                at += n
            buffers.append(buffer)
        return cls(tensors, buffers, member_lr)

    @torch.no_grad()
    def adam_direction(
        self, grad: torch.Tensor, step: int, beta1: float, beta2: float, eps: float
    ) -> torch.Tensor:
        """torch's fused Adam kernel (the one a run alone steps with: training.perf) at rate 1 over
        the buffers, into a zeroed buffer of its own rather than the parameters: it updates both
        moments and leaves -m_hat / (sqrt(v_hat) + eps) there, for each member to take at its own
        rate (PackedAdam). One pass over the buffers where torch's operations make seven: on the
        seed's network at K = 32, 71 us a step alone against 126-171 (AMD EPYC, 2 cores)."""
        if self._scratch is None:
            # The direction's buffer, and the step count as the kernel takes it (a 0-dim tensor).
            self._scratch = (torch.empty_like(self.param), self.param.new_zeros(()))
        direction, steps = self._scratch
        direction.zero_()
        steps.fill_(step)
        torch._fused_adam_(
            [direction],
            [grad],
            [self.exp_avg],
            [self.exp_avg_sq],
            [],
            [steps],
            amsgrad=False,
            lr=1.0,
            beta1=float(beta1),
            beta2=float(beta2),
            weight_decay=0.0,
            eps=eps,
            maximize=False,
            grad_scale=None,
            found_inf=None,
        )
        return direction

    def spread(self, per_member: torch.Tensor) -> torch.Tensor:
        """A (K,) value at every element of member k's part of each (K, ...) parameter: a buffer."""
        return torch.cat(
            [per_member.view(-1, 1).expand(-1, n).reshape(-1) for n in self.member_sizes]
        )

    def holds(self, tensors: tuple[list[torch.Tensor], ...], member_lr: torch.Tensor) -> bool:
        """Whether these are the tensors bound, each still in its place; the rates follow a member's
        new learning rate (restart, a checkpoint's groups loaded)."""
        now = [t for kind in tensors for t in kind]
        if len(now) != len(self.tensors) or any(
            a is not b or a.data_ptr() != p for a, b, p in zip(now, self.tensors, self.pointers)
        ):
            return False
        if member_lr is not self.member_lr or member_lr._version != self.lr_version:
            self.member_lr, self.lr_version = member_lr, member_lr._version
            self.rate = self.spread(member_lr)
        return True

    def restarted(self, member_start: torch.Tensor) -> bool:
        """Whether a member restarted (its member_start above zero), read back from the device only
        where member_start changed since the last step (restart() writes it in place; a
        checkpoint's groups bring a new tensor): a GPU's step must not wait for its value."""
        if (
            self.start is None
            or self.start[0] is not member_start
            or (self.start[1] != member_start._version)
        ):
            self.start = (member_start, member_start._version, bool(member_start.any()))
        return self.start[2]
