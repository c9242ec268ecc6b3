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


@pytest.mark.parametrize("shape", [(900, 1, 40), (900, 3, 4), (900, 1, 20_000)])
def test_a_set_given_as_rows_of_its_samples_is_recorded_as_its_gathered_copy(shape):
    """A pack member's training set, recorded from the samples and its rows (no copy of the set):
    the same digest, profile and schema as MLflow gives the gathered set."""
    from omegaconf import OmegaConf

    from seqlab.tracking.datasets import dataset

    rng = np.random.default_rng(1)
    x = rng.random(shape, dtype=np.float32)
    y = rng.random((shape[0], 2), dtype=np.float32)
    rows = rng.permutation(shape[0])[:700]
    cfg = OmegaConf.create(
        {"name": "synthetic", "n_samples": 900, "seed": 3, "source": {"noise": 0.1}}
    )
    gathered = dataset(cfg, x[rows], y[rows], "synthetic-train")
    given = dataset(cfg, x, y, "synthetic-train", rows)
    assert given.digest == gathered.digest
    assert given.profile == gathered.profile and given.schema == gathered.schema
    assert given._to_mlflow_entity() == gathered._to_mlflow_entity()
    changed = x.copy()
    changed[rows[0], 0, 0] += 1.0  # the set's first value
    assert dataset(cfg, changed, y, "synthetic-train", rows).digest != gathered.digest
