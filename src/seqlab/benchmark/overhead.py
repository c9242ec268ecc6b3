"""What a user waits for outside training (issue 35), measured in the product: `python train.py`
commands run as a user runs them (a process each, one after another, cases alternating), and
each run's costs.json (seqlab.tracking.costs) read back. Printed per command (what its runs and
its process spent in each phase, summed) and per run (each phase's median over the runs), as
medians over repeats; `other` is the command's wall time that no phase and no training holds
before its runs end (Hydra's sweep and the sweep's parent run, building the Trainer, the final
metrics); `after the last run`, what follows the last run's end (the sweep's summary and
comparison, the report, the interpreter's exit)."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

from seqlab.tracking.costs import FILE

ROOT = Path(__file__).resolve().parents[3]
SEEDS = "seed=0,1,2,3,4,5,6,7"
# The commands of issue 35's measure: the default run, a pack of 8 and the same 8 jobs one by one.
CASES: dict[str, list[str]] = {
    "single": [],
    "pack": ["-m", SEEDS, "pack=8", "trainer.max_epochs=40"],
    "one-by-one": ["-m", SEEDS, "pack=off", "trainer.max_epochs=40"],
}
# --smoke: the same commands, tiny (two jobs, one epoch of 256 samples): it runs, measures nothing.
SMOKE = {
    "single": ["data.n_samples=256", "trainer.max_epochs=1"],
    "pack": ["-m", "seed=0,1", "pack=2", "data.n_samples=256", "trainer.max_epochs=1"],
    "one-by-one": ["-m", "seed=0,1", "pack=off", "data.n_samples=256", "trainer.max_epochs=1"],
}
# Issue 35's yardstick for the default run: what importing the four libraries alone takes in a new
# Python (timed in each repeat, beside the commands): the run may take its training + this + 1.5 s.
IMPORTS = "import torch, pytorch_lightning, mlflow, hydra"
SINGLE_ALLOWANCE_S = 1.5
PACK_TARGET = 0.3  # a pack of 8's wall time against its jobs one by one
PROCESS_PHASES = ("start", "imports", "member configs", "data and networks")
RUN_PHASES = (
    "store",
    "run",
    "code and environment",
    "params and config",
    "datasets",
    "final records",
    "checkpoint",
    "figures",
    "models",
    "end",
)

COMMAND_ROWS = ("training", "after the last run", "other", "wall")


@dataclass
class Command:
    """One command's measure: its wall time and what each of its runs wrote to costs.json."""

    case: str
    wall_s: float
    runs: list[dict]
    # time.time() as the process was started and as it had exited: against its runs' first_job_at
    # and written_at, the command's start and what followed its last run.
    launched_at: Optional[float] = None
    ended_at: Optional[float] = None

    def process(self) -> dict[str, float]:
        """The process phases, once per job (a pack's members share theirs)."""
        jobs = {_job(r): r["process"] for r in self.runs}
        out = {p: sum(j.get(p, 0.0) for j in jobs.values()) for p in PROCESS_PHASES}
        # The start: from the launch to the process's first job (the interpreter, the imports of the
        # command line, Hydra's composing, a sweep's start and parent run).
        first = min((r["first_job_at"] for r in self.runs if r.get("first_job_at")), default=None)
        if self.launched_at is not None and first is not None:
            out["start"] = max(first - self.launched_at, 0.0)
        return out

    def training_s(self) -> float:
        """Training: a pack's once (its longest member), each job's alone in turn."""
        jobs: dict[tuple, float] = {}
        for r in self.runs:
            jobs[_job(r)] = max(jobs.get(_job(r), 0.0), r["training_s"] or 0.0)
        return sum(jobs.values())

    def totals(self) -> dict[str, float]:
        """Seconds of the command by phase: its processes', its runs' (summed), training, other."""
        out = self.process()
        for p in RUN_PHASES:
            out[p] = sum(r["run"].get(p, 0.0) for r in self.runs)
        out["training"] = self.training_s()
        # The sweep's summary and comparison, the report, the interpreter's exit: after every run ended.
        last = max(r.get("written_at", 0.0) for r in self.runs)
        out["after the last run"] = (
            max(self.ended_at - last, 0.0) if self.ended_at and last else 0.0
        )
        out["other"] = self.wall_s - sum(out.values())
        out["wall"] = self.wall_s
        return out


