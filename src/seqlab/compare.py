"""Compare runs side by side: which device, batch size and loop train this network fastest, and
which reaches a target validation error soonest. Reads runs through the MLflow client and
produces a table (terminal, CSV, Markdown), plots (PNG), and a one-paragraph verdict; with a
sweep's parent run, stores them all on it so the MLflow UI shows the answer."""

from __future__ import annotations

import csv
import io
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

import mlflow

from seqlab.job import fmt


@dataclass
class RunRow:
    run_id: str
    name: str
    status: str
    device: str
    batch_size: Optional[int]
    perf: str
    it_per_s: Optional[float]
    samples_per_s: Optional[float]
    time_to_target_s: Optional[float]
    target_reached: Optional[bool]
    val_rmse: Optional[float]
    reason: str = ""
    cpu_util: Optional[float] = None  # mean system/cpu_utilization_percentage over the run
    gpu_util: Optional[float] = None  # mean system/gpu_0_utilization_percentage
    val_history: list[tuple[float, float]] = field(default_factory=list, repr=False)  # (step, val_rmse)


def find_runs(
    client: mlflow.MlflowClient,
    experiment: str,
    sweep: Optional[str] = None,
    filter_string: str = "",
) -> tuple[list, Optional[object]]:
    """The runs to compare and the sweep's parent run (if a sweep is named): `sweep` is a sweep
    id or 'latest' (the newest sweep in the experiment)."""
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        raise ValueError(f"no MLflow experiment named {experiment!r}")
    parent = None
    filters = [filter_string] if filter_string else []
    if sweep:
        parents = client.search_runs(
            [exp.experiment_id],
            "tags.sweep_role = 'parent'" + (f" and tags.sweep_id = '{sweep}'" if sweep != "latest" else ""),
            order_by=["attributes.start_time DESC"],
            max_results=1,
        )
        if not parents:
            raise ValueError(f"no sweep {sweep!r} in experiment {experiment!r}")
        parent = parents[0]
        filters.append(f"tags.sweep_id = '{parent.data.tags['sweep_id']}'")
    runs = client.search_runs([exp.experiment_id], " and ".join(filters), max_results=5000)
    runs = [r for r in runs if r.data.tags.get("sweep_role") != "parent"]
    return runs, parent


def _int(text: Optional[str]) -> Optional[int]:
    try:
        return int(text)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def to_rows(client: mlflow.MlflowClient, runs: list, with_history: bool = True) -> list[RunRow]:
    rows = []
    for run in runs:
        m, t, p = run.data.metrics, run.data.tags, run.data.params
        reached = t.get("target_reached")
        history, util = [], {}
        if with_history and run.info.status == "FINISHED":
            history = [(h.step, h.value) for h in client.get_metric_history(run.info.run_id, "val_rmse")]
            for key in ("system/cpu_utilization_percentage", "system/gpu_0_utilization_percentage"):
                if key in m:
                    values = [h.value for h in client.get_metric_history(run.info.run_id, key)]
                    util[key] = sum(values) / len(values)
        rows.append(
            RunRow(
                run_id=run.info.run_id,
                name=run.info.run_name or "",
                status=run.info.status,
                device=t.get("accelerator") or p.get("trainer.accelerator", "?"),
                batch_size=_int(p.get("data.batch_size")),
                perf=p.get("perf.name", "?"),
                it_per_s=m.get("it_per_s_median"),
                samples_per_s=m.get("samples_per_s_median"),
                time_to_target_s=m.get("time_to_target_s"),
                target_reached=None if reached is None else reached == "true",
                val_rmse=m.get("final_val_rmse", m.get("val_rmse")),
                reason=t.get("failure_reason", ""),
                cpu_util=util.get("system/cpu_utilization_percentage"),
                gpu_util=util.get("system/gpu_0_utilization_percentage"),
                val_history=history,
            )
        )
    return sorted(rows, key=lambda r: (r.device, r.perf, r.batch_size or 0, r.name))


