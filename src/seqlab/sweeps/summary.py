"""The end-of-sweep table: every job's result file (seqlab_job.json) read back, one row a job, as
printed to the console and stored on the parent run as sweep_summary.txt and .csv (a large pack
is one row of the console's table, every member one of the csv's)."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Optional

from seqlab.sweeps.job import JOB_FILE, JobResult, PlannedJob, fmt, job_key


def aligned(cells: list[list[str]]) -> list[str]:
    """Rows of cells as lines of a plain-text table: each column as wide as its widest cell, two
    spaces between columns (the summary, scripts/compare.py's tables and --diff)."""
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]


def collect(sweep_dir: Path, sweep_id: str | None = None) -> list[JobResult]:
    """Every job of the sweep that got as far as writing its result file, in job order (files
    of another sweep that used the same folder are left out)."""
    results = [JobResult.read(p) for p in sweep_dir.glob(f"**/{JOB_FILE}")]
    results = [r for r in results if sweep_id is None or r.sweep_id == sweep_id]
    return sorted(results, key=lambda r: (r.job is None, r.job, r.member or 0))


def job_label(result: JobResult) -> str:
    """The job's number; a packed job's as pack.member (3.0, 3.1, ...)."""
    return fmt(result.job, "d") + ("" if result.member is None else f".{result.member}")


def _status(result: JobResult, plan: Optional[dict[str, PlannedJob]]) -> str:
    """The job's status; in a resumed sweep, also whether it was done before or continued."""
    before = (plan or {}).get(job_key(result.overrides))
    if before is None or before.run_id != result.run_id:
        return result.status
    if before.status == "FINISHED":
        return "FINISHED (done before: skipped)"
    if before.status == "RUNNING":
        return "RUNNING (elsewhere: left alone)"
    return f"{result.status} (continued)"


def summary_rows(
    results: list[JobResult], plan: Optional[dict[str, PlannedJob]] = None
) -> list[dict[str, str]]:
    return [
        {
            "job": job_label(r),
            "overrides": " ".join(o for o in r.overrides if not o.startswith("resume="))
            or "(defaults)",
            "status": _status(r, plan),
            "it/s": fmt(r.it_per_s, ",.0f"),
            "val_rmse": fmt(r.val_rmse, ".4g"),
            "best": fmt(r.best_val_rmse, ".4g"),  # the lowest val_rmse of the run
            "run": r.run_name or "-",
        }
        for r in results
    ]


# A pack with more members than this is one console row (sweep_summary.csv keeps every member).
ROWS_PER_PACK = 4


def _pack_row(rows: list[dict[str, str]], members: list[JobResult]) -> dict[str, str]:
    """One console row for a large pack: its members' shared overrides, how many ended how, the
    pack's it/s, and the range of their val_rmse and best."""
    shared = [o for o in members[0].overrides if all(o in m.overrides for m in members)]
    statuses: dict[str, int] = {}
    for row in rows:
        statuses[row["status"]] = statuses.get(row["status"], 0) + 1

    def span(values: list[Optional[float]]) -> str:
        found = [v for v in values if v is not None]
        return (
            "-"
            if not found
            else fmt(min(found))
            if min(found) == max(found)
            else f"{fmt(min(found))}..{fmt(max(found))}"
        )

    return {
        "job": f"{rows[0]['job']}-{members[-1].member}",
        "overrides": " ".join([*shared, f"({len(members)} members)"]),
        "status": ", ".join(f"{n} {status}" for status, n in statuses.items()),
        "it/s": rows[0]["it/s"],
        "val_rmse": span([m.val_rmse for m in members]),
        "best": span([m.best_val_rmse for m in members]),
        "run": f"{rows[0]['run']} ..",
    }


def _console_rows(
    results: list[JobResult], plan: Optional[dict[str, PlannedJob]]
) -> list[dict[str, str]]:
    rows = summary_rows(results, plan)
    out, i = [], 0
    while i < len(rows):
        r = results[i]
        j = i + 1
        while j < len(rows) and r.pack_id is not None and results[j].pack_id == r.pack_id:
            j += 1
        out += [_pack_row(rows[i:j], results[i:j])] if j - i > ROWS_PER_PACK else rows[i:j]
        i = j
    return out


def format_summary(results: list[JobResult], plan: Optional[dict[str, PlannedJob]] = None) -> str:
    rows = _console_rows(results, plan)
    if not rows:
        return "no job results found"
    columns = list(rows[0])
    lines = aligned([columns] + [[row[c] for c in columns] for row in rows])
    lines += [f"job {job_label(r)}: {r.reason}" for r in results if r.reason]
    if any(r.member is not None for r in results):
        # Never one column of packed and unpacked speeds without saying so (seqlab.packing).
        lines.append(
            "jobs N.k trained packed, as member k of pack N (N.0-k: the pack's members, their val_rmse and best "
            "as a range): their it/s is the pack's steps/s (K networks a step); each run's "
            "pack_model_steps_per_s is K x that"
        )
    return "\n".join(lines)


def summary_csv(results: list[JobResult], plan: Optional[dict[str, PlannedJob]] = None) -> str:
    rows = summary_rows(results, plan)
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=[*rows[0], "reason"] if rows else ["job"])
    writer.writeheader()
    for row, result in zip(rows, results):
        writer.writerow({**row, "reason": result.reason or ""})
    return out.getvalue()
