"""Compare runs side by side: which device, batch size and loop train this network fastest, and
which reaches a target validation error soonest. Reads runs through the MLflow client; runs that
differ only in `seed` are repeats of one configuration and are summarised together (n, mean,
standard deviation, 95% Student-t interval: seqlab.stats). Produces a table (terminal, CSV,
Markdown), plots (PNG, with the repeats' spread) and a verdict that ranks configurations only
where Welch's t-test at 5% tells them apart, and says "tied within noise" otherwise; with a
sweep's parent run, stores them all on it so the MLflow UI shows the answer."""

from __future__ import annotations

import csv
import io
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

import mlflow

from seqlab.job import fmt, job_key
from seqlab.stats import ALPHA, GREATER, LESS, TEST_NAME, UNTESTED, Summary, compare_means, summarize, tied_with_best


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
    val_rmse: Optional[float]  # final (the network as saved)
    reason: str = ""
    cpu_util: Optional[float] = None  # mean system/cpu_utilization_percentage over the run
    gpu_util: Optional[float] = None  # mean system/gpu_0_utilization_percentage
    best_val_rmse: Optional[float] = None  # the lowest val_rmse of the run
    best_val_rmse_step: Optional[float] = None
    seed: Optional[int] = None
    val_history: list[tuple[float, float]] = field(default_factory=list, repr=False)  # (step, val_rmse)
    # The run's resolved config (flattened): what tells repeats of one configuration apart from
    # other configurations. Empty for rows made by hand: then device, batch and perf do.
    params: dict[str, str] = field(default_factory=dict, repr=False)


# Params that say where things go or how a run was started, not what was trained.
_NOT_CONFIG = ("paths.", "logger.", "hydra.", "resume", "ckpt_path", "notes")
# Shown in their own columns.
_COLUMN_KEYS = ("trainer.accelerator", "data.batch_size", "perf.")


def find_runs(
    client: mlflow.MlflowClient,
    experiment: str,
    sweep: Optional[str] = None,
    filter_string: str = "",
) -> tuple[list, Optional[object]]:
    """The runs to compare and the sweep's parent run (if a sweep is named): `sweep` is a sweep
    id or 'latest' (the newest sweep in the experiment). A job that a resumed sweep ran again
    (it had FAILED) is counted once: its newest run."""
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
    runs = client.search_runs([exp.experiment_id], " and ".join(filters), max_results=5000,
                              order_by=["attributes.start_time DESC"])
    # Neither a sweep's parent nor predict.py's evaluation runs (seqlab.predict) are training runs.
    runs = [r for r in runs if r.data.tags.get("sweep_role") != "parent" and r.data.tags.get("run_type") != "evaluation"]
    newest: dict[tuple[str, str], object] = {}
    kept = []
    for run in runs:  # newest first
        t = run.data.tags
        if "sweep_id" in t and "hydra_overrides" in t:
            key = (t["sweep_id"], job_key(t["hydra_overrides"]))
            if key in newest:
                continue
            newest[key] = run
        kept.append(run)
    return kept, parent


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
                best_val_rmse=m.get("best_val_rmse"),
                best_val_rmse_step=m.get("best_val_rmse_step"),
                seed=_int(p.get("seed")),
                val_history=history,
                params=dict(p),
            )
        )
    return sorted(rows, key=lambda r: (r.device, r.perf, r.batch_size or 0, r.seed or 0, r.name))


# -- repeats -------------------------------------------------------------------------------------
# The metrics summarised per configuration: (attribute, heading, format, lower is better).
METRICS = (
    ("it_per_s", "it/s", ",.0f", False),
    ("samples_per_s", "samples/s", ",.0f", False),
    ("time_to_target_s", "time to target (s)", ".3g", True),
    ("val_rmse", "final val_rmse", ".4f", True),
    ("best_val_rmse", "best val_rmse", ".4f", True),
    ("cpu_util", "cpu %", ".0f", False),
    ("gpu_util", "gpu %", ".0f", False),
)
RANK_BY = ("config",) + tuple(m[0] for m in METRICS[:5])