def crossover(rows: list[RunRow], perf: Optional[str] = None) -> Optional[int]:
    """The smallest batch size from which the GPU's samples/s beats the CPU's at that batch
    size and every larger one measured on both; None if the GPU never overtakes (or either
    device has no finished runs)."""
    def rates(device: str) -> dict[int, float]:
        return {
            r.batch_size: r.samples_per_s
            for r in rows
            if r.device == device and r.status == "FINISHED" and r.samples_per_s and r.batch_size
            and (perf is None or r.perf == perf)
        }

    cpu, gpu = rates("cpu"), rates("gpu")
    common = sorted(set(cpu) & set(gpu))
    found = None
    for b in reversed(common):
        if gpu[b] > cpu[b]:
            found = b
        else:
            break
    return found


def fastest_to_target(rows: list[RunRow]) -> Optional[RunRow]:
    reached = [r for r in rows if r.time_to_target_s is not None and r.status == "FINISHED"]
    return min(reached, key=lambda r: r.time_to_target_s) if reached else None


def verdict(rows: list[RunRow], target: Optional[float] = None) -> str:
    parts = []
    devices = {r.device for r in rows if r.status == "FINISHED"}
    perfs = sorted({r.perf for r in rows if r.device == "gpu" and r.status == "FINISHED"})
    if "gpu" in devices and "cpu" in devices:
        for perf in perfs or [None]:
            b = crossover(rows, perf)
            label = f" (perf={perf})" if perf else ""
            parts.append(f"GPU beats CPU from batch {b}{label}." if b else f"GPU never overtakes CPU{label} at the batch sizes run.")
    else:
        parts.append(f"only {', '.join(sorted(devices)) or 'no'} runs finished: no CPU/GPU crossover to report.")
    best = fastest_to_target(rows)
    target_text = f"RMSE {target:g}" if target else "the target RMSE"
    if best:
        parts.append(
            f"Fastest to {target_text}: {best.device}, batch {best.batch_size}, perf={best.perf} "
            f"({best.time_to_target_s:.2f} s of training)."
        )
    elif any(r.target_reached is False for r in rows):
        parts.append(f"No run reached {target_text}.")
    fastest = max((r for r in rows if r.samples_per_s), key=lambda r: r.samples_per_s, default=None)
    if fastest:
        parts.append(
            f"Highest throughput: {fastest.device}, batch {fastest.batch_size}, perf={fastest.perf} "
            f"({fastest.samples_per_s:,.0f} samples/s)."
        )
    failed = [r for r in rows if r.status != "FINISHED"]
    if failed:
        parts.append(f"{len(failed)} run(s) did not finish: " + "; ".join(f"{r.name}: {r.status}" for r in failed) + ".")
    return " ".join(parts)


COLUMNS = ("device", "batch", "perf", "it/s", "samples/s", "time to target", "val_rmse", "cpu %", "gpu %", "status", "run")


def _cells(r: RunRow) -> list[str]:
    if r.time_to_target_s is not None:
        ttt = f"{r.time_to_target_s:.2f} s"
    else:
        ttt = "not reached" if r.target_reached is False else "-"
    return [r.device, fmt(r.batch_size, "d"), r.perf, fmt(r.it_per_s, ",.1f"), fmt(r.samples_per_s, ",.0f"), ttt,
            fmt(r.val_rmse, ".4g"), fmt(r.cpu_util, ".0f"), fmt(r.gpu_util, ".0f"), r.status, r.name]


def table(rows: list[RunRow]) -> str:
    cells = [list(COLUMNS)] + [_cells(r) for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(c[i].ljust(widths[i]) for i in range(len(COLUMNS))).rstrip() for c in cells)


def markdown(rows: list[RunRow]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(_cells(r)) + " |" for r in rows]
    return "\n".join(lines)


def to_csv(rows: list[RunRow]) -> str:
    out = io.StringIO()
    names = [k for k in asdict(rows[0]) if k != "val_history"] if rows else ["run_id"]
    writer = csv.DictWriter(out, fieldnames=names, extrasaction="ignore")
    writer.writeheader()
    for r in rows:
        writer.writerow(asdict(r))
    return out.getvalue()


