"""The DataModule: loads a source once, splits it, and serves batches sliced from contiguous
tensors (one gather per epoch), not assembled sample by sample by a DataLoader: for a model
this small, per-sample collation costs more than the model."""

from __future__ import annotations

import logging
import math
from typing import Callable, Iterable, Iterator, Optional

import numpy as np
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from seqlab import SeqlabError
from seqlab.data.sources import SeqData
from seqlab.schema import DataConfig as _Defaults
from seqlab.training.lightning_private import batches_done_in_epoch
from seqlab.training.profiling import phase

# The first training samples kept as an input example: a logged model takes two, its ONNX copy
# is checked on N_CHECK (tracking.onnx_model).
EXAMPLE_SAMPLES = 64

log = logging.getLogger("seqlab")

Batch = tuple[torch.Tensor, ...]  # (x, y) or (x, y, lengths)


def batches_in(n: int, batch_size: int, drop_last: bool) -> int:
    """Mini-batches an epoch of n samples makes: the last incomplete one dropped or kept."""
    return n // batch_size if drop_last else math.ceil(n / batch_size)


def last_batch_single(n: int, batch_size: int, drop_last: bool, steps: int) -> bool:
    """Whether n samples per epoch leave a last batch of one (BatchNorm needs 2; a sequence
    batch normalises over its steps too, so only one-step data is affected)."""
    return not drop_last and n % batch_size == 1 and steps == 1


def process_share(n: int, world_size: int, batch_size: int) -> int:
    """The training samples each of a DDP job's `world_size` processes trains an epoch: equal
    shares, N // P; refused in one line where that is less than a batch (a batch is per process)."""
    share = n // world_size
    if world_size > 1 and share < batch_size:
        raise SeqlabError(
            f"data: {n} training samples give each of the {world_size} processes {share}, "
            f"fewer than one batch of data.batch_size={batch_size} (a batch is per process)"
        )
    return share


