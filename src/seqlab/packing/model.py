"""K members of the CNN-LSTM (seqlab.model.CNNLSTM) as one module: every parameter carries a
leading member dimension, and one packed step trains all K at once. A step of one such network
leaves almost all of a CPU or GPU idle (its cost is kernel launches and Python, not arithmetic);
packed, each launch and each Python operation is paid once for K members.

Written out rather than derived: `nn.LSTM` cannot be vmapped (pytorch#105982), and vmap over
`stack_module_state` reached about half the speed of the written-out step on this project's 2-core
VM (issue 22's table). Member k is a plain CNNLSTM on the way in (the constructor) and a plain
CNNLSTM state dict on the way out and back (`member`, `load_member`), so a member's checkpoint and
logged model can be the ones its run alone would have. One-step data (the seed shape) takes the
exact shortcut of CNNLSTM.forward_one_step; data of more steps runs the convolution and BatchNorm of
all members as one grouped operation each, and each member's own LSTM (torch's fused kernel, the
one nn.LSTM runs) over its sequences inside the one step.

Each member's mathematics is its own: BatchNorm statistics over its own batch, its own dropout
masks (from its own generator, as CPU dropout draws them), and a loss whose gradient for its
parameters is that member's alone (the sum over members of each member's loss)."""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import nn
from torch.func import functional_call

from seqlab.model import CNNLSTM
from seqlab.training.gradients import l2_parameters

# A CNNLSTM state dict key -> this module's packed parameter or buffer. conv.weight is two of
# them (PackedCNNLSTM.conv_weight()): its centre tap and its other taps.
_KEYS = {
    "conv.bias": "conv_bias",
    "bn.weight": "bn_weight",
    "bn.bias": "bn_bias",
    "bn.running_mean": "bn_running_mean",
    "bn.running_var": "bn_running_var",
    "bn.num_batches_tracked": "bn_num_batches_tracked",
    "lstm.weight_ih_l0": "lstm_weight_ih",
    "lstm.weight_hh_l0": "lstm_weight_hh",
    "lstm.bias_ih_l0": "lstm_bias_ih",
    "lstm.bias_hh_l0": "lstm_bias_hh",
    "fc.weight": "fc_weight",
    "fc.bias": "fc_bias",
}
_BUFFERS = ("bn.running_mean", "bn.running_var", "bn.num_batches_tracked")


