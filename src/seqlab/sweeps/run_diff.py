"""Two runs side by side, only what differs (`scripts/compare.py --diff RUN_A RUN_B`): the params
(every resolved config key is one), the tags that say how each was made (code, device, versions,
command line), then every metric's last value in each, with the difference."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

from seqlab import SeqlabError
from seqlab.sweeps.summary import aligned

# The tags that say how a run was made (tracking/describe.py, tracking/provenance.py).
MADE_OF = (
    "git_commit",
    "git_dirty",
    "code_digest",
    "hydra_overrides",
    "accelerator",
    "device_name",
    "host",
    "torch_version",
    "cuda_version",
    "lightning_version",
    "mlflow_version",
    "torch_threads",
    "rerun_of",
)


@dataclass
class RunDiff:
    names: tuple[str, str]  # each run's name (id)
    params: list[
        tuple[str, Optional[str], Optional[str]]
    ]  # (key, A's, B's): only those that differ
    tags: list[tuple[str, Optional[str], Optional[str]]]
    metrics: list[
        tuple[str, Optional[float], Optional[float]]
    ]  # every metric of either, last values


def _run(client: Any, run_id: str) -> Any:
    try:
        return client.get_run(run_id)
    except Exception:  # noqa: BLE001 - MLflow's not-found differs by store: one line either way
        raise SeqlabError(
            f"--diff: no run {run_id} in the store (train.py prints a run's id: mlflow run ...)"
        ) from None


def _differ(
    a: dict[str, str], b: dict[str, str], keys: Any
) -> list[tuple[str, Optional[str], Optional[str]]]:
    return [(k, a.get(k), b.get(k)) for k in sorted(keys) if a.get(k) != b.get(k)]


def diff_runs(client: Any, run_a: str, run_b: str) -> RunDiff:
    a, b = _run(client, run_a), _run(client, run_b)
    names = tuple(f"{r.info.run_name} ({r.info.run_id[:8]})" for r in (a, b))
    params = _differ(a.data.params, b.data.params, set(a.data.params) | set(b.data.params))
    tags = _differ(a.data.tags, b.data.tags, MADE_OF)
    keys = sorted(
        set(a.data.metrics) | set(b.data.metrics), key=lambda k: (k.startswith("system/"), k)
    )
    metrics = [(k, a.data.metrics.get(k), b.data.metrics.get(k)) for k in keys]
    return RunDiff(names, params, tags, metrics)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.6g}"
    text = str(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _table(header: list[str], rows: list[list[str]]) -> str:
    head, *lines = aligned([header, *rows])
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return "\n".join([head, "  ".join("-" * w for w in widths), *lines])


def format_diff(diff: RunDiff) -> str:
    a, b = diff.names
    out = [f"A = {a}", f"B = {b}", ""]
    config = diff.params + diff.tags
    if config:
        out.append(f"{len(diff.params)} param(s) and {len(diff.tags)} tag(s) differ:")
        out.append(_table(["key", "A", "B"], [[k, _cell(x), _cell(y)] for k, x, y in config]))
    else:
        out.append("the same params and the same code, device and versions")
    rows = []
    for key, x, y in diff.metrics:
        both = x is not None and y is not None and math.isfinite(x) and math.isfinite(y)
        rows.append([key, _cell(x), _cell(y), f"{y - x:+.4g}" if both else "-"])
    out += ["", "metrics (last values):", _table(["metric", "A", "B", "B - A"], rows)]
    return "\n".join(out)
