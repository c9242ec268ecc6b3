"""A job's data on the training device, for its K >= 1 members (a run alone is a pack of one; issue
32, point 4): each distinct set of samples once, and each member's training and validation rows into
it, in the order its run alone would use them; and the fused loop's items of it, as Lightning
iterates them (PackItems)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from typing import Iterator, Optional

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from seqlab.data.kept import generated
from seqlab.data.module import batches_in, last_batch_single, process_share
from seqlab.packing.members import Member
from seqlab.training.profiling import phase

# Data keys that split and batch the samples (each member's data module does), not make them.
_SPLIT_KEYS = ("batch_size", "val_fraction", "shuffle", "drop_last")


def samples_key(data: DictConfig) -> str:
    """What makes a member's samples: its data config, but for how they are split and batched, and
    for data.seed where the samples come from a file (data.path: the seed only splits and orders
    them; generated data depends on it). Members with one key read the samples once and share them
    (PackData.of); so do a process's jobs for generated samples (data.kept)."""
    settings = OmegaConf.to_container(data, resolve=True)
    for key in _SPLIT_KEYS:
        settings.pop(key, None)
    if settings.get("path"):
        settings.pop("seed", None)
    return json.dumps(settings, sort_keys=True, default=str)


def joined(blocks: list, what: str) -> np.ndarray:
    """The blocks' `what` arrays (x, y, lengths) as one, in their order: a view where they already
    lie one after another in one buffer, else joined once and each block's array replaced by its
    view of the joined buffer (in the SeqData that holds it, data.kept's too). A pack of 32 sets of
    16,384 days joins 3 GB of fresh memory (4.6 s on this project's VM, most of it the kernel
    faulting the memory in); the next jobs of a study that train those sets again take the same
    buffer as it is, and the sets' first copies are freed."""
    arrays = [getattr(b, what) for b in blocks]
    if len(arrays) == 1:
        return arrays[0]
    if _adjacent(arrays):
        base = arrays[0].base
        start = (arrays[0].ctypes.data - base.ctypes.data) // base.strides[0]
        return base[start : start + sum(len(a) for a in arrays)]
    # torch's join: its threads, and its allocator's huge pages (seqlab/__init__.py); NumPy's took
    # 7.4 s for 3 GB where torch's takes 4.6 s.
    out = torch.cat([torch.from_numpy(a) for a in arrays]).numpy()
    start = 0
    for b, a in zip(blocks, arrays):
        setattr(b, what, out[start : start + len(a)])
        start += len(a)
    return out


def _adjacent(arrays: list[np.ndarray]) -> bool:
    """Whether the arrays are whole rows of one buffer, one right after another."""
    base = arrays[0].base
    if (
        not isinstance(base, np.ndarray)
        or not base.flags.c_contiguous
        or base.ndim != arrays[0].ndim
    ):
        return False
    at = arrays[0].ctypes.data
    for a in arrays:
        if a.base is not base or not a.flags.c_contiguous or a.ctypes.data != at:
            return False
        at += a.nbytes
    return True


# The last pack's validation inputs (val_x), kept for the next job of this process: a study's packs
# train the same generated sets again and again, and a pack of 32's gathered 600 MB of fresh memory
# a job (0.6-0.9 s here). Kept by the members' data configs, generated samples alone (data.kept:
# the same config makes the same samples, where a file may change between two jobs): a pack of the
# first K of those members takes a view of them. (keys, val_rows, val_x)
_KEPT_VAL: Optional[tuple[list[str], torch.Tensor, torch.Tensor]] = None


def _val_inputs(members: list[Member], data: "PackData") -> torch.Tensor:
    """(K, samples, ...) every member's validation inputs, gathered once, or the kept ones."""
    global _KEPT_VAL
    k, n_val = data.val_rows.shape
    keys = [samples_key(m.cfg.data) for m in members]
    if not all(generated(m.cfg.data) for m in members):
        keys = None
    if keys and _KEPT_VAL is not None:
        kept_keys, rows, val_x = _KEPT_VAL
        if (
            kept_keys[:k] == keys
            and rows.shape[1] == n_val
            and (val_x.device, val_x.dtype) == (data.x.device, data.x.dtype)
            and torch.equal(rows[:k], data.val_rows)
        ):
            return val_x[:k]
    _KEPT_VAL = None  # freed before the next is gathered
    val_x = data.x.index_select(0, data.val_rows.reshape(-1)).view(k, n_val, *data.x.shape[1:])
    if keys:
        _KEPT_VAL = (keys, data.val_rows, val_x)
    return val_x