class TensorBatches:
    """Mini-batches of (x, y[, lengths]), reshuffled at the start of every pass.

    With `device`, the tensors are moved there once and shuffled there (an on-device permutation),
    so no batch crosses from host to device during training. With `batches_per_item` K > 1,
    each item is K consecutive mini-batches in one tensor, which the module's fused loop splits:
    the framework's per-item work is then paid once per K optimizer steps.

    With `world_size` P > 1 (DDP), every process draws the same permutation (same seed) and
    takes every P-th sample of it from `rank` on, the same number on every process: each sample
    is trained on at most once an epoch, and the N mod P left over wait for a later shuffle
    (DistributedSampler's drop_last). Equal counts keep the processes' steps in lockstep."""

    def __init__(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        batch_size: int,
        shuffle: bool,
        drop_last: bool,
        seed: int,
        lengths: Optional[torch.Tensor] = None,
        device: Optional[torch.device] = None,
        batches_per_item: int = 1,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not one of the {world_size} processes")
        if len(x) < world_size:
            raise SeqlabError(
                f"{len(x)} training samples cannot be shared by {world_size} processes"
            )
        tensors = (x, y) if lengths is None else (x, y, lengths)
        self.tensors = tuple(t.to(device) for t in tensors) if device is not None else tensors
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.drop_last = drop_last  # MATLAB discards the last incomplete mini-batch
        self.batches_per_item = batches_per_item
        self.rank, self.world_size = rank, world_size
        self.generator = torch.Generator(device=self.tensors[0].device).manual_seed(seed)
        # Where the current pass started: with the items done, enough to replay its order.
        self.pass_start_state: Optional[torch.Tensor] = None
        self.resume_at: Optional[tuple[torch.Tensor, int]] = None
        self.buffers: dict[int, torch.Tensor] = {}  # each epoch's shuffled copy, reused

    def _gathered(self, i: int, tensor: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
        """tensor[order], written into the same buffer every epoch: a fresh copy of a large data
        set each epoch costs more in page faults (the allocator returns big blocks to the system)
        than the copy itself. The previous epoch's batches are all used by then."""
        buffer = self.buffers.get(i)
        if buffer is None or buffer.shape[0] != len(order):
            buffer = self.buffers[i] = tensor.new_empty((len(order), *tensor.shape[1:]))
        return torch.index_select(tensor, 0, order, out=buffer)

    def state_dict(self) -> dict:
        return {
            "generator": self.pass_start_state
            if self.pass_start_state is not None
            else self.generator.get_state()
        }

    def resume(self, generator_state: torch.Tensor, items_done: int) -> None:
        """The next pass replays the interrupted one's order and skips the items it trained on."""
        self.resume_at = (generator_state, items_done)

    @property
    def n_batches(self) -> int:
        return batches_in(len(self.tensors[0]) // self.world_size, self.batch_size, self.drop_last)

    def __len__(self) -> int:
        return math.ceil(self.n_batches / self.batches_per_item)

    def __iter__(self) -> Iterator[Batch]:
        tensors = self.tensors
        skip = 0
        if self.resume_at is not None:
            state, skip = self.resume_at
            self.generator.set_state(state)
            self.resume_at = None
        self.pass_start_state = self.generator.get_state()
        if self.shuffle:
            with phase("data"):
                order = torch.randperm(
                    len(tensors[0]), generator=self.generator, device=tensors[0].device
                )
                if self.world_size > 1:
                    order = order[self.rank :: self.world_size][: len(order) // self.world_size]
                tensors = tuple(self._gathered(i, t, order) for i, t in enumerate(tensors))
        elif self.world_size > 1:
            share = len(tensors[0]) // self.world_size
            tensors = tuple(t[self.rank * share : (self.rank + 1) * share] for t in tensors)
        # The samples this epoch trains on (without the dropped partial batch), in items of
        # K mini-batches: slices of one contiguous tensor, so no copies.
        used = min(len(tensors[0]), self.n_batches * self.batch_size)
        step = self.batch_size * self.batches_per_item
        for start in range(skip * step, used, step):
            yield tuple(t[start : min(start + step, used)] for t in tensors)


class _Marked:
    """A loader whose batch fetches show as the 'data' phase in a profile."""

    def __init__(self, loader: Iterable[Batch]) -> None:
        self.loader = loader

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Batch]:
        iterator = iter(self.loader)
        while True:
            with phase("data"):
                batch = next(iterator, None)
            if batch is None:
                return
            yield batch


def _tensors(data: SeqData) -> tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    lengths = None if data.lengths is None else torch.from_numpy(data.lengths)
    return torch.from_numpy(data.x), torch.from_numpy(data.y), lengths


class SeqDataModule(pl.LightningDataModule):
    """Splits train/validation with a seeded permutation (or uses the validation set that came
    with the data). Shapes are known after `setup()`: the model is sized from them."""

    def __init__(
        self,
        source: Callable[..., SeqData],
        name: str = "data",
        path: Optional[str] = _Defaults.path,
        n_samples: Optional[int] = _Defaults.n_samples,
        batch_size: int = _Defaults.batch_size,
        val_fraction: float = _Defaults.val_fraction,
        seed: int = _Defaults.seed,
        shuffle: bool = _Defaults.shuffle,
        drop_last: bool = _Defaults.drop_last,
        x_key: Optional[str] = _Defaults.x_key,  # path, x_key, y_key: the source's, via ${..}
        y_key: Optional[str] = _Defaults.y_key,
        drop_nonfinite: bool = _Defaults.drop_nonfinite,
    ) -> None:
        super().__init__()
        self.source = source
        self.name = name
        self.n_samples = n_samples
        self.batch_size = batch_size
        self.val_fraction = val_fraction
        self.seed = seed
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.drop_nonfinite = drop_nonfinite
        self.train: Optional[SeqData] = None
        self.val: Optional[SeqData] = None
        self.samples: Optional[SeqData] = None  # a pack member's, before the split (setup, release)
        self.train_rows: Optional[np.ndarray] = None  # the split's training rows of the samples
        self.example_x: Optional[np.ndarray] = None
        self.train_y_mean: Optional[np.ndarray] = None  # baseline_val_rmse's (setup)
        self.columns: Optional[str] = None  # a table's index and target columns, as taken
        self.drop_single = False
        self.configure_batching("tensor", on_device=False, batches_per_item=1)

    def load(self, out: Optional[np.ndarray] = None) -> SeqData:
        """The source's samples, checked for NaN/Inf, before the split; `out`: a generated source's
        inputs' place (packing.build.load_samples: a pack's sets drawn into one buffer)."""
        into = {} if out is None else {"out": out}
        data = self._finite(self.source(n_samples=self.n_samples, seed=self.seed, **into), "data")
        if data.val is not None:
            data.val = self._finite(data.val, "validation data")
        if len(data) == 0:
            raise SeqlabError(f"data: {self.name} holds no samples")
        return data

    def split(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """The seeded permutation that splits n samples: (training rows, validation rows)."""
        n_val = round(n * self.val_fraction)
        if self.val_fraction > 0 and n_val < 2:
            n_val = 2 if n >= 4 else 0  # R2 needs two samples; a tiny set trains on all
        order = np.random.default_rng(self.seed).permutation(n)
        return order[n_val:], order[:n_val]

    def setup(self, stage: Optional[str] = None, samples: Optional[SeqData] = None) -> None:
        """The split (Lightning calls this). `samples`: what load() gave, kept by reference for a
        split again after release() (a pack's members, which share their samples, seqlab.packing).
        stage="validate" (Lightning's name for it) splits the validation set alone: what a run's
        end scores (packing.member_runs), where gathering every training input again cost a
        member's end 0.03-0.3 s of fresh memory here, for nothing it reads."""
        # Split again after release(): said once already.
        again = samples is None and self.samples is not None
        if samples is not None:
            self.samples = samples
        validating = stage == "validate"
        if self.val is not None and (validating or self.train is not None):
            return
        data = self.samples or self.load()
        self.columns = data.columns
        if data.val is not None:
            self.train, self.val = data, data.val
            train_rows = np.arange(len(data))
            if not again:
                log.info(
                    "data      validation: the set that came with the data (data.val_fraction not used)"
                )
        else:
            train_rows, val_rows = self.split(len(data))
            self.val = data.take(val_rows)
            self.train = None if validating else data.take(train_rows)
        # What the end reads of the training set, from its rows alone: the training targets' mean
        # (baseline_val_rmse) and a logged model's input example (kept by release()).
        self.train_rows = train_rows
        self.train_y_mean = data.y[train_rows].astype(np.float64).mean(axis=0)
        self.example_x = data.x[train_rows[:EXAMPLE_SAMPLES]]
        if self.val is not None and self.val.x.shape[2] != data.x.shape[2]:
            raise SeqlabError(
                f"data: validation has {self.val.x.shape[2]} features, training {data.x.shape[2]}"
            )
        n_train = len(train_rows)
        if n_train < 2:
            raise SeqlabError(
                f"data: {n_train} training sample(s): BatchNorm needs 2 or more; use more data"
            )
        if n_train < self.batch_size:
            raise SeqlabError(
                f"data: {n_train} training samples are fewer than one batch of data.batch_size={self.batch_size}; "
                f"use more data or data.batch_size={n_train} or less"
            )
        # BatchNorm cannot train on a batch of one sample: drop such a last batch.
        self.drop_single = self._last_batch_single(n_train)
        if self.drop_single:
            log.info(
                "data      the last batch of each epoch would hold 1 sample (BatchNorm needs 2): it is dropped"
            )

    def release(self) -> None:
        """Drops the split's copies: a pack trains its members on their shared samples, and a member
        needs its own sets only at its start and its end (setup() splits them again)."""
        self.train = self.val = None
        self._train_batches = None

    def _last_batch_single(self, n: int) -> bool:
        return last_batch_single(n, self.batch_size, self.drop_last, self.n_steps)

    def _finite(self, data: SeqData, what: str) -> SeqData:
        """Samples whose inputs or targets hold NaN or Inf would make the loss NaN: refused, or
        dropped (with a count) when data.drop_nonfinite is set."""
        bad = ~(np.isfinite(data.x).all(axis=(1, 2)) & np.isfinite(data.y).all(axis=1))
        if not bad.any():
            return data
        if not self.drop_nonfinite:
            first = int(np.argmax(bad))
            raise SeqlabError(
                f"{what}: {int(bad.sum())} of {len(data)} samples hold NaN or Inf (the first is sample {first}); "
                "clean the data, or set data.drop_nonfinite=true to drop them"
            )
        log.info(
            "data      dropped %d of %d %s samples holding NaN or Inf",
            int(bad.sum()),
            len(data),
            what,
        )
        kept = data.take(np.flatnonzero(~bad))
        kept.val = data.val
        return kept

    @property
    def n_steps(self) -> int:
        return self._shaped.x.shape[1]

    @property
    def n_features(self) -> int:
        return self._shaped.x.shape[2]

    @property
    def n_outputs(self) -> int:
        return self._shaped.y.shape[1]

    @property
    def _shaped(self) -> SeqData:
        return (
            self.train if self.train is not None else self.samples
        )  # after release(): the samples' shapes

    def baseline_val_rmse(self) -> Optional[float]:
        """RMSE on validation of predicting the training mean: the score to beat."""
        if self.val is None or len(self.val) == 0:
            return None
        mean = self.train_y_mean
        return float(np.sqrt(((self.val.y.astype(np.float64) - mean) ** 2).mean()))

    def training_set(self) -> tuple[SeqData, Optional[np.ndarray]]:
        """(a set, its rows): the copy setup("fit") gathered (rows None), else the samples and the
        training rows (a pack member: what its records read of the set needs no copy of it)."""
        return (self.train, None) if self.train is not None else (self.samples, self.train_rows)

    def describe(self) -> str:
        train, rows = self.training_set()
        steps = f"{self.n_steps} step(s)"
        if train.lengths is not None:
            shortest = (train.lengths if rows is None else train.lengths[rows]).min()
            steps = f"{shortest}..{self.n_steps} steps (padded right to {self.n_steps})"
        n_val = 0 if self.val is None else len(self.val)
        n_train = len(train) if rows is None else len(rows)
        return (
            f"{self.name}: {n_train} train / {n_val} val samples, "
            f"{steps} x {self.n_features} feature(s), {self.n_outputs} response(s)"
            + (f"; {self.columns}" if self.columns else "")
        )

    def train_dataloader(self) -> Iterable[Batch]:
        x, y, lengths = _tensors(self.train)
        drop_last = self.drop_last or self.drop_single
        rank, world_size = (
            (self.trainer.global_rank, self.trainer.world_size) if self.trainer else (0, 1)
        )
        share = process_share(len(x), world_size, self.batch_size)
        if self.loader == "dataloader":
            # What people write first: per-sample indexing and collation, a copy to the device
            # each step. Kept for comparison (perf=naive).
            tensors = (x, y) if lengths is None else (x, y, lengths)
            generator = torch.Generator().manual_seed(self.seed)
            loader = DataLoader(
                TensorDataset(*tensors),
                self.batch_size,
                shuffle=self.shuffle,
                drop_last=drop_last,
                generator=generator,
            )
            # Under DDP, Lightning swaps in a DistributedSampler, which it can do only on a DataLoader
            # it sees: no profiling wrapper there.
            return loader if world_size > 1 else _Marked(loader)
        device = self.trainer.strategy.root_device if self.on_device and self.trainer else None
        # Under DDP each process trains on its share.
        if world_size > 1:
            drop_last = self.drop_last or self._last_batch_single(share)
        self._train_batches = TensorBatches(
            x,
            y,
            self.batch_size,
            self.shuffle,
            drop_last,
            self.seed,
            lengths,
            device=device,
            batches_per_item=self.batches_per_item,
            rank=rank,
            world_size=world_size,
        )
        state = getattr(self, "_resume_state", None)
        if state and "train_order" in state:
            self._train_batches.resume(state["train_order"], state["items_done"])
        return self._train_batches

    # -- checkpoints: where in the epoch's order training stopped -----------------------------
    def state_dict(self) -> dict:
        """Saved in every checkpoint (Lightning calls this): the training order's generator state at
        the start of the current epoch and how many of its items are done, so that a resumed run
        trains on exactly the samples the interrupted one had left."""
        batches = getattr(self, "_train_batches", None)
        if (
            self.loader != "tensor"
            or not isinstance(batches, TensorBatches)
            or self.trainer is None
        ):
            return {}  # a DataLoader's order is not saved: Lightning warns on a mid-epoch resume
        done = batches_done_in_epoch(self.trainer)
        if done >= len(batches):  # the epoch is over: the next one draws a new order
            return {"train_order": batches.generator.get_state(), "items_done": 0}
        return {"train_order": batches.state_dict()["generator"], "items_done": done}

    def load_state_dict(self, state: dict) -> None:
        self._resume_state = state or None

    def configure_batching(self, loader: str, on_device: bool, batches_per_item: int) -> None:
        """How training batches are served (conf/perf): `loader` 'tensor' (contiguous slices) or
        'dataloader' (a DataLoader over a TensorDataset); `on_device`: keep the data set on the
        training device; `batches_per_item`: mini-batches per item for the fused loop."""
        self.loader, self.on_device, self.batches_per_item = loader, on_device, batches_per_item

    def _in_order(self, data: SeqData) -> TensorBatches:
        # Evaluation does not depend on the batch size (BatchNorm uses its stored statistics),
        # so it runs in large batches.
        x, y, lengths = _tensors(data)
        device = self.trainer.strategy.root_device if self.on_device and self.trainer else None
        return TensorBatches(
            x, y, max(self.batch_size, 1024), False, False, self.seed, lengths, device=device
        )

    def train_eval_batches(self) -> TensorBatches:
        """Every training sample once, in order (BatchNorm's population pass)."""
        return self._in_order(self.train)

    def has_val(self) -> bool:
        return self.val is not None and len(self.val) > 0

    def val_dataloader(self) -> TensorBatches | list:
        return self._in_order(self.val) if self.has_val() else []
