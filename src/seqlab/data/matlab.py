"""MATLAB .mat files as trainNetwork takes them: XrTrain as an N-by-1 cell array of C-by-S
(or 1440x1x1xS) sequences, or a numeric N-by-C matrix; YrTrain as an N-by-R matrix.

Versions 5/7 are read with scipy, 7.3 (HDF5) with h5py. Both are first brought to the same
picture of each variable, in MATLAB's own dimension order: a numeric array with MATLAB's shape,
or a `Cell` of such arrays. HDF5 stores MATLAB arrays with their dimensions reversed, and cells as
object references; that is undone when reading."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

import numpy as np

from seqlab import SeqlabError
from seqlab.data.sources import SeqData, as_sequences, pad_sequences

log = logging.getLogger("seqlab")

X_EXPECTED = (
    "an N-by-1 cell array of C-by-S or 1440x1x1xS arrays, or a numeric N x C (or C x N) matrix"
)


@dataclass
class Cell:
    shape: tuple[int, ...]
    items: list[np.ndarray]  # in MATLAB's linear (column-major) order


Value = Union[np.ndarray, Cell]


def _shape(value: Value) -> str:
    return "x".join(str(d) for d in value.shape)


def read_mat(path: str) -> dict[str, Value]:
    """Every variable of a .mat file, in MATLAB's dimension order."""
    if not Path(path).is_file():
        raise SeqlabError(f"data.path={path}: no such file")
    import h5py  # h5py and scipy.io: a .mat file only (most data never reads one)

    if h5py.is_hdf5(path):
        return _read_v73(path)
    import scipy.io  # a v5/v7 .mat file only

    try:
        raw = scipy.io.loadmat(path)
    except Exception as error:  # scipy raises several types for files that are not MAT files
        raise SeqlabError(f"{path}: not a MATLAB .mat file (v5/v7 or v7.3): {error}") from None
    out: dict[str, Value] = {}
    for name, value in raw.items():
        if name.startswith("__"):
            continue
        if isinstance(value, np.ndarray) and value.dtype == object:
            out[name] = Cell(value.shape, [np.asarray(v) for v in value.ravel(order="F")])
        else:
            out[name] = np.asarray(value)
    return out


def _read_v73(path: str) -> dict[str, Value]:
    import h5py  # a v7.3 .mat file only

    def convert(ds: "h5py.Dataset", f: "h5py.File") -> Value:
        matlab_class = ds.attrs.get("MATLAB_class", b"")
        matlab_class = (
            matlab_class.decode() if isinstance(matlab_class, bytes) else str(matlab_class)
        )
        if "MATLAB_empty" in ds.attrs and ds.attrs["MATLAB_empty"]:
            return np.zeros((0, 0))
        data = ds[()]
        if matlab_class == "cell":
            refs = np.asarray(data).T  # reversed dimensions -> MATLAB's
            return Cell(refs.shape, [convert(f[r], f) for r in refs.ravel(order="F")])
        return np.asarray(data).T

    out: dict[str, Value] = {}
    with h5py.File(path, "r") as f:
        for name, item in f.items():
            if name.startswith("#") or not isinstance(item, h5py.Dataset):
                continue
            out[name] = convert(item, f)
    return out


def _sequence(item: np.ndarray, path: str, key: str, index: int) -> np.ndarray:
    """One cell: C-by-S (2-D) or h-by-w-by-c-by-S (3-D/4-D) -> (S, features)."""
    a = np.asarray(item, dtype=np.float32)
    if a.ndim == 2:
        return a.T
    if a.ndim in (3, 4):
        h, w, c = a.shape[:3]
        steps = a.shape[3] if a.ndim == 4 else 1
        return a.reshape(h * w * c, steps, order="F").T
    raise SeqlabError(
        f"{path}: {key}{{{index + 1}}} is {_shape(a)}; expected C-by-S or 1440x1x1xS (cells of {X_EXPECTED})"
    )