def plots(rows: list[RunRow], out_dir: Path, target: Optional[float] = None) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    finished = [r for r in rows if r.status == "FINISHED" and r.batch_size]
    groups = sorted({(r.device, r.perf) for r in finished})
    paths = []

    def by_batch(key):
        fig, ax = plt.subplots(figsize=(8, 5))
        for device, perf in groups:
            pts = sorted((r.batch_size, getattr(r, key)) for r in finished
                         if (r.device, r.perf) == (device, perf) and getattr(r, key) is not None)
            if pts:
                ax.plot(*zip(*pts), marker="o", label=f"{device}, perf={perf}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch size")
        ax.grid(alpha=0.3)
        return fig, ax

    fig, ax = by_batch("samples_per_s")
    ax.set_ylabel("samples/s (training, median epoch)")
    ax.set_title("Throughput by batch size")
    for perf in sorted({p for _, p in groups}):
        b = crossover(rows, perf)
        if b:
            ax.axvline(b, color="red", ls="--", alpha=0.6)
            ax.annotate(f"GPU overtakes CPU (perf={perf}): batch {b}", (b, ax.get_ylim()[1]), rotation=90,
                        va="top", ha="right", fontsize=8, color="red")
    if ax.get_legend_handles_labels()[0]:
        ax.legend()
    paths.append(out_dir / "throughput_vs_batch.png")
    fig.tight_layout(); fig.savefig(paths[-1], dpi=100); plt.close(fig)

    fig, ax = by_batch("time_to_target_s")
    ax.set_ylabel("training seconds to reach the target")
    ax.set_title(f"Time to val_rmse <= {target:g}" if target else "Time to target")
    if ax.get_legend_handles_labels()[0]:
        ax.legend()
    paths.append(out_dir / "time_to_target_vs_batch.png")
    fig.tight_layout(); fig.savefig(paths[-1], dpi=100); plt.close(fig)

    fig, ax = plt.subplots(figsize=(8, 5))
    for r in finished:
        if r.val_history:
            ax.plot(*zip(*r.val_history), label=r.name, alpha=0.8)
    if target:
        ax.axhline(target, color="black", ls=":", label=f"target {target:g}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("iteration")
    ax.set_ylabel("val_rmse")
    ax.set_title("Validation RMSE of the compared runs")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=6, ncol=2)
    paths.append(out_dir / "val_rmse_curves.png")
    fig.tight_layout(); fig.savefig(paths[-1], dpi=100); plt.close(fig)
    return paths


@dataclass
class Report:
    rows: list[RunRow]
    verdict: str
    files: list[Path]


def compare(
    client: mlflow.MlflowClient,
    experiment: str,
    out_dir: Path,
    sweep: Optional[str] = None,
    filter_string: str = "",
    target: Optional[float] = None,
    log_to_parent: bool = True,
) -> Report:
    runs, parent = find_runs(client, experiment, sweep, filter_string)
    rows = to_rows(client, runs)
    if target is None:
        targets = {float(r.data.tags["target_rmse"]) for r in runs if "target_rmse" in r.data.tags}
        target = targets.pop() if len(targets) == 1 else None
    text = verdict(rows, target)
    out_dir.mkdir(parents=True, exist_ok=True)
    files = [out_dir / "comparison.txt", out_dir / "comparison.csv", out_dir / "comparison.md", out_dir / "verdict.txt"]
    files[0].write_text(table(rows) + "\n\n" + text + "\n")
    files[1].write_text(to_csv(rows))
    files[2].write_text(markdown(rows) + "\n\n" + text + "\n")
    files[3].write_text(text + "\n")
    files += plots(rows, out_dir, target)
    if log_to_parent and parent is not None:
        for path in files:
            client.log_artifact(parent.info.run_id, str(path), "comparison")
        client.set_tag(parent.info.run_id, "verdict", text[:5000])
    return Report(rows, text, files)
