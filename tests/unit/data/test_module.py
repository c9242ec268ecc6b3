"""Data sources, the batcher and the DataModule."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from seqlab import SeqlabError
from seqlab.data import (
    SeqDataModule,
    TensorBatches,
    load_csv,
    load_npz,
    pad_sequences,
    synthetic_daily_load,
)


def _xy(data):
    return data.x, data.y


def test_synthetic_is_deterministic_and_shaped_like_the_matlab_input():
    x1, y1 = _xy(synthetic_daily_load(64, seed=3, seq_len=2))
    x2, y2 = _xy(synthetic_daily_load(64, seed=3, seq_len=2))
    x3, _ = _xy(synthetic_daily_load(64, seed=4, seq_len=2))
    assert x1.shape == (64, 2, 1440) and y1.shape == (64, 1)
    assert x1.dtype == np.float32 and y1.dtype == np.float32
    np.testing.assert_array_equal(x1, x2)
    np.testing.assert_array_equal(y1, y2)
    assert not np.array_equal(x1, x3)


def test_daily_profile_layout_is_one_feature_by_1440_steps():
    windows, yw = _xy(synthetic_daily_load(8, seed=0, layout="windows"))
    profile, yp = _xy(synthetic_daily_load(8, seed=0, layout="profile"))
    assert profile.shape == (8, 1440, 1)
    np.testing.assert_array_equal(profile[:, :, 0], windows[:, 0, :])
    np.testing.assert_array_equal(yw, yp)


def test_synthetic_target_is_learnable_from_the_input():
    """A real signal: least squares on three summary features explains most of the variance."""
    x, y = _xy(synthetic_daily_load(2000, seed=0))
    day = x[:, -1, :]
    feats = np.c_[day.mean(1), day[:, 460:500].mean(1), day[:, 1120:1160].mean(1), np.ones(len(x))]
    coef, *_ = np.linalg.lstsq(feats[:1500], y[:1500], rcond=None)
    rmse = np.sqrt(np.mean((feats[1500:] @ coef - y[1500:]) ** 2))
    assert rmse < 0.5 * y[1500:].std()


def test_npz_round_trip_and_first_n(tmp_path):
    x = np.random.default_rng(0).normal(size=(10, 3, 5))
    y = np.arange(10.0)
    np.savez(tmp_path / "d.npz", X=x, y=y)
    xl, yl = _xy(load_npz(str(tmp_path / "d.npz"), n_samples=4, seed=0))
    assert xl.shape == (4, 3, 5) and yl.shape == (4, 1)
    np.testing.assert_allclose(xl, x[:4].astype(np.float32))
    np.testing.assert_array_equal(yl[:, 0], [0, 1, 2, 3])


def test_npz_two_dimensional_x_is_one_step(tmp_path):
    np.savez(tmp_path / "d.npz", X=np.ones((6, 7)), y=np.ones(6))
    x, _ = _xy(load_npz(str(tmp_path / "d.npz"), n_samples=None, seed=0))
    assert x.shape == (6, 1, 7)


def test_npz_missing_key_names_what_was_found(tmp_path):
    np.savez(tmp_path / "d.npz", inputs=np.ones((2, 3)), y=np.ones(2))
    with pytest.raises(SeqlabError, match=r"no array named X \(found: inputs, y\)"):
        load_npz(str(tmp_path / "d.npz"), n_samples=None, seed=0)


def test_npz_mismatched_lengths(tmp_path):
    np.savez(tmp_path / "d.npz", X=np.ones((5, 3)), y=np.ones(4))
    with pytest.raises(SeqlabError, match=r"y must be .* with N=5 as in X, got shape \(4,\)"):
        load_npz(str(tmp_path / "d.npz"), n_samples=None, seed=0)


def test_csv_with_header_and_steps(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("a,b,c,d,target\n1,2,3,4,10\n5,6,7,8,20\n")
    x, y = _xy(load_csv(str(path), n_samples=None, seed=0, seq_len=2))
    assert x.shape == (2, 2, 2)
    np.testing.assert_array_equal(x[1], [[5, 6], [7, 8]])
    np.testing.assert_array_equal(y[:, 0], [10, 20])


def test_csv_non_numeric_cell_names_line_and_value(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("1,2,3\n4,oops,6\n")
    with pytest.raises(SeqlabError, match=r"d.csv:2: not a number: 'oops'"):
        load_csv(str(path), n_samples=None, seed=0)


def test_batches_cover_every_sample_once_and_reshuffle_each_epoch():
    x = torch.arange(10.0).reshape(10, 1, 1)
    batches = TensorBatches(x, x[:, 0], batch_size=4, shuffle=True, drop_last=False, seed=0)
    assert len(batches) == 3
    epoch1 = torch.cat([b[0].flatten() for b in batches])
    epoch2 = torch.cat([b[0].flatten() for b in batches])
    assert sorted(epoch1.tolist()) == list(range(10)) == sorted(epoch2.tolist())
    assert not torch.equal(epoch1, epoch2)
    for xb, yb in batches:  # inputs and targets stay paired after shuffling
        torch.testing.assert_close(xb[:, 0], yb)


def test_drop_last_drops_the_partial_batch():
    x = torch.zeros(10, 1, 1)
    batches = TensorBatches(x, x[:, 0], batch_size=4, shuffle=False, drop_last=True, seed=0)
    assert len(batches) == 2 and [len(b[0]) for b in batches] == [4, 4]


def _module(**kwargs):
    source = lambda n_samples, seed: synthetic_daily_load(n_samples, seed)  # noqa: E731
    return SeqDataModule(source, **{"n_samples": 100, "batch_size": 16, **kwargs})


def test_datamodule_split_is_seeded_and_disjoint():
    a, b = _module(seed=1), _module(seed=1)
    a.setup(), b.setup()
    assert (len(a.train), len(a.val)) == (80, 20)
    np.testing.assert_array_equal(a.val.x, b.val.x)
    train_rows = {tuple(r[0, :3].tolist()) for r in a.train.x}
    assert not any(tuple(r[0, :3].tolist()) in train_rows for r in a.val.x)
    assert (a.n_steps, a.n_features, a.n_outputs) == (1, 1440, 1)
    expected = float(
        np.sqrt(((a.val.y.astype(np.float64) - a.train.y.astype(np.float64).mean()) ** 2).mean())
    )
    assert a.baseline_val_rmse() == pytest.approx(expected)


def test_a_split_again_for_validation_alone_is_the_fits_validation_set_baseline_and_example():
    """What a run's end reads (stage "validate", packing.member_runs) without the training inputs."""
    fit = _module(seed=1)
    fit.setup("fit")
    samples = fit.samples or fit.load()
    end = _module(seed=1)
    end.setup("validate", samples=samples)
    assert end.train is None
    np.testing.assert_array_equal(end.val.x, fit.val.x)
    np.testing.assert_array_equal(end.val.y, fit.val.y)
    assert end.baseline_val_rmse() == fit.baseline_val_rmse()
    np.testing.assert_array_equal(end.example_x, fit.train.x[: len(end.example_x)])
    end.setup("fit")  # and the training set where it is asked for after all
    np.testing.assert_array_equal(end.train.x, fit.train.x)


