"""Data: sources that return (X, y) arrays, and the DataModule that splits and batches them.

X is always (N, steps, features) float32 and y (N, responses) float32, whatever the source.
Batches are sliced from contiguous tensors (one gather per epoch), not assembled sample by sample
by a DataLoader: for a model this small, per-sample collation costs more than the model.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable, Iterator, Optional

import pytorch_lightning as pl
import numpy as np
import torch

from seqlab import SeqlabError

Arrays = tuple[np.ndarray, np.ndarray]


def as_sequences(x: np.ndarray, y: np.ndarray, origin: str) -> Arrays:
    """Bring X to (N, steps, features) and y to (N, responses), both float32."""
    x = np.asarray(x, dtype=np.float32)
    y = np.asarray(y, dtype=np.float32)
    if x.ndim == 2:
        x = x[:, None, :]  # one step per sample
    if x.ndim != 3:
        raise SeqlabError(f"{origin}: X must be (N, features) or (N, steps, features), got shape {x.shape}")
    if y.ndim not in (1, 2) or y.shape[0] != x.shape[0]:
        raise SeqlabError(
            f"{origin}: y must be (N,) or (N, responses) with N={x.shape[0]} as in X, got shape {y.shape}"
        )
    if y.ndim == 1:
        y = y[:, None]
    return np.ascontiguousarray(x), np.ascontiguousarray(y)


def _first(x: np.ndarray, y: np.ndarray, n_samples: Optional[int]) -> Arrays:
    return (x, y) if n_samples is None else (x[:n_samples], y[:n_samples])


def synthetic_daily_load(
    n_samples: Optional[int],
    seed: int,
    layout: str = "windows",
    seq_len: int = 1,
    n_features: int = 1440,
    noise: float = 0.05,
) -> Arrays:
    """Daily load curves (a base level shaped by a day cycle, plus morning and evening peaks), one
    per day, `seq_len` days per sample; the target is the next day's mean load. The level drifts
    by a per-sample trend, so longer sequences carry more information about the target.

    layout='windows': X is (N, seq_len, n_features), one day per step (the MATLAB seed's input);
    layout='profile': X is (N, seq_len * n_features, 1), the days as one univariate series.
    """
    if n_samples is None:
        raise SeqlabError("data.n_samples must be set for synthetic data")
    if layout not in ("windows", "profile"):
        raise SeqlabError(f"data.source.layout must be 'windows' or 'profile', got {layout!r}")
    rng = np.random.default_rng(seed)
    n = n_samples
    t = np.arange(n_features, dtype=np.float64) / n_features  # time of day in [0, 1)
    cycle = 1.0 + 0.3 * np.sin(2 * np.pi * (t - 0.25))
    morning_peak = np.exp(-(((t - 0.33) / 0.04) ** 2))
    evening_peak = np.exp(-(((t - 0.79) / 0.04) ** 2))

    level = rng.uniform(0.5, 1.5, (n, 1, 1))
    trend = rng.uniform(-0.1, 0.1, (n, 1, 1))
    morning = rng.uniform(0.0, 0.5, (n, 1, 1))
    evening = rng.uniform(0.0, 1.0, (n, 1, 1))
    days = np.arange(seq_len).reshape(1, -1, 1)

    x = (level + trend * days) * cycle + morning * morning_peak + evening * evening_peak
    x = x + noise * rng.standard_normal((n, seq_len, n_features))
    next_level = level[:, :, 0] + trend[:, :, 0] * seq_len
    y = (
        next_level * cycle.mean()
        + morning[:, :, 0] * morning_peak.mean()
        + evening[:, :, 0] * evening_peak.mean()
        + noise * rng.standard_normal((n, 1))
    )
    if layout == "profile":
        x = x.reshape(n, seq_len * n_features, 1)
    return as_sequences(x, y, "synthetic data")


def load_npz(path: str, n_samples: Optional[int], seed: int, x_key: str = "X", y_key: str = "y") -> Arrays:
    """A .npz file holding X (N, [steps,] features) and y (N[, responses])."""
    with np.load(path) as f:
        missing = [k for k in (x_key, y_key) if k not in f.files]
        if missing:
            raise SeqlabError(
                f"{path}: no array named {', '.join(missing)} (found: {', '.join(f.files) or 'none'}); "
                "set data.source.x_key / data.source.y_key"
            )
        x, y = f[x_key], f[y_key]
    return _first(*as_sequences(x, y, path), n_samples)


def load_csv(
    path: str,
    n_samples: Optional[int],
    seed: int,
    seq_len: int = 1,
    header: str | bool = "auto",
    delimiter: str = ",",
) -> Arrays:
    """One sample per row: seq_len * features input values (step-major), target last."""
    lines = Path(path).read_text().splitlines()
    if header == "auto":
        first = lines[0].split(delimiter) if lines else []
        header = not all(_is_number(v) for v in first)
    rows = lines[1:] if header else lines
    values = []
    for lineno, line in enumerate(rows, start=2 if header else 1):
        if not line.strip():
            continue
        cells = line.split(delimiter)
        try:
            values.append([float(c) for c in cells])
        except ValueError:
            bad = next(c for c in cells if not _is_number(c))
            raise SeqlabError(f"{path}:{lineno}: not a number: {bad.strip()!r}") from None
    widths = {len(r) for r in values}
    if len(widths) != 1:
        raise SeqlabError(f"{path}: rows have different numbers of columns: {sorted(widths)}")
    table = np.asarray(values, dtype=np.float32)
    n_inputs = table.shape[1] - 1
    if n_inputs < 1 or n_inputs % seq_len:
        raise SeqlabError(
            f"{path}: {n_inputs} input columns cannot be split into data.source.seq_len={seq_len} steps"
        )
    x = table[:, :n_inputs].reshape(len(table), seq_len, n_inputs // seq_len)
    return _first(*as_sequences(x, table[:, n_inputs], path), n_samples)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


class TensorBatches:
    """Mini-batches sliced from contiguous tensors, reshuffled at the start of every pass."""

    def __init__(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        batch_size: int,
        shuffle: bool,
        drop_last: bool,
        seed: int,
    ) -> None:
        self.x, self.y = x, y
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.generator = torch.Generator().manual_seed(seed)

    def __len__(self) -> int:
        n = len(self.x)
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        x, y = self.x, self.y
        if self.shuffle:
            order = torch.randperm(len(x), generator=self.generator)
            x, y = x[order], y[order]
        bs = self.batch_size
        for i in range(len(self)):
            yield x[i * bs : (i + 1) * bs], y[i * bs : (i + 1) * bs]


class SeqDataModule(pl.LightningDataModule):
    """Loads a source once, splits it into train/validation with a seeded permutation, and serves
    batches. Shapes are known after `setup()`: the model is sized from them."""

    def __init__(
        self,
        source: Callable[..., Arrays],
        name: str = "data",
        path: Optional[str] = None,
        n_samples: Optional[int] = None,
        batch_size: int = 64,
        val_fraction: float = 0.2,
        seed: int = 0,
        shuffle: bool = True,
        drop_last: bool = False,
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
        self.x_train: Optional[torch.Tensor] = None

    def setup(self, stage: Optional[str] = None) -> None:
        if self.x_train is not None:
            return
        x, y = self.source(n_samples=self.n_samples, seed=self.seed)
        n = len(x)
        n_val = round(n * self.val_fraction)
        if self.val_fraction > 0 and n_val == 0 and n > 1:
            n_val = 1
        order = np.random.default_rng(self.seed).permutation(n)
        train, val = order[n_val:], order[:n_val]
        if len(train) == 0 or (self.drop_last and len(train) < self.batch_size):
            raise SeqlabError(
                f"data: {len(train)} training samples make no full batch of data.batch_size="
                f"{self.batch_size}; use more data or a smaller batch"
            )
        self.x_train, self.y_train = torch.from_numpy(x[train]), torch.from_numpy(y[train])
        self.x_val, self.y_val = torch.from_numpy(x[val]), torch.from_numpy(y[val])

    @property
    def n_steps(self) -> int:
        return self.x_train.shape[1]

    @property
    def n_features(self) -> int:
        return self.x_train.shape[2]

    @property
    def n_outputs(self) -> int:
        return self.y_train.shape[1]

    def baseline_val_rmse(self) -> Optional[float]:
        """RMSE on validation of predicting the training mean: the score to beat."""
        if len(self.y_val) == 0:
            return None
        mean = self.y_train.double().mean(dim=0)
        return float(((self.y_val.double() - mean) ** 2).mean().sqrt())

    def describe(self) -> str:
        return (
            f"{self.name}: {len(self.x_train)} train / {len(self.x_val)} val samples, "
            f"{self.n_steps} step(s) x {self.n_features} feature(s), {self.n_outputs} response(s)"
        )

    def train_dataloader(self) -> TensorBatches:
        return TensorBatches(
            self.x_train, self.y_train, self.batch_size, self.shuffle, self.drop_last, self.seed
        )

    def val_dataloader(self) -> TensorBatches | list:
        if len(self.x_val) == 0:
            return []
        # Evaluation does not depend on the batch size (BatchNorm uses its running statistics),
        # so validate in large batches.
        return TensorBatches(
            self.x_val, self.y_val, max(self.batch_size, 1024), False, False, self.seed
        )