# Sample steps gathered at once for a validation: the K members' samples of one chunk (member-major).
VAL_ROWS = 8192

Batch = tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]  # inputs, targets, lengths


@dataclass
class PackData:
    """The members' data on the training device, each distinct set of samples once, as rows
    (samples, features): members whose samples are the same (one file, split and shuffled by each
    member's own seed; or one data config) share them, and each member has its own training and
    validation rows into them, in its split's order (data.module.SeqDataModule.split)."""

    x: torch.Tensor  # (rows, features) for one-step data, (rows, steps, features) otherwise
    y: torch.Tensor  # (rows, responses)
    lengths: Optional[torch.Tensor]  # (rows,) real steps of right-padded sequences; None: all full
    train_rows: torch.Tensor  # (K, training samples) long
    val_rows: Optional[torch.Tensor]  # (K, validation samples) long; None: no validation
    batch_size: int
    n_batches: int  # per epoch (data.module.TensorBatches.n_batches)
    shuffle: bool
    # Each member's validation inputs gathered once, (K, samples, features), where no member shares its
    # samples (the memory is then the sets' own, as before the sharing, and no validation gathers them
    # again); None: gathered a chunk at a time from the shared rows (val_chunks).
    val_x: Optional[torch.Tensor] = None
    # This epoch's orders are one (orders()): every member's batch is the same rows, gathered once.
    one_order: bool = False
    drop_last: bool = True  # data.drop_last (MATLAB's: the last incomplete mini-batch is dropped)
    rank: int = 0  # under DDP (shard): this process's share of every member's epoch
    world_size: int = 1
    _x_buffer: Optional[torch.Tensor] = field(default=None, repr=False)  # batches()' inputs, reused

    @classmethod
    def of(cls, members: list[Member], device: torch.device) -> "PackData":
        """The members' data on the device: each distinct set of samples once (its rows, then a
        validation set that came with it), and each member's training and validation rows into them,
        its split's (SeqDataModule.split) or the data's own validation set."""
        blocks, offsets, train_rows, val_rows = [], {}, [], []
        for m in members:
            dm, data = m.datamodule, m.datamodule.samples
            if id(data) not in offsets:
                offsets[id(data)] = sum(len(b) for b in blocks)
                blocks += [data] + ([data.val] if data.val is not None else [])
            base = offsets[id(data)]
            if data.val is not None:
                train, val = np.arange(len(data)), len(data) + np.arange(len(data.val))
            else:
                train, val = dm.split(len(data))
            train_rows.append(base + train)
            val_rows.append(base + val)

        def rows(what: str, one_step: bool) -> Optional[torch.Tensor]:
            # One block on the CPU is the samples' own memory (from_numpy, .to: no copy); so are
            # blocks that an earlier job of this process joined (joined()).
            if getattr(blocks[0], what) is None:
                return None
            every = torch.from_numpy(joined(blocks, what))
            return (every[:, 0] if one_step else every).to(device)

        dm = members[0].datamodule
        n, bs = len(train_rows[0]), dm.batch_size
        drop = dm.drop_last or dm.drop_single
        one_step = (
            blocks[0].x.shape[1] == 1
        )  # the packed network's one-step shortcut takes (K, batch, features)
        data = cls(
            x=rows("x", one_step),
            y=rows("y", False),
            lengths=rows("lengths", False),
            train_rows=torch.from_numpy(np.stack(train_rows)).to(device),
            val_rows=torch.from_numpy(np.stack(val_rows)).to(device) if len(val_rows[0]) else None,
            batch_size=bs,
            n_batches=batches_in(n, bs, drop),
            shuffle=dm.shuffle,
            drop_last=dm.drop_last,
        )
        if data.val_rows is not None and len(offsets) == len(members):
            data.val_x = _val_inputs(members, data)
        return data

    def cast(self, dtype: torch.dtype) -> "PackData":
        """The data in the network's floating type (trainer.precision=64-true: Lightning has made
        the network double; autocast's mixed precision keeps float32 inputs)."""
        if self.x.dtype == dtype:
            return self
        val_x = None if self.val_x is None else self.val_x.to(dtype)
        return replace(self, x=self.x.to(dtype), y=self.y.to(dtype), val_x=val_x, _x_buffer=None)

    def shard(self, rank: int, world_size: int) -> "PackData":
        """Under DDP, this process's share of every member's epoch, as a run alone's DDP job takes
        it (data.module.TensorBatches): every P-th sample of the member's order from `rank` on, N // P
        of them (the same count on every process keeps their steps in lockstep), in batches of
        data.batch_size per process. The validation sets stay whole: every process predicts them,
        so every process judges patience and the best network alike."""
        if world_size == 1:
            return self
        bs = self.batch_size
        n = process_share(self.train_rows.shape[1], world_size, bs)
        drop = self.drop_last or last_batch_single(n, bs, self.drop_last, self.steps)
        return replace(self, rank=rank, world_size=world_size, n_batches=batches_in(n, bs, drop))

    @property
    def steps(self) -> int:
        return 1 if self.x.dim() == 2 else self.x.shape[1]

    @property
    def n_samples(self) -> int:
        """Training samples per member in this process's epoch."""
        return self.train_rows.shape[1] // self.world_size

    def orders(self, members: list[Member]) -> torch.Tensor:
        """(K, samples): each member's order for this epoch, drawn as its run alone draws it (a
        permutation of its training set), as rows of x."""
        # Under DDP, this process's share (TensorBatches'): every P-th of a shuffled order, a
        # contiguous block of an unshuffled one.
        share, rank, world = self.n_samples, self.rank, self.world_size
        if not self.shuffle:
            rows = self.train_rows[:, rank * share : (rank + 1) * share]
        else:
            n, device = self.train_rows.shape[1], self.x.device
            order = torch.stack(
                [torch.randperm(n, generator=m.order, device=device) for m in members]
            )
            rows = self.train_rows.gather(1, order)[:, rank::world][:, :share]
        # Members that differ in optimizer.lr, module.l2_regularization, model.dropout or the
        # threshold, not in data.seed, draw the same order from generators of one seed: they share
        # each batch (batch()). Checked once an epoch (one read-back), not assumed.
        self.one_order = len(rows) == 1 or bool((rows == rows[:1]).all())
        return rows

    def shares_order(self, members: list[Member]) -> bool:
        """Whether the members will draw one data order (one training split, and order generators
        in one state, or no shuffling): then they share each batch (orders(), batch())."""
        if len(members) < 2 or not bool((self.train_rows == self.train_rows[:1]).all()):
            return False
        first = members[0].order.get_state()
        return not self.shuffle or all(torch.equal(m.order.get_state(), first) for m in members)

    def val_targets(self) -> torch.Tensor:
        """(K, samples, responses): each member's validation targets."""
        k, n = self.val_rows.shape
        return self.y.index_select(0, self.val_rows.reshape(-1)).view(k, n, -1)

    def val_chunks(self) -> Iterator[tuple[torch.Tensor, Optional[torch.Tensor]]]:
        """Each member's validation inputs and lengths, (K, chunk, ...), a chunk of samples at a time:
        gathered from the shared rows (K whole copies would cost K validation sets of memory). A
        chunk holds VAL_ROWS rows of one-step data, 1024 sequences of longer ones (its LSTM's
        activations are a sequence's steps long), shared by the members."""
        k, n = self.val_rows.shape
        chunk = max(1, (VAL_ROWS if self.steps == 1 else 1024) // k)
        one = k > 1 and bool((self.val_rows == self.val_rows[:1]).all())  # one split: as batches()
        for i in range(0, n, chunk):
            idx = self.val_rows[:, i : i + chunk]
            if self.val_x is not None:
                yield self.val_x[:, i : i + chunk], self._lengths(idx)
            elif one:
                shared = self.x.index_select(0, idx[0])
                yield (
                    shared.unsqueeze(0).expand(k, idx.shape[1], *self.x.shape[1:]),
                    self._lengths(idx),
                )
            else:
                flat = idx.reshape(-1)
                yield (
                    self.x.index_select(0, flat).view(k, idx.shape[1], *self.x.shape[1:]),
                    self._lengths(idx),
                )

    def _lengths(self, idx: torch.Tensor) -> Optional[torch.Tensor]:
        """(K, n) lengths of the rows `idx` (K, n), or None for data without padding."""
        if self.lengths is None:
            return None
        return self.lengths.index_select(0, idx.reshape(-1)).view(idx.shape)

    def batches(self, orders: torch.Tensor, first: int, stop: int) -> Iterator[Batch]:
        """Mini-batches first..stop-1 of this epoch for every member: (K, batch, features), (K,
        batch, responses) and (K, batch) lengths or None, gathered with index_select (advanced
        indexing of a (K, batch) index cost a third of the step). The inputs go into one buffer
        reused from item to item (a step's graph is gone by the next: a new tensor of K batches each
        step cost about a quarter of the pack's speed at K = 32 on this project's VM); the targets
        are new, as the epoch's train metrics keep them.

        Members of one order (a run alone, or members that differ in optimizer.lr, L2, dropout or
        the threshold, not in data.seed) share each batch: the item's rows are gathered at once (one
        copy for its steps, as a run alone's epoch was, rather than one per step), and each batch is
        handed on as a view with a stride of 0 over the members: the packed network reads it once
        (PackedCNNLSTM.forward_one_step: one product for every member's convolution) instead of K
        copies of the same rows."""
        bs = self.batch_size
        if self.one_order:
            rows, k = orders[0, first * bs : stop * bs], len(orders)
            # The item's rows once, seen as (K, rows, ...) with a stride of 0 over the members:
            # each batch is then one slice of it (a step's every Python operation counts here).
            x = self._gather(rows).unsqueeze(0).expand(k, *rows.shape, *self.x.shape[1:])
            y = self.y.index_select(0, rows).unsqueeze(0).expand(k, len(rows), -1)
            lengths = None
            if self.lengths is not None:
                lengths = self.lengths.index_select(0, rows).unsqueeze(0).expand(k, len(rows))
            for start in range(0, len(rows), bs):
                end = start + bs
                yield (
                    x[:, start:end],
                    y[:, start:end],
                    None if lengths is None else lengths[:, start:end],
                )
            return
        for b in range(first, stop):
            idx = orders[:, b * bs : (b + 1) * bs]
            k, n = idx.shape
            flat = idx.reshape(-1)
            yield (
                self._gather(flat).view(k, n, *self.x.shape[1:]),
                self.y.index_select(0, flat).view(k, n, -1),
                self._lengths(idx),
            )

    def _gather(self, rows: torch.Tensor) -> torch.Tensor:
        if self._x_buffer is None or self._x_buffer.shape[0] != len(rows):
            self._x_buffer = self.x.new_empty((len(rows), *self.x.shape[1:]))
        return torch.index_select(self.x, 0, rows, out=self._x_buffer)


Item = tuple[
    torch.Tensor, int, int
]  # every member's order this epoch (K, samples), its first and end batch


class PackItems:
    """The fused loop's training items, as Lightning iterates them: each pass draws every member's
    order (its own generator: its run alone's order) and serves items of `per_item` mini-batches. A
    pass resumed inside an epoch replays that epoch's order and skips the items it trained on."""

    def __init__(self, data: PackData, members: list[Member], per_item: int) -> None:
        self.data, self.members, self.per_item = data, members, max(per_item, 1)
        self.pass_start: Optional[list[torch.Tensor]] = None  # the orders' states at its start
        self.resume_at: Optional[tuple[list[torch.Tensor], int]] = None

    def __len__(self) -> int:
        return math.ceil(self.data.n_batches / self.per_item)

    def __iter__(self) -> Iterator[Item]:
        skip = 0
        if self.resume_at is not None:
            states, skip = self.resume_at
            self.resume_at = None
            for m, state in zip(self.members, states):
                m.order.set_state(state)
        self.pass_start = [m.order.get_state() for m in self.members]
        with phase("data"):
            orders = self.data.orders(self.members)
        for i in range(skip, len(self)):
            yield orders, i * self.per_item, min((i + 1) * self.per_item, self.data.n_batches)
