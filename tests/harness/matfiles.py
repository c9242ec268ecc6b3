"""Writers of MATLAB .mat files for the tests: v5 through scipy, and v7.3 laid out as MATLAB
lays it out in HDF5 (a 512-byte header block, dimensions reversed, cells as object references
into '#refs#', a MATLAB_class attribute on every variable)."""

from __future__ import annotations

from pathlib import Path
from typing import Union

import numpy as np


class MatCell:
    """A MATLAB cell array: `shape` and its items in column-major order."""

    def __init__(self, items: list[np.ndarray], shape: tuple[int, int] | None = None) -> None:
        self.items = items
        self.shape = shape or (len(items), 1)


Variable = Union[np.ndarray, MatCell]


def write_v5(path: Path, variables: dict[str, Variable]) -> None:
    import scipy.io

    out = {}
    for name, value in variables.items():
        if isinstance(value, MatCell):
            cell = np.empty(value.shape, dtype=object)
            for i, item in enumerate(value.items):
                cell[np.unravel_index(i, value.shape, order="F")] = item
            out[name] = cell
        else:
            out[name] = value
    scipy.io.savemat(path, out)


def write_v73(path: Path, variables: dict[str, Variable]) -> None:
    import h5py

    with h5py.File(path, "w", userblock_size=512) as f:
        refs = f.create_group("#refs#")
        for name, value in variables.items():
            if isinstance(value, MatCell):
                handles = []
                for i, item in enumerate(value.items):
                    ds = refs.create_dataset(
                        f"{name}_{i}", data=np.asarray(item, dtype=np.float64).T
                    )
                    ds.attrs["MATLAB_class"] = np.bytes_("double")
                    handles.append(ds.ref)
                grid = np.empty(value.shape, dtype=h5py.ref_dtype)
                for i, handle in enumerate(handles):
                    grid[np.unravel_index(i, value.shape, order="F")] = handle
                ds = f.create_dataset(name, data=grid.T, dtype=h5py.ref_dtype)
                ds.attrs["MATLAB_class"] = np.bytes_("cell")
            else:
                ds = f.create_dataset(name, data=np.asarray(value, dtype=np.float64).T)
                ds.attrs["MATLAB_class"] = np.bytes_("double")
    with open(path, "r+b") as f:
        f.write(
            b"MATLAB 7.3 MAT-file, Platform: GLNXA64, Created on: Sun Nov 29 00:00:00 2026 HDF5 schema 1.00 ."
        )
