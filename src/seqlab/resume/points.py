"""A run's resume point: its interrupt checkpoint as the artifact `checkpoints/interrupted.ckpt`, and
the tag `interrupted_at_step` that says it is there. Set by a Ctrl-C/SIGTERM stop
(seqlab.resume.interrupt) and by the time-based checkpoint (seqlab.resume.checkpoints), read by
`resume=`, a resumed sweep's plan and the reaper of dead runs. Light to import (no torch, no
Lightning): the sweep callback and the store's reaper read the tag's name."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from seqlab.delivery.stores import MAX_BATCH, open_rows
from seqlab.safe_writes import replace_atomically

CHECKPOINT = "interrupted.ckpt"
UNSENT = (
    "interrupted.unsent.json"  # the metrics a tracking server had not stored yet at the checkpoint
)
STOPPED_AT = "interrupted_at_step"  # the run's tag while it has a checkpoint to resume from


def store_checkpoint(tracker: Any, path: Path, artifact_path: str = "checkpoints") -> None:
    """The run's copy of a checkpoint file. Into a local artifact folder it is copied under a
    temporary name and renamed (MLflow copies in place: a kill mid-copy would leave a truncated
    file that a resume downloads); elsewhere MLflow uploads it (a server stores an upload only
    once it has all of it)."""
    if tracker.run_id:
        folder = tracker.local_artifact_dir()
        if folder is not None:
            replace_atomically(
                folder / artifact_path / path.name, lambda tmp: shutil.copyfile(path, tmp)
            )
            return
    tracker.log_artifact(path, artifact_path)


def publish_resume_point(tracker: Any, path: Path, step: int) -> None:
    """Make `path` the checkpoint `resume=RUN_ID` continues from: the artifacts first, then the tag
    that says they are there (a kill between the two leaves the previous one in force). resume=
    continues after the checkpoint and does not send its steps again, so every metric before it
    must reach the store: the run's metrics are stored first (sync_metrics), and what a tracking
    server has not taken yet (a backlog: the server slower than training, or away) goes beside
    the checkpoint, UNSENT, which the resumed run sends first (deliver_unsent)."""
    tracker.sync_metrics()
    rows = [[m.key, m.value, m.timestamp, m.step] for m in tracker.unsent_metrics()]
    unsent = path.with_name(UNSENT)
    replace_atomically(unsent, lambda tmp: tmp.write_text(json.dumps(rows)))
    store_checkpoint(tracker, unsent)  # always: an empty one replaces an earlier checkpoint's
    store_checkpoint(tracker, path)
    tracker.set_tags_now({STOPPED_AT: step})


def deliver_unsent(client: Any, run_id: str, dst: Path) -> int:
    """Send the metrics a stopped run had not stored when its checkpoint was published (a store
    holds a row it already has once: rows the run sent after all are not doubled); how many."""
    from mlflow.exceptions import MlflowException  # MLflow: a resume only (jobs import us)

    try:
        path = Path(client.download_artifacts(run_id, f"checkpoints/{UNSENT}", str(dst)))
    except (MlflowException, OSError):
        return 0  # a checkpoint from before UNSENT
    rows = [
        (str(k), float(v), int(ts), int(step)) for k, v, ts, step in json.loads(path.read_text())
    ]
    writer = open_rows(client.tracking_uri)  # as the delivery process writes them
    for i in range(0, len(rows), MAX_BATCH):
        writer.write(run_id, rows[i : i + MAX_BATCH])
    return len(rows)


def drop_resume_point(tracker: Any) -> None:
    """Training went to its end: no checkpoint is left to continue from (a finished run is not resumed)."""
    from mlflow.exceptions import MlflowException  # MLflow: a run's end only (as above)

    if tracker.client is None or not tracker.run_id:
        return
    try:
        tracker.client.delete_tag(tracker.run_id, STOPPED_AT)
    except MlflowException:
        pass  # it had none


def fetch_checkpoint(client: Any, run_id: str, dst: Path) -> Path:
    """The run's interrupt checkpoint, downloaded into `dst`."""

    os.environ.setdefault(
        "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false"
    )  # one file: a bar would be noise
    return Path(client.download_artifacts(run_id, f"checkpoints/{CHECKPOINT}", str(dst)))
