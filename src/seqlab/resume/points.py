"""A run's resume point: its interrupt checkpoint as the artifact `checkpoints/interrupted.ckpt`, and
the tag `interrupted_at_step` that says it is there. Set by a Ctrl-C/SIGTERM stop
(seqlab.resume.interrupt) and by the time-based checkpoint (seqlab.resume.checkpoints), read by
`resume=`, a resumed sweep's plan and the reaper of dead runs. Light to import (no torch, no
Lightning): the sweep callback and the store's reaper read the tag's name."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from seqlab.resume.safe_writes import replace_atomically

CHECKPOINT = "interrupted.ckpt"
STOPPED_AT = "interrupted_at_step"  # the run's tag while it has a checkpoint to resume from


def store_checkpoint(tracker: Any, path: Path, artifact_path: str = "checkpoints") -> None:
    """The run's copy of a checkpoint file. Into a local artifact folder it is copied under a
    temporary name and renamed (MLflow copies in place: a kill mid-copy would leave a truncated
    file that a resume downloads); elsewhere MLflow uploads it (a server stores an upload only
    once it has all of it)."""
    if tracker.run_id:
        folder = tracker.local_artifact_dir()
        if folder is not None:
            replace_atomically(folder / artifact_path / path.name, lambda tmp: shutil.copyfile(path, tmp))
            return
    tracker.log_artifact(path, artifact_path)


def publish_resume_point(tracker: Any, path: Path, step: int) -> None:
    """Make `path` the checkpoint `resume=RUN_ID` continues from: the artifact first, then the tag
    that says it is there (a kill between the two leaves the previous one in force). The run's
    metrics are stored first: resume= continues after the checkpoint and does not send its steps
    again, so a step still on its way to the store when the process is killed would be lost for good."""
    tracker.sync_metrics()
    store_checkpoint(tracker, path)
    tracker.set_tags({STOPPED_AT: step})


def drop_resume_point(tracker: Any) -> None:
    """Training went to its end: no checkpoint is left to continue from (a finished run is not resumed)."""
    from mlflow.exceptions import MlflowException

    if tracker.client is None or not tracker.run_id:
        return
    try:
        tracker.client.delete_tag(tracker.run_id, STOPPED_AT)
    except MlflowException:
        pass  # it had none


def fetch_checkpoint(client: Any, run_id: str, dst: Path) -> Path:
    """The run's interrupt checkpoint, downloaded into `dst`."""
    import os

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # one file: a bar would be noise
    return Path(client.download_artifacts(run_id, f"checkpoints/{CHECKPOINT}", str(dst)))
