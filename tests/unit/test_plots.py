"""plots.envelope: a long per-step series drawn as its band, not point by point."""

from __future__ import annotations

import numpy as np

from seqlab.plots import envelope


def test_a_long_series_is_drawn_as_each_runs_lowest_and_highest_value_and_a_short_one_as_it_is():
    values = np.sin(np.arange(10_000) / 7.0) + np.arange(10_000) * 1e-4
    values[5_000] = 9.0  # a spike: the eye must still see it
    values[7_000] = np.nan  # a gap stays a gap
    points = list(enumerate(values))
    steps, drawn = envelope(points, max_points=1_000)
    assert len(steps) == len(drawn) == 1_000
    assert steps[0] == 0 and steps[-1] == 9_999 and np.all(np.diff(steps) >= 0)
    assert np.nanmax(drawn) == 9.0 and np.nanmin(drawn) == np.nanmin(values)
    assert np.isnan(drawn).sum() == 2  # the run holding the NaN, its low and its high
    short = list(enumerate(values[:50]))
    steps, drawn = envelope(short, max_points=1_000)
    assert np.array_equal(steps, np.arange(50)) and np.array_equal(drawn, values[:50])


def test_a_runs_curves_drawn_on_the_process_figure_equal_those_drawn_on_a_new_one(tmp_path):
    import matplotlib.pyplot as plt
    from matplotlib.image import imread

    from seqlab import plots

    rng = np.random.default_rng(0)
    before = {  # a long run: log loss, validation points, a schedule, a title
        "train_rmse": list(enumerate(rng.random(3_000) * 3)),
        "train_loss": list(enumerate(rng.random(3_000) + 0.1)),
        "val_rmse": [(i * 300, v) for i, v in enumerate(rng.random(10))],
        "val_loss": [(i * 300, v) for i, v in enumerate(rng.random(10))],
        "lr": [(i, 1e-3 if i < 1_500 else 1e-4) for i in range(3_000)],
    }
    after = {  # a short one: a loss that is not all positive (linear), no validation, no title
        "train_rmse": list(enumerate(rng.random(50))),
        "train_loss": list(enumerate(rng.random(50) - 0.5)),
        "lr": [(i, 0.01) for i in range(50)],
    }
    plots.training_curves(before, tmp_path / "before.png", title="run A")
    # A library's style set between two runs (Optuna's plots set ggplot's) changes neither.
    with plt.style.context("ggplot"):
        again = plots.training_curves(after, tmp_path / "again.png")
    plots._CURVES = None  # a new process's figure
    anew = plots.training_curves(after, tmp_path / "anew.png")
    assert np.array_equal(imread(again), imread(anew))
