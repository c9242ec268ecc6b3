"""Compare runs side by side: which device, batch size and loop train this network fastest, and
which reaches a target validation error soonest. `compare` reads the runs (seqlab.sweeps.runs),
groups their repeats and words the verdict (seqlab.sweeps.verdict), and writes what a person reads:
a table (terminal, CSV, Markdown) and plots (PNG, with the repeats' spread); with a sweep's parent
run, it stores them all on it so the MLflow UI shows the answer."""

from __future__ import annotations

import csv
import io
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

import mlflow

from seqlab.plots import save_figure
from seqlab.sweeps.job import fmt
from seqlab.sweeps.runs import RunRow, find_runs, to_rows
from seqlab.sweeps.summary import aligned
from seqlab.sweeps.verdict import (
    METRICS,
    RANK_BY,
    Group,
    crossover_detail,
    group_runs,
    n_text,
    rank,
    verdict,
)


# -- table, CSV, Markdown --------------------------------------------------------------------------
def _columns(groups: list[Group]) -> list[str]:
    extra = ["config"] if any(g.extra for g in groups) else []
    return [
        "device",
        "batch",
        "perf",
        *extra,
        "n",
        *(m[1] for m in METRICS),
        "reached target",
        "not finished",
    ]


def _cells(g: Group, with_extra: bool) -> list[str]:
    cells = (
        [g.device, fmt(g.batch_size, "d"), g.perf]
        + ([g.extra or "-"] if with_extra else [])
        + [str(g.n)]
    )
    cells += [g.stat(m).text(spec) for m, _, spec, _ in METRICS]
    reached = f"{g.n_reached}/{g.n}" if g.n_reached or g.n_missed else "-"
    cells += [reached, ", ".join(f"{r.status}" for r in g.runs if r.status != "FINISHED") or "-"]
    return cells


NOTE = (
    "n: finished repeats (runs that differ only in seed); a ± b: mean and half-width of the 95% "
    "Student-t interval of the mean (n = 1: the single value, no interval); time to target: over the "
    "repeats that reached it"
)


def table(rows: list[RunRow], rank_by: str = "config") -> str:
    groups = rank(group_runs(rows), rank_by)
    columns = _columns(groups)
    cells = [columns] + [_cells(g, "config" in columns) for g in groups]
    return "\n".join(aligned(cells) + [NOTE])


def runs_table(rows: list[RunRow]) -> str:
    """One line per run: what each repeat measured."""
    columns = (
        "run",
        "seed",
        "status",
        "it/s",
        "samples/s",
        "time to target",
        "final val_rmse",
        "best val_rmse",
    )
    cells = [list(columns)]
    for r in rows:
        ttt = (
            fmt(r.time_to_target_s, ".3g")
            if r.time_to_target_s is not None
            else ("not reached" if r.target_reached is False else "-")
        )
        cells.append(
            [
                r.name,
                fmt(r.seed, "d"),
                r.status,
                fmt(r.it_per_s, ",.1f"),
                fmt(r.samples_per_s, ",.0f"),
                ttt,
                fmt(r.val_rmse, ".4g"),
                fmt(r.best_val_rmse, ".4g"),
            ]
        )
    return "\n".join(aligned(cells))


def markdown(rows: list[RunRow], rank_by: str = "config") -> str:
    groups = rank(group_runs(rows), rank_by)
    columns = _columns(groups)
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cells(g, "config" in columns)) + " |" for g in groups]
    return "\n".join(lines + ["", NOTE])


def to_csv(rows: list[RunRow], rank_by: str = "config") -> str:
    """One row per configuration: n, counts, and mean, sd and 95% interval of each metric."""
    out = io.StringIO()
    names = [
        "device",
        "batch_size",
        "perf",
        "config",
        "n",
        "n_not_finished",
        "n_reached_target",
        "n_missed_target",
        "seeds",
    ]
    for metric, *_ in METRICS:
        names += [f"{metric}_mean", f"{metric}_sd", f"{metric}_ci95_lo", f"{metric}_ci95_hi"]
    writer = csv.DictWriter(out, fieldnames=names)
    writer.writeheader()
    for g in rank(group_runs(rows), rank_by):
        row = {
            "device": g.device,
            "batch_size": g.batch_size,
            "perf": g.perf,
            "config": g.extra,
            "n": g.n,
            "n_not_finished": g.n_failed,
            "n_reached_target": g.n_reached,
            "n_missed_target": g.n_missed,
            "seeds": " ".join(str(r.seed) for r in g.finished if r.seed is not None),
        }
        for metric, *_ in METRICS:
            s = g.stat(metric)
            row.update(
                {
                    f"{metric}_mean": s.mean,
                    f"{metric}_sd": s.sd,
                    f"{metric}_ci95_lo": s.lo,
                    f"{metric}_ci95_hi": s.hi,
                }
            )
        writer.writerow(row)
    return out.getvalue()


def runs_csv(rows: list[RunRow]) -> str:
    out = io.StringIO()
    names = (
        [k for k in asdict(rows[0]) if k not in ("val_history", "params")] if rows else ["run_id"]
    )
    writer = csv.DictWriter(out, fieldnames=names, extrasaction="ignore")
    writer.writeheader()
    for r in rows:
        writer.writerow({k: v for k, v in asdict(r).items() if k in names})
    return out.getvalue()


