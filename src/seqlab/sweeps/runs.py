"""The runs a comparison reads: found in an MLflow experiment (a sweep's, or by a filter), a job
that a resumed sweep ran again counted once, and each turned into a `RunRow` of what it measured."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import mlflow

from seqlab.sweeps.job import job_key


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
    # Networks trained per second: a pack member's pack_model_steps_per_s (K x its it/s), else its it/s.
    model_steps_per_s: Optional[float] = None
    pack_id: Optional[str] = (
        None  # a pack member's pack: its speeds are the pack's, one measurement for all members
    )
    val_history: list[tuple[float, float]] = field(
        default_factory=list, repr=False
    )  # (step, val_rmse)
    # The run's resolved config (flattened): what tells repeats of one configuration apart from
    # other configurations. Empty for rows made by hand: then device, batch and perf do.
    params: dict[str, str] = field(default_factory=dict, repr=False)


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
            "tags.sweep_role = 'parent'"
            + (f" and tags.sweep_id = '{sweep}'" if sweep != "latest" else ""),
            order_by=["attributes.start_time DESC"],
            max_results=1,
        )
        if not parents:
            raise ValueError(f"no sweep {sweep!r} in experiment {experiment!r}")
        parent = parents[0]
        filters.append(f"tags.sweep_id = '{parent.data.tags['sweep_id']}'")
    runs = client.search_runs(
        [exp.experiment_id],
        " and ".join(filters),
        max_results=5000,
        order_by=["attributes.start_time DESC"],
    )
    # Neither a sweep's parent nor predict.py's evaluation runs (seqlab.predict) are training runs.
    runs = [
        r
        for r in runs
        if r.data.tags.get("sweep_role") != "parent" and r.data.tags.get("run_type") != "evaluation"
    ]
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
            history = [
                (h.step, h.value) for h in client.get_metric_history(run.info.run_id, "val_rmse")
            ]
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
                # A packed run's speeds are its pack's steps/s: never in one group with runs alone.
                perf=p.get("perf.name", "?")
                + (f", packed x{t.get('pack_size', '?')}" if "pack_id" in t else ""),
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
                model_steps_per_s=m.get("pack_model_steps_per_s_median")
                if "pack_id" in t
                else m.get("it_per_s_median"),
                pack_id=t.get("pack_id"),
                val_history=history,
                params=dict(p),
            )
        )
    return sorted(rows, key=lambda r: (r.device, r.perf, r.batch_size or 0, r.seed or 0, r.name))
