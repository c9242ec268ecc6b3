"""Runs tracked where the server could not be reached (compute nodes without a route to it, each
job into a local store: `logger=mlflow` with paths on the node or a shared disk) copied into the
tracking server later, once: `scripts/sync.py --from sqlite:///.../mlflow.db --to http://host:5000`.

Every ended run of the source's experiments (or of the ones named) is copied whole, with its
start and end times, tags, params, every metric's full history with its steps and timestamps,
its artifacts and its logged models (MLflow 3's models: the run's `model`). A sweep's parent is
copied before its jobs, which point at the copy. The copy carries `seqlab_synced_from` (the source
run's id), written last: a run that has it is not copied again, so running sync again copies only
what is new; a copy cut short (no such tag) is deleted and made again. Runs still RUNNING wait for
a later sync. A run that changed since its copy (one KILLED then, resumed and ended since: its end
status or end time differs from its copy's) has what it gained copied into the same copy: the metric
values the copy lacks, its tags, artifacts, models and status. A job copied while its sweep's parent
still ran is linked to the parent's copy once the parent arrives. Nothing here trains: MLflow's
client only."""

from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional

import mlflow
from mlflow.entities import Metric, Param, RunTag, ViewType

from seqlab.store.models import run_models

log = logging.getLogger("seqlab")

SYNCED_FROM = "seqlab_synced_from"  # on a copy, written last: the source run's id
MODEL_FROM = "seqlab_synced_from_model"  # on a copied logged model: the source model's id
COPYING = "seqlab_sync_copying"  # on a copy from its start: a copy cut short has only this
MAX_METRICS, MAX_PARAMS = 1000, 100  # MLflow's most per log_batch call


@dataclass
class Synced:
    """What a sync did: the runs copied (source id -> copy id), and those left."""

    copied: dict[str, str] = field(default_factory=dict)
    present: int = 0  # copied by an earlier sync
    running: list[str] = field(default_factory=list)  # still RUNNING in the source: next time
    redone: int = 0  # copies an earlier sync had not finished, deleted and made again
    followed: int = 0  # copies brought up to date with what their run gained since (a resumed run)
    linked: int = 0  # copies linked to their sweep's parent, which arrived after them


def _runs(client: Any, experiment_id: str) -> Iterator[Any]:

    token = None
    while True:
        page = client.search_runs(
            [experiment_id],
            run_view_type=ViewType.ACTIVE_ONLY,
            max_results=1000,
            order_by=["attributes.start_time ASC"],
            page_token=token,
        )
        yield from page
        token = page.token
        if not token:
            return


def _experiment_id(dst: Any, name: str) -> str:
    found = dst.get_experiment_by_name(name)
    return found.experiment_id if found is not None else dst.create_experiment(name)


def _copies(dst: Any, experiment_id: str) -> tuple[dict[str, Any], list[str]]:
    """In the destination: source run id -> its finished copy (the run), and the copies cut short."""
    done, partial = {}, []
    for run in _runs(dst, experiment_id):
        tags = run.data.tags
        if SYNCED_FROM in tags:
            done[tags[SYNCED_FROM]] = run
        elif COPYING in tags:
            partial.append(run.info.run_id)
    return done, partial


def sync(src: Any, dst: Any, experiments: Optional[list[str]] = None) -> Synced:
    """Copy what `src` (an MlflowClient) has and `dst` lacks; `experiments`: names (None: all)."""

    result = Synced()
    for experiment in src.search_experiments(view_type=ViewType.ACTIVE_ONLY):
        if experiments and experiment.name not in experiments:
            continue
        runs = list(_runs(src, experiment.experiment_id))
        if not runs:
            continue
        target = _experiment_id(dst, experiment.name)
        found, partial = _copies(dst, target)
        for run_id in partial:
            dst.delete_run(run_id)
        result.redone += len(partial)
        copies = {source: copy.info.run_id for source, copy in found.items()}
        # Parents first: a sweep's jobs point at their parent's copy.
        for run in sorted(runs, key=lambda r: "mlflow.parentRunId" in r.data.tags):
            run_id = run.info.run_id
            if run.info.status == "RUNNING":
                result.running.append(run_id)  # a resumed run too: followed once it has ended again
            elif run_id not in found:
                copies[run_id] = result.copied[run_id] = copy_run(src, dst, run, target, copies)
            else:
                result.present += 1
                copy = found[run_id]
                # The copy has its source's end as it was then: another end since is a resumed run's.
                if (copy.info.status, copy.info.end_time) != (run.info.status, run.info.end_time):
                    follow_run(src, dst, run, copy, target)
                    result.followed += 1
            parent = run.data.tags.get("mlflow.parentRunId")
            copy_tags = found[run_id].data.tags if run_id in found else {}
            if (
                parent in copies
                and run_id in found
                and copy_tags.get("mlflow.parentRunId") != copies[parent]
            ):
                dst.set_tag(
                    copies[run_id], "mlflow.parentRunId", copies[parent]
                )  # its parent arrived after it
                result.linked += 1
    return result


