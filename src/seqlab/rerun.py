"""`python train.py rerun=<run id>`: the run made again, from what it recorded (issue 36, point 2).
Its command line's overrides (the `hydra_overrides` tag) are composed again by Hydra, with what this
command line adds after them; the code must be the run's (its `code_digest`: the git commit and the
uncommitted diff, tracking/provenance.py), else one line says how to get it, or `rerun_code=current`
trains with the code as it is. The new run is tagged `rerun_of`."""

from __future__ import annotations

import re
from pathlib import Path

from hydra import compose
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, open_dict

from seqlab import SeqlabError
from seqlab.schema import RerunCode, choice
from seqlab.store.local import open_client
from seqlab.store.server_auth import client_credentials
from seqlab.sweeps.job import Job
from seqlab.sweeps.packs import key_of
from seqlab.tracking.provenance import code_state

OWN_KEYS = ("rerun", "rerun_code")
# An override as Hydra reads it, its quoted parts kept whole: "notes='a b'" is one.
_OVERRIDE = re.compile(r"""(?:[^\s'"]+|'[^']*'|"[^"]*")+""")


def recorded_overrides(tag: str) -> list[str]:
    """The overrides of a run's `hydra_overrides` tag (space-joined, as tracking.describe writes it)."""
    return _OVERRIDE.findall(tag)


def _short(commit: str | None) -> str:
    return commit[:10] if commit else "none"


def check_code(run_id: str, tags: dict[str, str], root: Path) -> None:
    """Refuse (one line) when the code under `root` is not the run's."""
    now = code_state(root)
    if tags.get("code_digest") and tags["code_digest"] == now.digest:
        return
    then = _short(tags.get("git_commit")) + (
        " with uncommitted changes (its artifact code/diff.patch)"
        if tags.get("git_dirty") == "true"
        else ""
    )
    if "code_digest" not in tags:
        then += "; its uncommitted changes were not recorded"
    current = _short(now.commit) + (" with uncommitted changes" if now.dirty else "")
    raise SeqlabError(
        f"rerun={run_id}: the code is not the run's (it ran at {then}; this is {current}): check out "
        f"its commit (and apply its code/diff.patch), or add rerun_code=current to train with this code"
    )


def rerun_config(cfg: DictConfig, job: Job) -> tuple[DictConfig, Job]:
    """The run `cfg.rerun` made again: its config composed from its overrides and this command line's
    others, in this job's folder; the job's overrides are those (what its run records)."""
    run_id = str(cfg.rerun)
    if job.multirun:
        raise SeqlabError(f"rerun={run_id} makes one run again: run it without -m")
    if cfg.resume:
        raise SeqlabError(
            f"rerun={run_id} and resume={cfg.resume}: rerun trains anew, resume continues; give one"
        )
    client = open_client(client_credentials(cfg.logger.tracking_uri))
    try:
        run = client.get_run(run_id)
    except Exception:  # noqa: BLE001 - MLflow's not-found differs by store: one line either way
        raise SeqlabError(
            f"rerun={run_id}: no such run in the store {cfg.logger.tracking_uri} (train.py prints a "
            f"run's id: mlflow run ...)"
        ) from None
    tags = run.data.tags
    if "hydra_overrides" not in tags:
        raise SeqlabError(
            f"rerun={run_id}: the run has no hydra_overrides tag (not a training run of train.py)"
        )
    if choice(RerunCode, cfg.rerun_code, "rerun_code") == RerunCode.recorded:
        check_code(run_id, tags, Path(cfg.paths.root_dir))
    mine = [o for o in job.overrides if key_of(o) not in OWN_KEYS]
    given = {
        key_of(o) for o in mine
    }  # a key this command line sets again: its value, not the run's
    overrides = [
        *(o for o in recorded_overrides(tags["hydra_overrides"]) if key_of(o) not in given),
        *mine,
    ]
    again = compose(
        config_name=HydraConfig.get().job.config_name,
        overrides=[*overrides, f"rerun={run_id}", f"rerun_code={cfg.rerun_code}"],
    )
    with open_dict(again):
        again.paths.output_dir = cfg.paths.output_dir
    job.overrides = overrides
    return again, job