# -- plots -----------------------------------------------------------------------------------------
def plots(rows: list[RunRow], out_dir: Path, target: Optional[float] = None) -> list[Path]:
    """Means with error bars (the 95% interval) and every repeat as a faint dot; curves as the
    repeats' mean with a band over their range."""
    import matplotlib  # the plots only: the comparison's table answers without matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # after matplotlib.use: no display here

    out_dir.mkdir(parents=True, exist_ok=True)
    groups = [g for g in group_runs(rows) if g.n and g.batch_size]
    n = n_text(groups) if groups else "n = 0"
    figures = {
        "throughput_vs_batch.png": _throughput_figure(plt, groups, n),
        "time_to_target_vs_batch.png": _time_to_target_figure(plt, groups, n, target),
        "val_rmse_curves.png": _curves_figure(plt, groups, target),
    }

    return [save_figure(fig, out_dir / name, dpi=100) for name, fig in figures.items()]


def _by_batch(plt, groups: list[Group], metric: str):
    """One line per (device, perf, other keys): the metric's mean against the batch size."""
    fig, ax = plt.subplots(figsize=(8, 5))
    for device, perf, extra in sorted({(g.device, g.perf, g.extra) for g in groups}):
        members = sorted(
            (
                g
                for g in groups
                if (g.device, g.perf, g.extra) == (device, perf, extra) and g.stat(metric).n
            ),
            key=lambda g: g.batch_size,
        )
        if not members:
            continue
        x = [g.batch_size for g in members]
        y = [g.stat(metric).mean for g in members]
        err = [g.stat(metric).half_width or 0.0 for g in members]
        label = f"{device}, perf={perf}" + (f", {extra}" if extra else "")
        line = ax.errorbar(x, y, yerr=err, marker="o", capsize=4, label=label)
        dots = [(g.batch_size, v) for g in members for v in g.stat(metric).values]
        ax.scatter(*zip(*dots), s=10, alpha=0.35, color=line[0].get_color())
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size")
    ax.grid(alpha=0.3)
    return fig, ax


def _throughput_figure(plt, groups: list[Group], n: str):
    fig, ax = _by_batch(plt, groups, "samples_per_s")
    ax.set_ylabel("samples/s (training, median epoch)")
    ax.set_title(f"Throughput by batch size (mean, 95% interval, repeats as dots; {n})")
    for perf in sorted({g.perf for g in groups}):
        b = crossover_detail(groups, perf).batch
        if b:
            ax.axvline(b, color="red", ls="--", alpha=0.6)
            ax.annotate(
                f"GPU overtakes CPU (perf={perf}): batch {b}",
                (b, ax.get_ylim()[1]),
                rotation=90,
                va="top",
                ha="right",
                fontsize=8,
                color="red",
            )
    if ax.get_legend_handles_labels()[0]:
        ax.legend()
    return fig


def _time_to_target_figure(plt, groups: list[Group], n: str, target: Optional[float]):
    fig, ax = _by_batch(plt, groups, "time_to_target_s")
    ax.set_ylabel("training seconds to reach the target")
    ax.set_title(
        (f"Time to val_rmse <= {target:g}" if target else "Time to target")
        + f" (mean, 95% interval; {n})"
    )
    if ax.get_legend_handles_labels()[0]:
        ax.legend()
    return fig


def _curves_figure(plt, groups: list[Group], target: Optional[float]):
    fig, ax = plt.subplots(figsize=(8, 5))
    for g in groups:
        by_step: dict[float, list[float]] = {}
        for r in g.finished:
            for step, value in r.val_history:
                by_step.setdefault(step, []).append(value)
        if not by_step:
            continue
        steps = sorted(by_step)
        mean = [sum(by_step[s]) / len(by_step[s]) for s in steps]
        (line,) = ax.plot(steps, mean, label=f"{g.label} (n = {g.n})", alpha=0.9)
        if g.n > 1:
            ax.fill_between(
                steps,
                [min(by_step[s]) for s in steps],
                [max(by_step[s]) for s in steps],
                color=line.get_color(),
                alpha=0.15,
                linewidth=0,
            )
    if target:
        ax.axhline(target, color="black", ls=":", label=f"target {target:g}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("iteration")
    ax.set_ylabel("val_rmse")
    ax.set_title("Validation RMSE: mean of the repeats, band over their range")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=6, ncol=2)
    return fig


@dataclass
class Report:
    rows: list[RunRow]
    verdict: str
    files: list[Path]

    @property
    def groups(self) -> list[Group]:
        return group_runs(self.rows)


def compare(
    client: mlflow.MlflowClient,
    experiment: str,
    out_dir: Path,
    sweep: Optional[str] = None,
    filter_string: str = "",
    target: Optional[float] = None,
    log_to_parent: bool = True,
    rank_by: str = "config",
) -> Report:
    if rank_by not in RANK_BY:
        raise ValueError(f"rank_by must be one of {', '.join(RANK_BY)}, got {rank_by!r}")
    runs, parent = find_runs(client, experiment, sweep, filter_string)
    rows = to_rows(client, runs)
    if target is None:
        targets = {float(r.data.tags["target_rmse"]) for r in runs if "target_rmse" in r.data.tags}
        target = targets.pop() if len(targets) == 1 else None
    text = verdict(rows, target)
    out_dir.mkdir(parents=True, exist_ok=True)
    files = [
        out_dir / "comparison.txt",
        out_dir / "comparison.csv",
        out_dir / "comparison.md",
        out_dir / "comparison_runs.csv",
        out_dir / "verdict.txt",
    ]
    files[0].write_text(table(rows, rank_by) + "\n\n" + runs_table(rows) + "\n\n" + text + "\n")
    files[1].write_text(to_csv(rows, rank_by))
    files[2].write_text(markdown(rows, rank_by) + "\n\n" + text + "\n")
    files[3].write_text(runs_csv(rows))
    files[4].write_text(text + "\n")
    files += plots(rows, out_dir, target)
    if log_to_parent and parent is not None:
        for path in files:
            client.log_artifact(parent.info.run_id, str(path), "comparison")
        client.set_tag(parent.info.run_id, "verdict", text[:5000])
    return Report(rows, text, files)