def test_a_validation_set_that_comes_with_the_data_is_used_as_it_is(tmp_path):
    rng = np.random.default_rng(0)
    np.savez(
        tmp_path / "d.npz",
        X=rng.normal(size=(30, 2, 4)),
        y=np.arange(30.0),
        X_val=rng.normal(size=(7, 2, 4)),
        y_val=np.arange(7.0),
    )
    dm = SeqDataModule(
        lambda n_samples, seed: load_npz(str(tmp_path / "d.npz"), n_samples, seed), batch_size=8
    )
    dm.setup()
    assert (len(dm.train), len(dm.val)) == (30, 7)
    np.testing.assert_array_equal(dm.val.y[:, 0], np.arange(7.0))


def test_ragged_sequences_carry_their_lengths_through_the_batches():
    x, lengths = pad_sequences([np.ones((3, 2)), 2 * np.ones((1, 2)), 3 * np.ones((2, 2))])
    assert x.shape == (3, 3, 2)
    np.testing.assert_array_equal(lengths, [3, 1, 2])
    np.testing.assert_array_equal(x[1], [[2, 2], [0, 0], [0, 0]])  # padded right with zeros
    batches = TensorBatches(
        torch.from_numpy(x),
        torch.arange(3.0)[:, None],
        2,
        True,
        False,
        0,
        torch.from_numpy(lengths),
    )
    for xb, yb, lb in batches:
        for xi, yi, li in zip(xb, yb, lb):
            assert int(li) == [3, 1, 2][int(yi)]
            assert torch.all(xi[int(li) :] == 0) and torch.all(xi[: int(li)] == int(yi) + 1)


def test_too_few_samples_for_one_batch_is_a_clear_error():
    for drop_last in (
        True,
        False,
    ):  # a batch of 64 asked for, 8 samples to train on: not what was meant
        dm = _module(n_samples=10, batch_size=64, drop_last=drop_last)
        with pytest.raises(
            SeqlabError, match="8 training samples are fewer than one batch of data.batch_size=64"
        ):
            dm.setup()
