"""What runs say together: runs that differ only in `seed` are repeats of one configuration and are
summarised as a `Group` (n, mean, standard deviation, 95% Student-t interval: seqlab.sweeps.stats);
where the GPU overtakes the CPU; and the verdict, which ranks configurations only where Welch's
t-test at 5% tells them apart and says "tied within noise" otherwise."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from seqlab.sweeps.job import fmt
from seqlab.sweeps.runs import RunRow
from seqlab.sweeps.stats import (
    ALPHA,
    GREATER,
    LESS,
    TEST_NAME,
    UNTESTED,
    Summary,
    compare_means,
    summarize,
    tied_with_best,
)

# Params that say where things go or how a run was started, not what was trained.
NOT_CONFIG = ("paths.", "logger.", "hydra.", "resume", "ckpt_path", "notes")
# Shown in their own columns.
# Keys a row's columns show already (a packed row's perf says "packed xK": pack and replicas).
_COLUMN_KEYS = ("trainer.accelerator", "data.batch_size", "perf.", "pack", "replicas")


# -- repeats -------------------------------------------------------------------------------------
# The metrics summarised per configuration: (attribute, heading, format, lower is better).
METRICS = (
    ("it_per_s", "it/s", ",.0f", False),
    ("samples_per_s", "samples/s", ",.0f", False),
    # Networks trained per second: a pack's members count whole (K x its steps/s), a run alone its it/s.
    ("model_steps_per_s", "model-steps/s", ",.0f", False),
    ("time_to_target_s", "time to target (s)", ".3g", True),
    ("val_rmse", "final val_rmse", ".4f", True),
    ("best_val_rmse", "best val_rmse", ".4f", True),
    ("cpu_util", "cpu %", ".0f", False),
    ("gpu_util", "gpu %", ".0f", False),
)
_ONE_PER_PACK = ("it_per_s", "samples_per_s", "model_steps_per_s", "cpu_util", "gpu_util")
RANK_BY = (
    "config",
    "it_per_s",
    "samples_per_s",
    "model_steps_per_s",
    "time_to_target_s",
    "val_rmse",
    "best_val_rmse",
)


@dataclass
class Group:
    """The repeats of one configuration: runs whose configs differ only in the seed."""

    device: str
    batch_size: Optional[int]
    perf: str
    extra: (
        str  # other keys that set this configuration apart from the others, e.g. optimizer.lr=0.01
    )
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
        return sum(
            r.target_reached is True or r.time_to_target_s is not None for r in self.finished
        )

    @property
    def n_missed(self) -> int:
        return sum(r.target_reached is False for r in self.finished)

    def stat(self, metric: str) -> Summary:
        rows = self.finished
        if metric in _ONE_PER_PACK:
            # The members of a pack share one measurement of speed (its steps took what they took):
            # counted once, so that n and the interval are over independent measurements.
            seen: set[str] = set()
            rows = [
                r
                for r in rows
                if r.pack_id is None or not (r.pack_id in seen or seen.add(r.pack_id))
            ]
        return summarize(getattr(r, metric) for r in rows)

    @property
    def packed(self) -> bool:
        return any(r.pack_id for r in self.runs)

    @property
    def label(self) -> str:
        return f"{self.device}, batch {fmt(self.batch_size, 'd')}, perf={self.perf}" + (
            f", {self.extra}" if self.extra else ""
        )


def _config_key(row: RunRow, seed_keys: set[str]) -> tuple:
    if not row.params:
        return (row.device, row.batch_size, row.perf)
    kept = tuple(
        sorted(
            (k, v)
            for k, v in row.params.items()
            if k not in seed_keys and not k.startswith(NOT_CONFIG)
        )
    )
    return (row.device, row.batch_size, row.perf, kept)


def group_runs(rows: list[RunRow]) -> list[Group]:
    """Runs that differ only in `seed` (and in keys that follow it, such as data.seed=${seed}),
    grouped as repeats of one configuration, in table order."""
    seed_keys = {"seed"}
    with_params = [r for r in rows if r.params]
    if with_params:
        keys = set().union(*(r.params for r in with_params))
        seed_keys |= {
            k for k in keys if all(r.params.get(k) == r.params.get("seed") for r in with_params)
        }
    buckets: dict[tuple, list[RunRow]] = {}
    for row in rows:
        buckets.setdefault(_config_key(row, seed_keys), []).append(row)
    # Keys that tell apart configurations the columns (device, batch, perf) do not name them; a key
    # that only follows a column (the perf preset's callback settings) would repeat it.
    varying = set()
    configs = [(key[:3], dict(key[3])) for key in buckets if len(key) > 3]
    for k in set().union(*(c for _, c in configs)) if configs else set():
        if k.startswith(_COLUMN_KEYS):
            continue
        seen: dict[tuple, set] = {}
        for columns, config in configs:
            seen.setdefault(columns, set()).add(config.get(k))
        if any(len(values) > 1 for values in seen.values()):
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


def n_text(groups: list[Group]) -> str:
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
            label = (
                f" (perf={self.perf}; single runs: no test)"
                if self.perf
                else " (single runs: no test)"
            )
            return f"GPU beats CPU from batch {self.batch}{label}."
        where = (
            f"between batch {self.after} and {self.batch}"
            if self.after is not None
            else f"at batch {self.batch} or below"
        )
        return (
            f"GPU beats CPU from batch {self.batch}{label}, significantly at every batch size from there"
            f"{tied}: the crossover lies {where}."
        )


def crossover_detail(groups: list[Group], perf: Optional[str] = None) -> Crossover:
    def rates(device: str) -> dict[int, Summary]:
        found = {}
        for g in groups:
            if (
                g.device == device
                and g.batch_size
                and (perf is None or g.perf == perf)
                and g.stat("samples_per_s").n
            ):
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
def _best_text(
    groups: list[Group], metric: str, unit: str, spec: str
) -> Optional[tuple[Group, str]]:
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
        text += (
            f"; tied within noise ({n_text([by_label[k] for k in [best, *tied]])}) with: "
            + "; ".join(one(by_label[k]) for k in tied)
        )
    elif len([x for x in groups if x.stat(metric).n]) > 1 and not untested:
        text += "; significantly ahead of every other configuration"
    if untested:
        others = (
            f"the other {len(untested)}"
            if len(untested) > 2
            else "; ".join(by_label[k].label for k in untested)
        )
        text += f"; not tested against {others} (n = 1)"
    return g, text


def _spans(numbers: list[int]) -> str:
    """0, 1, 2 as they are; a longer run of consecutive numbers as 0-95 (a sweep with packs of 32)."""
    spans: list[list[int]] = []
    for n in numbers:
        if spans and n == spans[-1][1] + 1:
            spans[-1][1] = n
        else:
            spans.append([n, n])
    return ", ".join(
        str(a)
        if a == b
        else f"{a}, {b}"
        if b == a + 1
        else f"{a}, {a + 1}, {b}"
        if b == a + 2
        else f"{a}-{b}"
        for a, b in spans
    )


def verdict(rows: list[RunRow], target: Optional[float] = None) -> str:
    groups = group_runs(rows)
    finished = [g for g in groups if g.n]
    parts = []
    if finished and max(g.n for g in finished) >= 2:
        seeds = sorted({r.seed for g in finished for r in g.finished if r.seed is not None})
        parts.append(
            f"{n_text(finished)} repeats per configuration"
            + (f" (seeds {_spans(seeds)})" if seeds else "")
            + f"; ± is the 95% Student-t interval of the mean; a configuration is ahead of another only where "
            f'{TEST_NAME} (two-sided, p < {ALPHA:g}) says so, "tied within noise" otherwise.'
        )
    elif finished:
        parts.append(
            "One run per configuration (n = 1): no intervals and no tests, so the ranking below may be "
            "noise; repeat with seed=0,1,2 to know."
        )
    devices = {g.device for g in finished}
    if "gpu" in devices and "cpu" in devices:
        perfs = sorted({g.perf for g in finished if g.device == "gpu"})
        for perf in perfs or [None]:
            parts.append(crossover_detail(groups, perf).text())
    else:
        parts.append(
            f"Only {', '.join(sorted(devices)) or 'no'} runs finished: no CPU/GPU crossover to report."
        )

    target_text = f"RMSE {target:g}" if target else "the target RMSE"
    # Where one run is fastest, runs alone answer: a pack member's time and speed are its pack's,
    # shared by K networks (the "most networks" line below ranks packs). Packs only: those.
    alone = [g for g in finished if not g.packed] or finished
    fastest = _fastest_text(alone, target_text)
    if fastest:
        parts.append(fastest)
    elif any(g.n_missed for g in finished):
        parts.append(f"No run reached {target_text}.")
    best = _best_text(finished, "best_val_rmse", "", ".4f")
    if best:
        parts.append(f"Lowest val RMSE reached (best of each run, not its last): {best[1]}.")
    best = _best_text(alone, "samples_per_s", " samples/s", ",.0f")
    if best:
        parts.append(
            f"Highest throughput{' of one run' if len(alone) < len(finished) else ''}: {best[1]}."
        )
    if any(r.pack_id for g in finished for r in g.finished):
        # Where one run is fastest is not how to use the machine fully: packs train K networks a step.
        best = _best_text(finished, "model_steps_per_s", " model-steps/s", ",.0f")
        if best:
            parts.append(
                f"Most networks trained per second (a pack counts all its members; the machine used "
                f"fully): {best[1]}."
            )

    parts.append(_repeats_text(groups, target_text))
    return " ".join(parts)


def _fastest_text(alone: list[Group], target_text: str) -> Optional[str]:
    """The verdict's sentence on the fastest configuration to the target, None where no run
    reached it. A configuration that missed the target in some repeats is not ranked by the times
    of the repeats that were lucky; it is named, with its count."""
    always = [g for g in alone if g.n_reached == g.n]
    sometimes = [g for g in alone if g.n_reached]
    if not (always or sometimes):
        return None
    best = _best_text(always or sometimes, "time_to_target_s", " s", ".3g")
    caveat = (
        ""
        if always
        else " (no configuration reached it in every repeat; among those that reached it)"
    )
    partly = [g for g in sometimes if g not in always] if always else []
    unranked = (
        (
            "; not ranked, having missed it in some repeats: "
            + "; ".join(f"{g.label} (reached in {g.n_reached} of {g.n})" for g in partly)
        )
        if partly
        else ""
    )
    return f"Fastest to {target_text}{caveat}: {best[1]}{unranked}."


def _repeats_text(groups: list[Group], target_text: str) -> str:
    """The verdict's last sentence: how many runs finished, and which missed the target."""
    runs = [r for g in groups for r in g.runs]
    failed = [r for r in runs if r.status != "FINISHED"]
    missed = [g for g in groups if g.n_missed]
    count = f"Repeats: {len(runs) - len(failed)} of {len(runs)} runs finished"
    if failed:
        count += " (" + "; ".join(f"{r.name}: {r.status}" for r in failed) + ")"
    if missed and not any(g.n_reached for g in groups):
        count += f"; none reached {target_text}"
    elif missed:
        count += (
            f"; {sum(g.n_missed for g in missed)} missed {target_text} ("
            + "; ".join(f"{g.label}: {g.n_missed} of {g.n}" for g in missed)
            + ")"
        )
    elif any(g.n_reached for g in groups):
        count += f"; every finished run reached {target_text}"
    return count + "."


def fastest_to_target(rows: list[RunRow]) -> Optional[Group]:
    """The configuration with the lowest mean time to target among those that reached it in
    every finished repeat (or, if none did, in any)."""
    finished = [g for g in group_runs(rows) if g.n]
    pool = [g for g in finished if g.n_reached == g.n] or [g for g in finished if g.n_reached]
    best = _best_text(pool, "time_to_target_s", " s", ".3g") if pool else None
    return best[0] if best else None
