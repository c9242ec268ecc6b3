"""The training-progress picture MATLAB drew live: loss and RMSE per iteration with validation
points, and the learning rate, saved as a PNG; and predict.py's predicted-vs-actual picture."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Optional, Sequence

import matplotlib
import numpy as np

matplotlib.use("Agg")  # no display on servers and in CI
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

Series = Sequence[tuple[int, float]]


# The training-curves figure, made once a process and drawn again for each run: its axes keep
# their tick and text objects between runs, where a new figure made them anew at each draw (about
# a quarter of a picture's 0.13 s here, once per run and per member of a pack). Runs end one after
# another in a process (a pack's members in turn), so one figure serves them all.
_CURVES: Optional[tuple[Figure, np.ndarray]] = None


# The series the training-curves figure draws.
CURVES = ("train_rmse", "val_rmse", "train_loss", "val_loss", "lr")


def series_to_draw(history: Mapping[str, Series]) -> dict[str, list[list[float]]]:
    """The figure's series as training_curves draws them (each enveloped): what the delivery
    process is handed to draw it (delivery.figures), a few thousand points whatever the run's length."""
    return {
        name: np.column_stack(envelope(history[name])).tolist()
        for name in CURVES
        if history.get(name)
    }


def training_curves(history: Mapping[str, Series], path: Path, title: str = "") -> Path:
    # Matplotlib's own style, whatever a library set since (Optuna's plots use ggplot's): the
    # figure made in one style and its next run's lines drawn in another would mix them.
    with plt.style.context("default"):
        return _draw_curves(history, path, title)


def _draw_curves(history: Mapping[str, Series], path: Path, title: str) -> Path:
    global _CURVES
    if _CURVES is None:
        _CURVES = plt.subplots(3, 1, figsize=(9, 9), sharex=True)
    fig, axes = _CURVES
    for ax in axes:  # the last run's lines and legends out; the axes, their ticks and grid kept
        for line in list(ax.lines):
            line.remove()
        if ax.get_legend() is not None:
            ax.get_legend().remove()
        ax.set_yscale("linear")
    panels = [
        ("RMSE", "train_rmse", "val_rmse", "linear"),
        ("loss", "train_loss", "val_loss", "log"),
    ]
    for ax, (label, train_key, val_key, scale) in zip(axes, panels):
        _line(ax, history.get(train_key, ()), "training (mini-batch)", color="tab:blue", alpha=0.6)
        _line(ax, history.get(val_key, ()), "validation", color="black", marker="o", ls="--")
        ax.set_ylabel(label)
        if scale == "log" and all(v > 0 for _, v in history.get(train_key, ())):
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(loc="upper right")
    _line(axes[2], history.get("lr", ()), "learning rate", color="tab:green")
    axes[2].set_ylabel("learning rate")
    axes[2].set_xlabel("iteration")
    axes[2].grid(alpha=0.3)
    for ax in axes:
        ax.relim()
        ax.autoscale_view()
    fig.suptitle(title)
    # Fixed margins for this fixed layout: tight_layout measured every tick label first, half of
    # the picture's cost (about 0.15 s of every run, once per member of a pack).
    fig.subplots_adjust(
        left=0.12, right=0.97, bottom=0.06, top=0.94 if title else 0.97, hspace=0.08
    )
    return write_figure(fig, path, dpi=100)


def save_figure(fig, path: Path, dpi: int) -> Path:
    """Lay the figure out around its labels, write it and free it."""
    fig.tight_layout()
    write_figure(fig, path, dpi)
    plt.close(fig)
    return path


def write_figure(fig, path: Path, dpi: int) -> Path:
    """Write the figure as it is laid out, creating its folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    return path


# Agg draws every segment of a line, and a run's per-step series hold more points than its panel
# has pixel columns (about 800 here): 20,000 steps took 0.64 s a figure, once per run and member.
# A longer series is drawn as the lowest and highest value of each of MAX_POINTS / 2 runs of
# steps: the band the eye sees of a noisy curve at this width, at a fraction of the cost.
MAX_POINTS = 2000


def _line(ax, points: Series, label: str, **style) -> None:
    if points:
        steps, values = envelope(points)
        ax.plot(steps, values, label=label, **style)


def envelope(points: Series, max_points: int = MAX_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) to draw: the points as they are, or past `max_points`, each run of steps as
    its first step at its lowest value and its last step at its highest (a NaN keeps its run's gap)."""
    steps, values = (np.asarray(a, dtype=float) for a in zip(*points))
    if len(steps) <= max_points:
        return steps, values
    edges = np.linspace(0, len(steps), max_points // 2 + 1).astype(int)
    starts = edges[:-1]
    lows, highs = np.minimum.reduceat(values, starts), np.maximum.reduceat(values, starts)
    return (
        np.column_stack([steps[starts], steps[edges[1:] - 1]]).ravel(),
        np.column_stack([lows, highs]).ravel(),
    )


def predicted_vs_actual(predicted, actual, path: Path, title: str = "") -> Path:
    """One point per sample and response, against the line where prediction equals target."""
    fig, ax = plt.subplots(figsize=(5.5, 5.5))
    ax.scatter(actual.ravel(), predicted.ravel(), s=6, alpha=0.5)
    low, high = float(min(actual.min(), predicted.min())), float(max(actual.max(), predicted.max()))
    ax.plot([low, high], [low, high], color="black", lw=1, ls="--", label="prediction = target")
    ax.set_xlabel("actual")
    ax.set_ylabel("predicted")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left")
    if title:
        ax.set_title(title)
    return save_figure(fig, path, dpi=80)