@dataclass
class Group:
    """The repeats of one configuration: runs whose configs differ only in the seed."""

    device: str
    batch_size: Optional[int]
    perf: str
    extra: str  # other keys that set this configuration apart from the others, e.g. optimizer.lr=0.01
    runs: list[RunRow]

    @property
    def finished(self) -> list[RunRow]:
        return [r for r in self.runs if r.status == "FINISHED"]

    @property
    def n(self) -> int:
        """Repeats that finished: those the statistics are over."""
        return len(self.finished)

    @property
    def n_failed(self) -> int:
        return len(self.runs) - self.n

    @property
    def n_reached(self) -> int:
        return sum(r.target_reached is True or r.time_to_target_s is not None for r in self.finished)

    @property
    def n_missed(self) -> int:
        return sum(r.target_reached is False for r in self.finished)

    def stat(self, metric: str) -> Summary:
        return summarize(getattr(r, metric) for r in self.finished)

    @property
    def label(self) -> str:
        return f"{self.device}, batch {fmt(self.batch_size, 'd')}, perf={self.perf}" + (f", {self.extra}" if self.extra else "")


def _config_key(row: RunRow, seed_keys: set[str]) -> tuple:
    if not row.params:
        return (row.device, row.batch_size, row.perf)
    kept = tuple(sorted((k, v) for k, v in row.params.items() if k not in seed_keys and not k.startswith(_NOT_CONFIG)))
    return (row.device, row.batch_size, row.perf, kept)


def group_runs(rows: list[RunRow]) -> list[Group]:
    """Runs that differ only in `seed` (and in keys that follow it, such as data.seed=${seed}),
    grouped as repeats of one configuration, in table order."""
    seed_keys = {"seed"}
    with_params = [r for r in rows if r.params]
    if with_params:
        keys = set().union(*(r.params for r in with_params))
        seed_keys |= {k for k in keys if all(r.params.get(k) == r.params.get("seed") for r in with_params)}
    buckets: dict[tuple, list[RunRow]] = {}
    for row in rows:
        buckets.setdefault(_config_key(row, seed_keys), []).append(row)
    # Keys whose values differ between configurations (and are not columns already) name them.
    varying = set()
    configs = [dict(key[3]) for key in buckets if len(key) > 3]
    for k in set().union(*configs) if configs else set():
        if not k.startswith(_COLUMN_KEYS) and len({c.get(k) for c in configs}) > 1:
            varying.add(k)
    groups = []
    for key, members in buckets.items():
        config = dict(key[3]) if len(key) > 3 else {}
        extra = ", ".join(f"{k}={config.get(k, '-')}" for k in sorted(varying))
        groups.append(Group(key[0], key[1], key[2], extra, members))
    return sorted(groups, key=lambda g: (g.device, g.perf, g.extra, g.batch_size or 0))


def rank(groups: list[Group], by: str = "config") -> list[Group]:
    """The groups in table order ('config') or best first by a metric's mean (unmeasured last)."""
    if by == "config":
        return groups
    lower = next(m[3] for m in METRICS if m[0] == by)
    measured = [g for g in groups if g.stat(by).n]
    rest = [g for g in groups if not g.stat(by).n]
    return sorted(measured, key=lambda g: g.stat(by).mean * (1 if lower else -1)) + rest


def _n_text(groups: list[Group]) -> str:
    ns = sorted({g.n for g in groups})
    return f"n = {ns[0]}" if len(ns) == 1 else f"n = {ns[0]}-{ns[-1]}"


# -- crossover -----------------------------------------------------------------------------------
@dataclass
class Crossover:
    """Where the GPU overtakes the CPU in samples/s for one perf option. `batch`: the smallest
    batch size from which the GPU is faster at that size and every larger one measured on both
    (significantly, by Welch's test, when both have repeats); `after`: the largest smaller batch
    size where the CPU was faster (the crossover lies between the two); `tied`: batch sizes where
    the two could not be told apart; `tested`: whether repeats allowed a test everywhere."""

    perf: Optional[str]
    batch: Optional[int]
    after: Optional[int]
    tied: list[int]
    tested: bool

    def text(self) -> str:
        label = f" (perf={self.perf})" if self.perf else ""
        tied = f"; tied within noise at batch {', '.join(map(str, self.tied))}" if self.tied else ""
        if self.batch is None:
            return f"GPU never overtakes CPU{label} at the batch sizes run{tied}."
        if not self.tested:
            label = f" (perf={self.perf}; single runs: no test)" if self.perf else " (single runs: no test)"
            return f"GPU beats CPU from batch {self.batch}{label}."
        where = (f"between batch {self.after} and {self.batch}" if self.after is not None
                 else f"at batch {self.batch} or below")
        return (f"GPU beats CPU from batch {self.batch}{label}, significantly at every batch size from there"
                f"{tied}: the crossover lies {where}.")


