"""Sources: each returns a SeqData whatever the file or generator behind it.

X is (N, steps, features) float32 and y (N, responses) float32. Sequences of different lengths
are padded on the right with zeros to the longest (as MATLAB's SequencePaddingDirection='right'
does), and `lengths` keeps each one's real length, so that the LSTM's last output is taken at the
last real step, not at padding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
import torch

from seqlab import SeqlabError


@dataclass
class SeqData:
    x: np.ndarray  # (N, steps, features) float32
    y: np.ndarray  # (N, responses) float32
    lengths: Optional[np.ndarray] = None  # (N,) int64 real steps, only where they differ
    val: Optional["SeqData"] = None  # a validation set that came with the data
    columns: Optional[str] = (
        None  # what a table's columns were taken for (its index, the target): the data line says it
    )

    def __len__(self) -> int:
        return len(self.x)

    def first(self, n: Optional[int]) -> "SeqData":
        if n is None or n >= len(self):
            return self
        lengths = None if self.lengths is None else self.lengths[:n]
        return SeqData(self.x[:n], self.y[:n], lengths, self.val, self.columns)

    def take(self, index: np.ndarray) -> "SeqData":
        lengths = None if self.lengths is None else self.lengths[index]
        # torch's gather: its threads and its allocator's huge pages (seqlab/__init__.py). A pack
        # splits each member's set at its start and again at its end, 94 MB of fresh memory a
        # member for 16,384 days, and NumPy's took 0.09 s of it, most of it faulting it in.
        if self.x.flags.c_contiguous and self.x.flags.writeable:
            rows = torch.from_numpy(np.asarray(index, dtype=np.int64))
            x = torch.from_numpy(self.x).index_select(0, rows).numpy()
        else:  # torch takes neither a read-only array (a file's memory map) nor negative strides
            x = self.x[index]
        return SeqData(x, self.y[index], lengths, columns=self.columns)


def as_sequences(
    x: np.ndarray, y: np.ndarray, origin: str, lengths: Optional[np.ndarray] = None
) -> SeqData:
    """Bring X to (N, steps, features) and y to (N, responses), both float32."""
    x = np.asarray(x, dtype=np.float32)
    y = np.asarray(y, dtype=np.float32)
    if x.ndim == 2:
        x = x[:, None, :]  # one step per sample
    if x.ndim != 3:
        raise SeqlabError(
            f"{origin}: X must be (N, features) or (N, steps, features), got shape {x.shape}"
        )
    if y.ndim not in (1, 2) or y.shape[0] != x.shape[0]:
        raise SeqlabError(
            f"{origin}: y must be (N,) or (N, responses) with N={x.shape[0]} as in X, got shape {y.shape}"
        )
    if y.ndim == 1:
        y = y[:, None]
    if lengths is not None:
        lengths = np.asarray(lengths, dtype=np.int64).reshape(-1)
        if len(lengths) != len(x) or lengths.min() < 1 or lengths.max() > x.shape[1]:
            raise SeqlabError(f"{origin}: lengths must be N={len(x)} values in 1..{x.shape[1]}")
        if (lengths == x.shape[1]).all():
            lengths = None  # nothing is padded
    return SeqData(np.ascontiguousarray(x), np.ascontiguousarray(y), lengths)


def pad_sequences(sequences: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(steps_i, features) arrays -> (N, longest, features) right-padded with zeros, lengths."""
    lengths = np.array([len(s) for s in sequences], dtype=np.int64)
    features = {s.shape[1] for s in sequences}
    if len(features) != 1:
        raise SeqlabError(f"sequences have different numbers of features: {sorted(features)}")
    out = np.zeros((len(sequences), lengths.max(), features.pop()), dtype=np.float32)
    for i, s in enumerate(sequences):
        out[i, : len(s)] = s
    return out, lengths