def copy_run(src: Any, dst: Any, run: Any, experiment_id: str, copies: dict[str, str]) -> str:
    """One run into `dst`'s experiment: its copy's id. `copies`: source id -> copy id so far (its parent's)."""

    source_id = run.info.run_id
    tags = dict(run.data.tags)
    parent = tags.pop("mlflow.parentRunId", None)
    if parent in copies:
        tags["mlflow.parentRunId"] = copies[parent]
    tags[COPYING] = source_id
    copy = dst.create_run(
        experiment_id, start_time=run.info.start_time, tags=tags, run_name=run.info.run_name
    ).info.run_id
    params = [Param(k, v) for k, v in run.data.params.items()]
    for i in range(0, len(params), MAX_PARAMS):
        dst.log_batch(copy, params=params[i : i + MAX_PARAMS])
    _copy_gained(src, dst, run, copy, experiment_id, tags, new=True)
    dst.log_batch(copy, tags=[RunTag(SYNCED_FROM, source_id)])  # last: only a whole copy has it
    return copy


def follow_run(src: Any, dst: Any, run: Any, copy: Any, experiment_id: str) -> None:
    """What `run` gained since its copy was made (it was resumed and has ended again) into that copy."""
    _copy_gained(src, dst, run, copy.info.run_id, experiment_id, copy.data.tags, new=False)


def _copy_gained(
    src: Any,
    dst: Any,
    run: Any,
    copy_id: str,
    experiment_id: str,
    copy_tags: dict[str, str],
    new: bool,
) -> None:
    """Into the copy, what it lacks of `run`: metric values (a `new` copy lacks them all), tags, the
    artifacts (written over), logged models, and then the run's status and end."""

    source_id = run.info.run_id
    for key in run.data.metrics:
        have = (
            set()
            if new
            else {(m.step, m.timestamp, m.value) for m in dst.get_metric_history(copy_id, key)}
        )
        gained = [
            Metric(m.key, m.value, m.timestamp, m.step)
            for m in src.get_metric_history(source_id, key)
            if (m.step, m.timestamp, m.value) not in have
        ]
        for i in range(0, len(gained), MAX_METRICS):
            dst.log_batch(copy_id, metrics=gained[i : i + MAX_METRICS], synchronous=True)
    tags = [
        RunTag(k, v)
        for k, v in run.data.tags.items()
        if k != "mlflow.parentRunId" and copy_tags.get(k) != v
    ]
    for i in range(0, len(tags), MAX_PARAMS):
        dst.log_batch(copy_id, tags=tags[i : i + MAX_PARAMS])
    with tempfile.TemporaryDirectory(prefix="seqlab-sync-") as tmp:
        local = Path(src.download_artifacts(source_id, "", tmp))
        if any(local.iterdir()):
            dst.log_artifacts(copy_id, str(local))
    _copy_models(src, dst, run, experiment_id, copy_id)
    dst.set_terminated(copy_id, run.info.status, end_time=run.info.end_time)


def _copy_models(src: Any, dst: Any, run: Any, experiment_id: str, copy: str) -> None:
    """The run's logged models (MLflow 3), each as a model of the copy with the same files; those
    the copy has already (an earlier sync's) are left as they are."""

    have = {(m.tags or {}).get(MODEL_FROM) for m in run_models(dst, dst.get_run(copy))}
    for model in run_models(src, run):
        if model.model_id in have:
            continue
        made = dst.create_logged_model(
            experiment_id,
            name=model.name,
            source_run_id=copy,
            tags={**dict(model.tags or {}), MODEL_FROM: model.model_id},
            params=dict(model.params or {}),
            model_type=model.model_type,
        )
        with tempfile.TemporaryDirectory(prefix="seqlab-sync-model-") as tmp:
            local = mlflow.artifacts.download_artifacts(
                artifact_uri=model.artifact_location, dst_path=tmp, tracking_uri=src.tracking_uri
            )
            dst.log_model_artifacts(made.model_id, local)
        dst.finalize_logged_model(made.model_id, "READY")
