"""A run's dataset digest is MLflow's own, computed without copying the whole arrays."""

import numpy as np
import pytest
from mlflow.data.digest_utils import compute_numpy_digest

from seqlab.tracking.datasets import numpy_digest


@pytest.mark.parametrize(
    "layout", ["contiguous", "a slice of rows", "transposed", "fewer values than MLflow hashes"]
)
def test_the_digest_is_mlflows(layout):
    rng = np.random.default_rng(0)
    x = rng.random((900, 3, 40), dtype=np.float32)
    y = rng.random((900, 2), dtype=np.float32)
    if layout == "a slice of rows":
        x, y = x[::3], y[::3]
    elif layout == "transposed":
        x = x.transpose(2, 1, 0)
    elif layout == "fewer values than MLflow hashes":
        x, y = x[:5], y[:5]
    assert numpy_digest(x, y) == compute_numpy_digest(x, y)
    assert numpy_digest(x, None) == compute_numpy_digest(x)


def test_the_digest_sees_the_values_it_hashes_and_the_shape():
    x = np.zeros((20_000, 1), dtype=np.float32)
    changed = x.copy()
    changed[5] = 1.0
    assert numpy_digest(changed, None) != numpy_digest(x, None)
    assert numpy_digest(x[:-1], None) != numpy_digest(x, None)  # the shape, past the hashed values