def crossover_detail(groups: list[Group], perf: Optional[str] = None) -> Crossover:
    def rates(device: str) -> dict[int, Summary]:
        found = {}
        for g in groups:
            if g.device == device and g.batch_size and (perf is None or g.perf == perf) and g.stat("samples_per_s").n:
                found[g.batch_size] = g.stat("samples_per_s")
        return found

    cpu, gpu = rates("cpu"), rates("gpu")
    common = sorted(set(cpu) & set(gpu))
    outcome = {b: compare_means(gpu[b], cpu[b]) for b in common}
    tested = bool(common) and all(o != UNTESTED for o in outcome.values())

    def gpu_ahead(b: int) -> bool:
        return outcome[b] == GREATER if tested else gpu[b].mean > cpu[b].mean

    found = None
    for b in reversed(common):
        if gpu_ahead(b):
            found = b
        else:
            break
    below = [b for b in common if found is None or b < found]
    after = max((b for b in below if (outcome[b] == LESS if tested else True)), default=None)
    tied = [b for b in common if tested and outcome[b] not in (GREATER, LESS)]
    return Crossover(perf, found, after, tied, tested)


def crossover(rows: list[RunRow], perf: Optional[str] = None) -> Optional[int]:
    """The batch size from which the GPU's samples/s beats the CPU's (see crossover_detail)."""
    return crossover_detail(group_runs(rows), perf).batch


# -- verdict ---------------------------------------------------------------------------------------
def _best_text(groups: list[Group], metric: str, unit: str, spec: str) -> Optional[tuple[Group, str]]:
    """'<best> (<mean ± ci><unit>, n = 3); tied within noise (n = 3) with: ...' over the groups."""
    lower = next(m[3] for m in METRICS if m[0] == metric)
    by_label = {g.label: g for g in groups}
    best, tied, untested = tied_with_best({g.label: g.stat(metric) for g in groups}, lower)
    if best is None:
        return None
    g = by_label[best]

    def one(group: Group) -> str:
        return f"{group.label} ({group.stat(metric).text(spec, unit)}, n = {group.stat(metric).n})"

    text = one(g)
    if tied:
        text += f"; tied within noise ({_n_text([by_label[k] for k in [best, *tied]])}) with: " + "; ".join(one(by_label[k]) for k in tied)
    elif len([x for x in groups if x.stat(metric).n]) > 1 and not untested:
        text += "; significantly ahead of every other configuration"
    if untested:
        others = f"the other {len(untested)}" if len(untested) > 2 else "; ".join(by_label[k].label for k in untested)
        text += f"; not tested against {others} (n = 1)"
    return g, text


def verdict(rows: list[RunRow], target: Optional[float] = None) -> str:
    groups = group_runs(rows)
    finished = [g for g in groups if g.n]
    parts = []
    if finished and max(g.n for g in finished) >= 2:
        seeds = sorted({r.seed for g in finished for r in g.finished if r.seed is not None})
        parts.append(
            f"{_n_text(finished)} repeats per configuration"
            + (f" (seeds {', '.join(map(str, seeds))})" if seeds else "")
            + f"; ± is the 95% Student-t interval of the mean; a configuration is ahead of another only where "
              f"{TEST_NAME} (two-sided, p < {ALPHA:g}) says so, \"tied within noise\" otherwise."
        )
    elif finished:
        parts.append("One run per configuration (n = 1): no intervals and no tests, so the ranking below may be "
                     "noise; repeat with seed=0,1,2 to know.")
    devices = {g.device for g in finished}
    if "gpu" in devices and "cpu" in devices:
        perfs = sorted({g.perf for g in finished if g.device == "gpu"})
        for perf in perfs or [None]:
            parts.append(crossover_detail(groups, perf).text())
    else:
        parts.append(f"Only {', '.join(sorted(devices)) or 'no'} runs finished: no CPU/GPU crossover to report.")

    target_text = f"RMSE {target:g}" if target else "the target RMSE"
    always = [g for g in finished if g.n_reached == g.n]
    sometimes = [g for g in finished if g.n_reached]
    if always or sometimes:
        best = _best_text(always or sometimes, "time_to_target_s", " s", ".3g")
        caveat = "" if always else " (no configuration reached it in every repeat; among those that reached it)"
        # A configuration that missed the target in some repeats is not ranked by the times of
        # the repeats that were lucky; it is named, with its count.
        partly = [g for g in sometimes if g not in always] if always else []
        unranked = ("; not ranked, having missed it in some repeats: "
                    + "; ".join(f"{g.label} (reached in {g.n_reached} of {g.n})" for g in partly)) if partly else ""
        parts.append(f"Fastest to {target_text}{caveat}: {best[1]}{unranked}.")
    elif any(g.n_missed for g in finished):
        parts.append(f"No run reached {target_text}.")
    best = _best_text(finished, "best_val_rmse", "", ".4f")
    if best:
        parts.append(f"Lowest val RMSE reached (best of each run, not its last): {best[1]}.")
    best = _best_text(finished, "samples_per_s", " samples/s", ",.0f")
    if best:
        parts.append(f"Highest throughput: {best[1]}.")

    runs = [r for g in groups for r in g.runs]
    failed = [r for r in runs if r.status != "FINISHED"]
    missed = [g for g in groups if g.n_missed]
    count = f"Repeats: {len(runs) - len(failed)} of {len(runs)} runs finished"
    if failed:
        count += " (" + "; ".join(f"{r.name}: {r.status}" for r in failed) + ")"
    if missed and not any(g.n_reached for g in groups):
        count += f"; none reached {target_text}"
    elif missed:
        count += f"; {sum(g.n_missed for g in missed)} missed {target_text} (" + "; ".join(
            f"{g.label}: {g.n_missed} of {g.n}" for g in missed) + ")"
    elif any(g.n_reached for g in groups):
        count += f"; every finished run reached {target_text}"
    parts.append(count + ".")
    return " ".join(parts)