def _inputs(
    value: Value, n: int, path: str, key: str
) -> tuple[np.ndarray, Optional[np.ndarray], str]:
    if isinstance(value, Cell):
        if len(value.shape) != 2 or 1 not in value.shape or len(value.items) != n:
            raise SeqlabError(
                f"{path}: {key} is a {_shape(value)} cell array; expected {X_EXPECTED}, with N={n} as in the responses"
            )
        if any(not isinstance(item, np.ndarray) or item.dtype == object for item in value.items):
            raise SeqlabError(f"{path}: {key} holds cells inside cells; expected {X_EXPECTED}")
        sequences = [_sequence(item, path, key, i) for i, item in enumerate(value.items)]
        x, lengths = pad_sequences(sequences)
        first = _shape(value.items[0])
        return (
            x,
            lengths,
            f"{_shape(value)} cell array of {first}{' ...' if lengths.min() != lengths.max() else ''} arrays",
        )
    a = np.asarray(value)
    if a.dtype.kind not in "fiub":
        raise SeqlabError(
            f"{path}: {key} is {a.dtype.kind!r} data, not numbers; expected {X_EXPECTED}"
        )
    if a.ndim == 2:
        if a.shape[0] == n:
            return a[:, None, :], None, f"{_shape(a)} matrix (N x C)"
        if a.shape[1] == n:
            return a.T[:, None, :], None, f"{_shape(a)} matrix (C x N)"
    if a.ndim == 4 and a.shape[3] == n:  # h x w x c x N, one step each
        return a.reshape(-1, n, order="F").T[:, None, :], None, f"{_shape(a)} array (h x w x c x N)"
    raise SeqlabError(
        f"{path}: {key} is a {_shape(a)} array; expected {X_EXPECTED}, with N={n} as in the responses"
    )


def _responses(value: Value, path: str, key: str) -> np.ndarray:
    a = value if isinstance(value, np.ndarray) else None
    if a is None or a.dtype.kind not in "fiub" or a.ndim != 2:
        shape = _shape(value)
        kind = "cell array" if isinstance(value, Cell) else "array"
        raise SeqlabError(
            f"{path}: {key} is a {shape} {kind}; expected a numeric N-by-1 vector or N-by-R matrix"
        )
    if a.shape[0] == 1 and a.shape[1] > 1:
        return a.T  # a row vector: one response per column
    return a


def _pair(variables: dict[str, Value], path: str, x_key: str, y_key: str) -> SeqData:
    y = _responses(variables[y_key], path, y_key)
    x, lengths, what = _inputs(variables[x_key], len(y), path, x_key)
    data = as_sequences(x, y, path, lengths)
    steps = (
        f"{data.x.shape[1]}"
        if lengths is None
        else f"{lengths.min()}..{lengths.max()} (padded right)"
    )
    log.info(
        "mat       %s: %s = %s -> N=%d, %d feature(s), steps %s; %s = %s",
        Path(path).name,
        x_key,
        what,
        len(data),
        data.x.shape[2],
        steps,
        y_key,
        _shape(variables[y_key]),
    )
    return data


def load_mat(
    path: str,
    n_samples: Optional[int],
    seed: int,
    x_key: Optional[str] = None,
    y_key: Optional[str] = None,
    x_val_key: Optional[str] = "XrVal",
    y_val_key: Optional[str] = "YrVal",
) -> SeqData:
    x_key, y_key = x_key or "XrTrain", y_key or "YrTrain"
    variables = read_mat(path)
    missing = [k for k in (x_key, y_key) if k not in variables]
    if missing:
        found = ", ".join(f"{k} ({_shape(v)})" for k, v in variables.items()) or "none"
        raise SeqlabError(
            f"{path}: no variable {', '.join(missing)} (found: {found}); set data.x_key / data.y_key"
        )
    data = _pair(variables, path, x_key, y_key)
    if x_val_key in variables and y_val_key in variables:
        data.val = _pair(variables, path, x_val_key, y_val_key)
    return data.first(n_samples)