def synthetic_daily_load(
    n_samples: Optional[int],
    seed: int,
    layout: str = "windows",
    seq_len: int = 1,
    n_features: int = 1440,
    noise: float = 0.05,
    out: Optional[np.ndarray] = None,
) -> SeqData:
    """Daily load curves (a base level shaped by a day cycle, plus morning and evening peaks), one
    per day, `seq_len` days per sample; the target is the next day's mean load. The level drifts
    by a per-sample trend, so longer sequences carry more information about the target.

    layout='windows': X is (N, seq_len, n_features), one day per step (the MATLAB seed's input);
    layout='profile': X is (N, seq_len * n_features, 1), the days as one univariate series.

    out: where X is drawn, float32 C-contiguous of X's shape (the same values as without it): a
    pack's one buffer for all its sets (packing.build.load_samples), which then need no joining.
    """
    if n_samples is None:
        raise SeqlabError("data.n_samples must be set for synthetic data")
    if layout not in ("windows", "profile"):
        raise SeqlabError(f"data.source.layout must be 'windows' or 'profile', got {layout!r}")
    # Drawn with torch's generator in float32, in place: the noise is most of the work (23.6M
    # draws for 16,384 days of 1,440 minutes), and NumPy's float64 draws and temporaries took
    # 0.5-0.9 s a set where this takes about 0.2 s; a pack of 32 seeds makes 32 sets. torch's CPU
    # normal draws one stream whatever its thread count, so a seed gives the same data anywhere.
    g = torch.Generator().manual_seed(seed)
    n = n_samples
    t = torch.arange(n_features, dtype=torch.float64) / n_features  # time of day in [0, 1)
    cycle = 1.0 + 0.3 * torch.sin(2 * math.pi * (t - 0.25))
    morning_peak = torch.exp(-(((t - 0.33) / 0.04) ** 2))
    evening_peak = torch.exp(-(((t - 0.79) / 0.04) ** 2))

    def uniform(low: float, high: float) -> torch.Tensor:
        return torch.rand((n, 1, 1), generator=g, dtype=torch.float64) * (high - low) + low

    level, trend = uniform(0.5, 1.5), uniform(-0.1, 0.1)
    morning, evening = uniform(0.0, 0.5), uniform(0.0, 1.0)
    days = torch.arange(seq_len, dtype=torch.float64).reshape(1, -1, 1)

    if out is not None and (out.shape[0] != n or out.size != n * seq_len * n_features):
        raise ValueError(f"out: {out.shape} does not hold {n} samples of {seq_len} x {n_features}")
    into = None if out is None else torch.from_numpy(out).view(n, seq_len, n_features)
    # Each term added in place, broadcast from its (samples, days, 1) factor: no temporary as
    # large as x, whose fresh memory would cost as much again.
    x = torch.randn((n, seq_len, n_features), generator=g, out=into).mul_(noise)
    x.addcmul_((level + trend * days).float(), cycle.float())
    x.addcmul_(morning.float(), morning_peak.float()).addcmul_(
        evening.float(), evening_peak.float()
    )
    next_level = level[:, :, 0] + trend[:, :, 0] * seq_len
    y = (
        next_level * cycle.mean()
        + morning[:, :, 0] * morning_peak.mean()
        + evening[:, :, 0] * evening_peak.mean()
        + noise * torch.randn((n, 1), generator=g, dtype=torch.float64)
    )
    # `out` itself, not a new array over its memory: a view of the pack's buffer is what lets
    # packing.data.joined see the sets lie one after another.
    x, y = (x.numpy() if out is None else out), y.numpy()
    if layout == "profile" and out is None:
        x = x.reshape(n, seq_len * n_features, 1)
    return as_sequences(x, y, "synthetic data")


def load_npz(
    path: str,
    n_samples: Optional[int],
    seed: int,
    x_key: Optional[str] = None,
    y_key: Optional[str] = None,
) -> SeqData:
    """A .npz file: X (N, [steps,] features) and y (N[, responses]); optional `lengths` (real
    steps of right-padded sequences) and X_val/y_val[/lengths_val] (a validation set)."""
    x_key, y_key = x_key or "X", y_key or "y"
    try:
        archive = np.load(path)
    except (ValueError, OSError, EOFError) as error:
        raise SeqlabError(
            f"{path}: not a NumPy .npz file ({' '.join(str(error).split()) or 'empty file'})"
        ) from None
    if not hasattr(archive, "files"):
        raise SeqlabError(f"{path}: a single .npy array, not a .npz archive with X and y")
    with archive as f:
        missing = [k for k in (x_key, y_key) if k not in f.files]
        if missing:
            raise SeqlabError(
                f"{path}: no array named {', '.join(missing)} (found: {', '.join(f.files) or 'none'}); "
                "set data.x_key / data.y_key"
            )
        data = as_sequences(
            f[x_key], f[y_key], path, f["lengths"] if "lengths" in f.files else None
        )
        if "X_val" in f.files and "y_val" in f.files:
            lengths_val = f["lengths_val"] if "lengths_val" in f.files else None
            data.val = as_sequences(f["X_val"], f["y_val"], f"{path} (X_val, y_val)", lengths_val)
    return data.first(n_samples)