class PackedCNNLSTM(nn.Module):
    """K CNNLSTMs of one shape, built from the members themselves: each member is made exactly
    as its run alone makes its network (its seed, its initialisation), then packed."""

    def __init__(self, members: Sequence[CNNLSTM]) -> None:
        super().__init__()
        if not members:
            raise ValueError("a pack needs at least one member")
        first = members[0]
        states = [m.state_dict() for m in members]
        shapes = [{k: tuple(v.shape) for k, v in s.items()} for s in states]
        if any(s != shapes[0] for s in shapes[1:]):
            raise ValueError(
                "members of a pack must have one shape (filters, hidden size, features, outputs)"
            )
        self.n_members = len(
            members
        )  # the training loop's member dimension (training.loop.FusedLoop)
        self.kernel_size = first.conv.kernel_size[0]
        self.dropout = [m.drop.p for m in members]  # model.dropout may differ between members
        self.bn_eps, self.bn_momentum = first.bn.eps, first.bn.momentum
        named = dict(first.named_parameters())
        # Which packed tensors MATLAB's L2 applies to: those of the member's l2_parameters.
        chosen = {id(p) for p in l2_parameters(first)}
        self._l2_names = [
            name
            for key, p in named.items()
            if id(p) in chosen
            for name in (("conv_centre", "conv_sides") if key == "conv.weight" else (_KEYS[key],))
        ]
        # The convolution's centre tap apart from its other taps: one-step data uses the centre tap
        # alone (forward_one_step), so its product, its gradient and, where nothing decays the other
        # taps, its optimizer step touch a fifth of the weights (freeze_unused): at K = 32 on the seed
        # shape, the full (K, filters, 1440, 5) tensor's zeroing, gradient and Adam update were 2.5 ms
        # of a 5.3 ms step here (AMD EPYC).
        conv = torch.stack([s["conv.weight"] for s in states])
        self.tap = (self.kernel_size - 1) // 2
        self.conv_centre = nn.Parameter(conv[..., self.tap].contiguous())
        sides = [i for i in range(self.kernel_size) if i != self.tap]
        self.conv_sides = nn.Parameter(conv[..., sides].contiguous())
        for key, name in _KEYS.items():
            stacked = torch.stack(
                [s[key] for s in states]
            )  # a new tensor: the members stay as they are
            if key in _BUFFERS:
                self.register_buffer(name, stacked)
            else:
                # A parameter frozen in the members (MATLAB's second LSTM bias) stays frozen.
                self.register_parameter(
                    name, nn.Parameter(stacked, requires_grad=named[key].requires_grad)
                )

        # The members' LSTM as a module of one member's shape, called with member k's packed slices
        # (functional_call): each member's sequences through nn.LSTM's own kernel. Not a submodule:
        # its weights are the packed tensors' (the template's own are never trained or saved).
        self._lstm = [nn.LSTM(first.lstm.input_size, first.lstm.hidden_size, batch_first=True)]
        self._groups = None  # the members' dropout streams, grouped (_stream_groups)
        self._rows: Optional[torch.Tensor] = None  # the gates a first LSTM step uses (_gate_rows)

    def learnables(self) -> list[tuple[nn.Parameter, ...]]:
        """The packed tensors of each learnable parameter of a member's network, in its order
        (conv.weight is two: its centre tap and its other taps); frozen ones left out. What
        MATLAB's per-parameter gradient threshold takes the norm of (packing.optim)."""
        groups = [(self.conv_centre, self.conv_sides)] + [
            (getattr(self, name),) for key, name in _KEYS.items() if key not in _BUFFERS
        ]
        kept = [tuple(p for p in group if p.requires_grad) for group in groups]
        return [group for group in kept if group]

    def l2_parameters(self) -> list[nn.Parameter]:
        """The packed tensors MATLAB's L2 regularises (seqlab.training.gradients.l2_parameters)."""
        return [getattr(self, name) for name in self._l2_names]

    def conv_weight(self) -> torch.Tensor:
        """(K, filters, features, kernel): every member's convolution weight, its taps in order."""
        t = self.tap
        sides = self.conv_sides
        return torch.cat([sides[..., :t], self.conv_centre.unsqueeze(-1), sides[..., t:]], dim=-1)

    def freeze_unused(self) -> None:
        """One-step data, and nothing that decays the weights (no weight decay, no L2): the
        convolution's other taps and the LSTM's recurrent weights (h0 = 0) get no gradient and so
        no update ever (Adam's step on a zero gradient from zero moments is zero): they leave the
        optimizer and the gradient buffers."""
        self.conv_sides.requires_grad_(False)
        self.lstm_weight_hh.requires_grad_(False)

    def member(self, k: int) -> dict[str, torch.Tensor]:
        """Member k as a CNNLSTM state dict (copies)."""
        state = {key: getattr(self, name)[k].detach().clone() for key, name in _KEYS.items()}
        return {"conv.weight": self.conv_weight()[k].detach().clone(), **state}

    @torch.no_grad()
    def load_member(self, k: int, state: dict[str, torch.Tensor]) -> None:
        """Put a CNNLSTM state dict back as member k."""
        weight = state["conv.weight"]
        self.conv_centre[k].copy_(weight[..., self.tap])
        self.conv_sides[k].copy_(
            torch.cat([weight[..., : self.tap], weight[..., self.tap + 1 :]], -1)
        )
        for key, name in _KEYS.items():
            getattr(self, name)[k].copy_(state[key])

    def forward(
        self,
        x: torch.Tensor,
        generators: Optional[Sequence[torch.Generator]] = None,
        lengths: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """x: (K, batch, features) for one-step data, (K, batch, steps, features) otherwise; returns
        (K, batch, outputs): member k's output is its own network's on x[k] (CNNLSTM.forward).
        `lengths` (K, batch): the real steps of right-padded sequences, if any."""
        if x.dim() == 3:
            return self.forward_one_step(x, generators)
        k, n, steps, features = x.shape
        # Every member's convolution at once: its features are its own group of channels.
        h = nn.functional.conv1d(
            x.permute(1, 0, 3, 2).reshape(n, k * features, steps),
            self.conv_weight().reshape(-1, features, self.kernel_size),
            self.conv_bias.reshape(-1),
            padding="same",
            groups=k,
        )  # (batch, K x filters, steps)
        h = torch.relu(self._batch_norm_channels(h)).view(n, k, -1, steps)
        lstm, last = self._lstm[0].to(x.device), []
        for m in range(k):
            weights = {
                "weight_ih_l0": self.lstm_weight_ih[m],
                "weight_hh_l0": self.lstm_weight_hh[m],
                "bias_ih_l0": self.lstm_bias_ih[m],
                "bias_hh_l0": self.lstm_bias_hh[m],
            }
            out, _ = functional_call(
                lstm, weights, (h[:, m].transpose(1, 2),)
            )  # (batch, steps, hidden)
            # As CNNLSTM.forward: the LSTM is causal, its output at a sequence's last real step
            # does not see the padding after it.
            last.append(
                out[:, -1]
                if lengths is None
                else out[torch.arange(n, device=out.device), lengths[m].to(out.device) - 1]
            )
        h = self._dropout(torch.stack(last), generators)
        return torch.baddbmm(self.fc_bias.unsqueeze(1), h, self.fc_weight.transpose(1, 2))

    def forward_one_step(
        self, x: torch.Tensor, generators: Optional[Sequence[torch.Generator]] = None
    ) -> torch.Tensor:
        """x: (K, batch, features), one step per sample; returns (K, batch, outputs). Member k's
        output is CNNLSTM.forward_one_step of its own network on x[k] (see that method for why
        one step needs only the convolution's centre tap and the LSTM's first step). In training,
        member k's dropout mask is drawn from generators[k] where given (its run alone draws it
        from its own stream)."""
        # (filters x features) @ x^T, the centre tap a contiguous tensor of its own: as x @ (a
        # strided slice)^T, MKL's batched product and its backward took 1.30 ms of a K=8 step and
        # 3.7 ms of a K=32 one here (AMD EPYC), this way 0.48 and 2.0 ms (the backward's weight
        # gradient is then a product with the small matrix first).
        centre = self.conv_centre
        k, n, features = x.shape
        if k > 1 and x.stride(0) == 0:
            # One batch for every member (packing.data.PackData.batch: the members share a data
            # order), a view with a stride of 0 over them: every member's centre tap in one
            # (batch x features) @ (features x K filters) product, the batch read once rather than
            # K times, and its backward one product too.
            flat = centre.view(-1, features)  # (K x filters, features)
            h = torch.addmm(self.conv_bias.view(-1), x[0], flat.t()).view(n, k, -1).transpose(0, 1)
        else:
            h = torch.baddbmm(self.conv_bias.unsqueeze(2), centre, x.transpose(1, 2)).transpose(
                1, 2
            )
        h = torch.relu(self._batch_norm(h))
        # The gates a step from a zero state uses (c0 = 0 leaves the forget gate out), their rows
        # taken first, as i, o, g: one product of three quarters the size, one sigmoid over i and o,
        # and views (split) whose backward joins the gradients rather than zero-filling a full
        # (K, batch, 4 x hidden) tensor per slice. At K = 32 the full gates' sigmoid, its backward
        # and the slices' zero fills were about a fifth of the step here.
        rows = self._gate_rows(h.device)
        bias = (self.lstm_bias_ih + self.lstm_bias_hh).index_select(1, rows)
        weight = self.lstm_weight_ih.index_select(1, rows)
        z = torch.baddbmm(bias.unsqueeze(1), h, weight.transpose(1, 2))  # gates i, o, g
        hidden = z.shape[2] // 3
        io, g = z.split([2 * hidden, hidden], dim=2)
        i, o = torch.sigmoid(io).split(hidden, dim=2)
        c = i * torch.tanh(g)
        h = self._dropout(o * torch.tanh(c), generators)
        return torch.baddbmm(self.fc_bias.unsqueeze(1), h, self.fc_weight.transpose(1, 2))

    def _gate_rows(self, device: torch.device) -> torch.Tensor:
        """The LSTM's input-weight rows of gates i, o and g (torch's order is i, f, g, o)."""
        if self._rows is None or self._rows.device != device:
            hidden = self.lstm_weight_ih.shape[1] // 4
            i, g, o = (torch.arange(n * hidden, (n + 1) * hidden) for n in (0, 2, 3))
            self._rows = torch.cat([i, o, g]).to(device)
        return self._rows

    def _batch_norm(self, h: torch.Tensor) -> torch.Tensor:
        """BatchNorm1d per member over its own batch (dimension 1): the (K, batch, channels) input
        as (batch, K x channels), so that one native batch_norm, the kernel nn.BatchNorm1d runs,
        normalises and updates each member's channels on their own (forward and backward in one
        operation each, instead of a dozen elementwise ones)."""
        k, n, c = h.shape
        flat = h.transpose(0, 1).reshape(n, k * c)
        if self.training:
            self.bn_num_batches_tracked.add_(1)
        out = nn.functional.batch_norm(
            flat,
            self.bn_running_mean.view(-1),
            self.bn_running_var.view(-1),
            self.bn_weight.view(-1),
            self.bn_bias.view(-1),
            self.training,
            self.bn_momentum,
            self.bn_eps,
        )
        return out.view(n, k, c).transpose(0, 1)

    def _batch_norm_channels(self, h: torch.Tensor) -> torch.Tensor:
        """BatchNorm1d per member over its batch and steps: h is (batch, K x channels, steps)."""
        if self.training:
            self.bn_num_batches_tracked.add_(1)
        return nn.functional.batch_norm(
            h,
            self.bn_running_mean.view(-1),
            self.bn_running_var.view(-1),
            self.bn_weight.view(-1),
            self.bn_bias.view(-1),
            self.training,
            self.bn_momentum,
            self.bn_eps,
        )

    def _stream_groups(
        self, generators: Sequence[torch.Generator]
    ) -> tuple[list[tuple[float, torch.Generator]], Optional[torch.Tensor]]:
        """The distinct (dropout rate, generator) pairs among the members, in member order, and each
        member's place among them (None: every member has its own, or all share one: an
        optimizer.lr sweep of one seed, whose one mask broadcasts over the members)."""
        key = tuple(map(id, generators))
        if self._groups is None or self._groups[0] != key:
            pairs = list(zip(self.dropout, generators))
            places = {}
            for p, g in pairs:
                places.setdefault((p, id(g)), (len(places), (p, g)))
            groups = [pair for _, pair in places.values()]
            index = None
            if 1 < len(groups) < len(pairs):
                index = torch.tensor([places[(p, id(g))][0] for p, g in pairs])
            self._groups = (key, groups, index)
        _, groups, index = self._groups
        return groups, index

    def _dropout(
        self, h: torch.Tensor, generators: Optional[Sequence[torch.Generator]]
    ) -> torch.Tensor:
        if not self.training or not any(self.dropout):
            return h
        if generators is not None:
            # What CPU dropout computes (noise = bernoulli(1 - p) / (1 - p); input * noise), each
            # member's noise drawn from its own stream (a member without dropout draws nothing, as
            # its run alone would not). Members given one generator object (share_streams: their
            # runs alone would draw the very same masks) draw one mask, used by each of them.
            groups, index = self._stream_groups(generators)
            noise = h.new_empty((len(groups), *h.shape[1:]))
            keep = []
            for j, (p, g) in enumerate(groups):
                if p == 0.0:
                    noise[j].fill_(1.0)
                else:
                    noise[j].bernoulli_(1 - p, generator=g)
                keep.append(1 - p)
            noise.div_(h.new_tensor(keep).view(-1, 1, 1))  # each mask by its own 1 - p
            return h * (noise if index is None else noise[index])
        if len(set(self.dropout)) == 1:
            return nn.functional.dropout(h, self.dropout[0], True)
        p = h.new_tensor(self.dropout).view(-1, 1, 1)
        return h * (torch.rand_like(h) >= p) / (1 - p)


def share_streams(streams: Sequence[torch.Generator], rates: Sequence[float]) -> list:
    """The members' dropout streams with one generator object for members whose streams are in one
    state and who drop at one rate: alone, each would draw the very same mask each step (an
    optimizer.lr or L2 sweep of one seed), so the pack draws it once for them (_dropout)."""
    first: dict[tuple[float, bytes], torch.Generator] = {}
    return [
        first.setdefault((p, g.get_state().numpy().tobytes()), g) for g, p in zip(streams, rates)
    ]


class OneMember(nn.Module):
    """A pack of one: any network of conf/model/ as member 0 of the training loop's member
    dimension, so that a run alone trains in the loop, the module and the lifecycle a pack trains
    in (seqlab.training). Its inputs and outputs carry the member dimension (of size 1); inside, the
    network computes what it computes alone (its own dropout on the global stream, its one-step
    shortcut where `one_step_shortcut`, perf.exact_shortcuts), so a run alone is as fast as its
    bare network. The network's parts are this module's under their own names, so a run alone's
    checkpoint holds its network's own state dict (model.conv.weight, ...), as one saved alone."""

    n_members = 1

    def __init__(self, network: nn.Module, one_step_shortcut: bool = True) -> None:
        super().__init__()
        for name, child in network.named_children():
            self.add_module(name, child)
        for name, param in network.named_parameters(recurse=False):
            self.register_parameter(name, param)
        for name, buffer in network.named_buffers(recurse=False):
            keep = name not in network._non_persistent_buffers_set
            self.register_buffer(name, buffer, persistent=keep)
        object.__setattr__(self, "net", network)  # not a submodule: its parts are this module's
        self.shortcut = one_step_shortcut and hasattr(network, "forward_one_step")

    def train(self, mode: bool = True) -> "OneMember":
        super().train(mode)
        self.net.training = mode  # its children are this module's; its own flag follows
        return self

    def _apply(self, fn, recurse: bool = True):  # noqa: ANN001 - nn.Module's signature
        super()._apply(fn, recurse)
        for name in self.net._buffers:  # a buffer moved is a new tensor: the network's too
            self.net._buffers[name] = self._buffers[name]
        return self

    def forward(
        self,
        x: torch.Tensor,
        generators: Optional[Sequence[torch.Generator]] = None,
        lengths: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """x: (1, batch, features) for one-step data (the pack's data drops the step), (1, batch,
        steps, features) otherwise; lengths (1, batch) or None. Returns (1, batch, outputs)."""
        if x.dim() == 3:
            out = self.net.forward_one_step(x[0]) if self.shortcut else self.net(x[0].unsqueeze(1))
        else:
            out = self.net(x[0], None if lengths is None else lengths[0])
        return out.unsqueeze(0)

    def member(self, k: int) -> dict[str, torch.Tensor]:
        return {key: v.detach().clone() for key, v in self.net.state_dict().items()}

    @torch.no_grad()
    def load_member(self, k: int, state: dict[str, torch.Tensor]) -> None:
        self.net.load_state_dict(state)


def pack_of(networks: Sequence[nn.Module], one_step_shortcut: bool = True) -> nn.Module:
    """The training loop's network for K >= 1 members: one network as a pack of one (OneMember),
    K CNN-LSTMs as one packed module (PackedCNNLSTM, which takes the one-step shortcut itself)."""
    if len(networks) == 1:
        return OneMember(networks[0], one_step_shortcut)
    return PackedCNNLSTM(networks)