def fastest_to_target(rows: list[RunRow]) -> Optional[Group]:
    """The configuration with the lowest mean time to target among those that reached it in
    every finished repeat (or, if none did, in any)."""
    finished = [g for g in group_runs(rows) if g.n]
    pool = [g for g in finished if g.n_reached == g.n] or [g for g in finished if g.n_reached]
    best = _best_text(pool, "time_to_target_s", " s", ".3g") if pool else None
    return best[0] if best else None


# -- table, CSV, Markdown --------------------------------------------------------------------------
def _columns(groups: list[Group]) -> list[str]:
    extra = ["config"] if any(g.extra for g in groups) else []
    return ["device", "batch", "perf", *extra, "n", *(m[1] for m in METRICS), "reached target", "not finished"]


def _cells(g: Group, with_extra: bool) -> list[str]:
    cells = [g.device, fmt(g.batch_size, "d"), g.perf] + ([g.extra or "-"] if with_extra else []) + [str(g.n)]
    cells += [g.stat(m).text(spec) for m, _, spec, _ in METRICS]
    reached = f"{g.n_reached}/{g.n}" if g.n_reached or g.n_missed else "-"
    cells += [reached, ", ".join(f"{r.status}" for r in g.runs if r.status != "FINISHED") or "-"]
    return cells


NOTE = ("n: finished repeats (runs that differ only in seed); a ± b: mean and half-width of the 95% "
        "Student-t interval of the mean (n = 1: the single value, no interval); time to target: over the "
        "repeats that reached it")


def table(rows: list[RunRow], rank_by: str = "config") -> str:
    groups = rank(group_runs(rows), rank_by)
    columns = _columns(groups)
    cells = [columns] + [_cells(g, "config" in columns) for g in groups]
    widths = [max(len(c[i]) for c in cells) for i in range(len(columns))]
    lines = ["  ".join(c[i].ljust(widths[i]) for i in range(len(columns))).rstrip() for c in cells]
    return "\n".join(lines + [NOTE])


def runs_table(rows: list[RunRow]) -> str:
    """One line per run: what each repeat measured."""
    columns = ("run", "seed", "status", "it/s", "samples/s", "time to target", "final val_rmse", "best val_rmse")
    cells = [list(columns)]
    for r in rows:
        ttt = fmt(r.time_to_target_s, ".3g") if r.time_to_target_s is not None else (
            "not reached" if r.target_reached is False else "-")
        cells.append([r.name, fmt(r.seed, "d"), r.status, fmt(r.it_per_s, ",.1f"), fmt(r.samples_per_s, ",.0f"), ttt,
                      fmt(r.val_rmse, ".4g"), fmt(r.best_val_rmse, ".4g")])
    widths = [max(len(c[i]) for c in cells) for i in range(len(columns))]
    return "\n".join("  ".join(c[i].ljust(widths[i]) for i in range(len(columns))).rstrip() for c in cells)