def _job(run: dict) -> tuple:
    """Which job a run's costs.json is of: a pack's members share one (its process, its training)."""
    return run["job"], run["pack_id"]


def run_command(case: str, args: list[str], root: Path, timeout: float = 1800) -> Command:
    """`python train.py ARGS` in a process of its own, its paths under `root`; the costs.json files
    its runs wrote."""
    before = set(root.glob(f"logs/**/{FILE}"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HYDRA_", "MLFLOW_TRACKING"))}
    launched_at, start = time.time(), time.perf_counter()
    proc = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), *args, f"paths.root_dir={root}"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    wall, ended_at = time.perf_counter() - start, time.time()
    if proc.returncode != 0:
        raise RuntimeError(
            f"{case}: python train.py {' '.join(args)} exited {proc.returncode}:\n"
            + (proc.stdout + proc.stderr)[-2000:]
        )
    runs = [json.loads(p.read_text()) for p in sorted(set(root.glob(f"logs/**/{FILE}")) - before)]
    if not runs:
        raise RuntimeError(f"{case}: its runs wrote no {FILE}")
    return Command(case, wall, runs, launched_at, ended_at)


def time_imports(timeout: float = 300) -> float:
    """Seconds of `python -c IMPORTS` in a new process: the yardstick's imports."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", IMPORTS], check=True, timeout=timeout)
    return time.perf_counter() - start


@dataclass
class Measure:
    """The commands of every repeat, in the order they ran, and the imports' yardstick of each."""

    commands: list[Command]
    imports_s: list[float]


def measure(cases: list[str], repeats: int, smoke: bool, root: Path) -> Measure:
    """Each case `repeats` times, alternating (imports, a, b, c, imports, a, b, c, ...) so that a
    noisy machine slows each alike; each case in a folder (and store) of its own under `root`. A
    case's first command also creates its store, as a user's first run does: a median over 3 or
    more leaves that out."""
    commands = SMOKE if smoke else CASES
    measured = Measure([], [])
    for _ in range(repeats):
        if not smoke:  # --smoke measures nothing: the yardstick's seconds would only be waited for
            measured.imports_s.append(time_imports())
        for case in cases:
            folder = root / case
            folder.mkdir(parents=True, exist_ok=True)
            measured.commands.append(run_command(case, commands[case], folder))
    return measured


def verdicts(measured: Measure) -> list[str]:
    """Issue 35's targets against this measure, repeat by repeat (the i-th command of a case beside
    the i-th of another and the i-th yardstick, which ran next to it): each as its median and its
    range over the repeats, so that a noisy machine shows as a range across the target."""
    by_case: dict[str, list[Command]] = {}
    for command in measured.commands:
        by_case.setdefault(command.case, []).append(command)
    lines = []

    def spread(values: list[float]) -> str:
        return f"{min(values):.2f}-{max(values):.2f}" if len(values) > 1 else "one repeat"

    def line(what: str, values: list[float], target: str, met: bool) -> str:
        return f"{what}: {statistics.median(values):.2f} ({spread(values)}); target {target}: " + (
            "met" if met else "not met"
        )

    singles = by_case.get("single", [])
    if singles and measured.imports_s:
        # The margin: wall - (training + imports alone + allowance); at most 0 meets the target.
        margins = [
            c.wall_s - (c.training_s() + imports + SINGLE_ALLOWANCE_S)
            for c, imports in zip(singles, measured.imports_s)
        ]
        lines.append(
            line(
                "single: wall - (training + imports alone) (s)",
                [m + SINGLE_ALLOWANCE_S for m in margins],
                f"<= {SINGLE_ALLOWANCE_S}",
                statistics.median(margins) <= 0,
            )
        )
    packs, alone = by_case.get("pack", []), by_case.get("one-by-one", [])
    if packs and alone:
        ratios = [p.wall_s / a.wall_s for p, a in zip(packs, alone)]
        lines.append(
            line(
                "pack of 8 / one by one (wall)",
                ratios,
                f"<= {PACK_TARGET}",
                statistics.median(ratios) <= PACK_TARGET,
            )
        )
        # What no cut outside training goes below: the pack's process started and its libraries
        # imported (its own start and imports phases, before any run exists), then its training,
        # over the same repeat's jobs one by one. What the target leaves of the jobs' wall time is
        # all the pack's data, runs and records may take.
        processes = [p.process() for p in packs]
        fixed = [q["start"] + q["imports"] + p.training_s() for q, p in zip(processes, packs)]
        floors = [f / a.wall_s for f, a in zip(fixed, alone)]
        left = statistics.median(PACK_TARGET * a.wall_s - f for f, a in zip(fixed, alone))
        lines.append(
            "pack of 8's floor, (its start, imports and training) / one by one (wall): "
            f"{statistics.median(floors):.2f} ({spread(floors)}): "
            + (
                f"the target leaves {left:.1f} s for its data, runs and records"
                if left > 0
                else "above the target: no cut outside training reaches it"
            )
        )
    if measured.imports_s:
        lines.append(
            f"imports alone ({IMPORTS}): {statistics.median(measured.imports_s):.2f} s (median)"
        )
    else:
        lines.append(f"imports alone ({IMPORTS}): not timed (--smoke)")
    return lines


def summary(measured: list[Command]) -> dict[str, dict[str, dict[str, float]]]:
    """case -> {"command": phase -> median seconds over repeats, "run": phase -> median over every
    run of every repeat}."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for case in dict.fromkeys(c.case for c in measured):
        mine = [c for c in measured if c.case == case]
        totals = [c.totals() for c in mine]
        runs = [r for c in mine for r in c.runs]
        out[case] = {
            "command": {p: statistics.median(t[p] for t in totals) for p in totals[0]},
            "run": {
                **{p: statistics.median(r["run"].get(p, 0.0) for r in runs) for p in RUN_PHASES},
                "training": statistics.median(r["training_s"] or 0.0 for r in runs),
            },
            "runs": {"per command": statistics.median(len(c.runs) for c in mine)},
        }
    return out


def table(summ: dict, repeats: int) -> str:
    """Seconds by phase: for each case its command's total and a run's median."""
    cases = list(summ)
    head = f"{'phase (s)':22}" + "".join(f"{case + ' command':>22}{'a run':>8}" for case in cases)
    lines = [head, "-" * len(head)]
    for phase in (*PROCESS_PHASES, *RUN_PHASES, *COMMAND_ROWS):
        cells = ""
        for case in cases:
            command = summ[case]["command"].get(phase)
            run = summ[case]["run"].get(phase)
            cells += f"{command:>22.2f}" if command is not None else f"{'':>22}"
            cells += f"{run:>8.2f}" if run is not None else f"{'':>8}"
        lines.append(f"{phase:22}{cells}")
    runs = "".join(f"{summ[c]['runs']['per command']:>22.0f}{'':>8}" for c in cases)
    lines.append(f"{'runs':22}{runs}")
    lines.append(
        f"medians over {repeats} repeat(s); a run's column: the median over every run (a pack's "
        "members too); process phases are paid once per process, a pack's once for its members"
    )
    return "\n".join(lines)


def to_json(measured: Measure, summ: dict, settings: dict) -> str:
    return json.dumps(
        {
            "settings": settings,
            "summary": summ,
            "verdicts": verdicts(measured),
            "imports_s": measured.imports_s,
            "commands": [asdict(c) for c in measured.commands],
        },
        indent=1,
    )