def markdown(rows: list[RunRow], rank_by: str = "config") -> str:
    groups = rank(group_runs(rows), rank_by)
    columns = _columns(groups)
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cells(g, "config" in columns)) + " |" for g in groups]
    return "\n".join(lines + ["", NOTE])


def to_csv(rows: list[RunRow], rank_by: str = "config") -> str:
    """One row per configuration: n, counts, and mean, sd and 95% interval of each metric."""
    out = io.StringIO()
    names = ["device", "batch_size", "perf", "config", "n", "n_not_finished", "n_reached_target", "n_missed_target", "seeds"]
    for metric, *_ in METRICS:
        names += [f"{metric}_mean", f"{metric}_sd", f"{metric}_ci95_lo", f"{metric}_ci95_hi"]
    writer = csv.DictWriter(out, fieldnames=names)
    writer.writeheader()
    for g in rank(group_runs(rows), rank_by):
        row = {"device": g.device, "batch_size": g.batch_size, "perf": g.perf, "config": g.extra, "n": g.n,
               "n_not_finished": g.n_failed, "n_reached_target": g.n_reached, "n_missed_target": g.n_missed,
               "seeds": " ".join(str(r.seed) for r in g.finished if r.seed is not None)}
        for metric, *_ in METRICS:
            s = g.stat(metric)
            row.update({f"{metric}_mean": s.mean, f"{metric}_sd": s.sd, f"{metric}_ci95_lo": s.lo, f"{metric}_ci95_hi": s.hi})
        writer.writerow(row)
    return out.getvalue()


def runs_csv(rows: list[RunRow]) -> str:
    out = io.StringIO()
    names = [k for k in asdict(rows[0]) if k not in ("val_history", "params")] if rows else ["run_id"]
    writer = csv.DictWriter(out, fieldnames=names, extrasaction="ignore")
    writer.writeheader()
    for r in rows:
        writer.writerow({k: v for k, v in asdict(r).items() if k in names})
    return out.getvalue()


# -- plots -----------------------------------------------------------------------------------------
def plots(rows: list[RunRow], out_dir: Path, target: Optional[float] = None) -> list[Path]:
    """Means with error bars (the 95% interval) and every repeat as a faint dot; curves as the
    repeats' mean with a band over their range."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    groups = [g for g in group_runs(rows) if g.n and g.batch_size]
    n = _n_text(groups) if groups else "n = 0"
    figures = {
        "throughput_vs_batch.png": _throughput_figure(plt, groups, n),
        "time_to_target_vs_batch.png": _time_to_target_figure(plt, groups, n, target),
        "val_rmse_curves.png": _curves_figure(plt, groups, target),
    }
    from seqlab.plots import save_figure

    return [save_figure(fig, out_dir / name, dpi=100) for name, fig in figures.items()]


def _by_batch(plt, groups: list[Group], metric: str):
    """One line per (device, perf, other keys): the metric's mean against the batch size."""
    fig, ax = plt.subplots(figsize=(8, 5))
    for device, perf, extra in sorted({(g.device, g.perf, g.extra) for g in groups}):
        members = sorted((g for g in groups if (g.device, g.perf, g.extra) == (device, perf, extra)
                          and g.stat(metric).n), key=lambda g: g.batch_size)
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
            ax.annotate(f"GPU overtakes CPU (perf={perf}): batch {b}", (b, ax.get_ylim()[1]), rotation=90,
                        va="top", ha="right", fontsize=8, color="red")
    if ax.get_legend_handles_labels()[0]:
        ax.legend()
    return fig


def _time_to_target_figure(plt, groups: list[Group], n: str, target: Optional[float]):
    fig, ax = _by_batch(plt, groups, "time_to_target_s")
    ax.set_ylabel("training seconds to reach the target")
    ax.set_title((f"Time to val_rmse <= {target:g}" if target else "Time to target") + f" (mean, 95% interval; {n})")
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
        line, = ax.plot(steps, mean, label=f"{g.label} (n = {g.n})", alpha=0.9)
        if g.n > 1:
            ax.fill_between(steps, [min(by_step[s]) for s in steps], [max(by_step[s]) for s in steps],
                            color=line.get_color(), alpha=0.15, linewidth=0)
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
    files = [out_dir / "comparison.txt", out_dir / "comparison.csv", out_dir / "comparison.md",
             out_dir / "comparison_runs.csv", out_dir / "verdict.txt"]
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
