"""How a pack's job continues the runs of an earlier start: `resume=` (the resumed sweep's plan, member
by member as seqlab.sweeps.job.continue_job decides for a job alone) and a cluster's requeue (each
member's run found as a job alone finds its own, seqlab.resume.requeue.previous_attempt). A pack
continues only as a whole, from its one checkpoint: every member's run must have it. A member that
FAILED in the pack before the checkpoint (its loss diverged) keeps its slot, FAILED, and is not
trained again (`Member.ended_before`: its run is not reopened)."""

from __future__ import annotations

import logging
from typing import Optional

from omegaconf import DictConfig

from seqlab.packing.members import Member
from seqlab.resume.requeue import previous_attempt as run_of_last_attempt
from seqlab.sweeps.job import Job, JobResult, continue_job, planned
from seqlab.tracking.connect import open_tracker

log = logging.getLogger("seqlab")


def planned_resume(
    cfg: DictConfig, members: list[Member]
) -> tuple[list[Member], list[JobResult], Optional[list[str]]]:
    """(members to train, results of members done before, the run ids the pack continues or None),
    from the resumed sweep's plan, member by member as continue_job decides for a job alone. A
    member that FAILED in the pack before its checkpoint goes on with it, in its slot, FAILED."""
    results, to_train, finished = [], [], []
    for m in members:
        m.cfg.resume = cfg.resume
        m.job.overrides.append(f"resume={cfg.resume}")
        entry = planned(m.cfg, m.job)
        done = continue_job(
            m.cfg, m.job
        )  # FINISHED before: its result; KILLED with a checkpoint: m.cfg.resume = its run
        if done is not None and done.status == "FINISHED" and done.run_id:
            finished.append(
                m
            )  # it may have ended inside the pack (it stopped early): it may keep its slot (below)
            continue
        if done is not None:
            results.append(done)
            continue
        m.resume_run_id, m.cfg.resume = m.cfg.resume, None
        if m.resume_run_id is not None and entry.status == "FAILED":
            m.ended_before, m.status, m.name = True, "FAILED", entry.run_name or ""
        to_train.append(m)
    continuing = [m.resume_run_id for m in to_train]
    if not to_train or None in continuing or len(to_train) + len(finished) != len(members):
        for m in to_train:  # the pack cannot continue as a whole: these train anew
            m.resume_run_id, m.ended_before, m.status = None, False, "RUNNING"
        return to_train, results + [m.job.result for m in finished], None
    # The pack continues from its checkpoint: a member that stopped early and FINISHED in it keeps its
    # slot, frozen, its run as it ended (its result is the one the plan gave: m.job.result).
    for m in finished:
        m.resume_run_id, m.ended_before, m.status, m.name = (
            m.job.result.run_id,
            True,
            "FINISHED",
            m.job.result.run_name or "",
        )
    slots = [m for m in members if m in finished or m in to_train]
    return slots, results, [m.resume_run_id for m in slots]


def previous_attempt(job: Job, members: list[Member]) -> Optional[list[str]]:
    """The runs this pack job's last attempt left, when the job is started again in its folder (a
    SLURM requeue, submitit's requeue after its preemption signal): each member's, as a job alone
    finds its own (resume.requeue.previous_attempt). The pack continues only as a whole, every
    member's run with the pack's checkpoint; a member that FAILED in it keeps its slot, FAILED."""
    before = [JobResult.read_if_any(m.job.output_dir) for m in members]
    if any(b is None for b in before):
        return None  # the job's first start
    if all(b.status == "FINISHED" for b in before):
        return None  # every member ended: nothing to continue
    sweep = job.sweep_info()
    client = open_tracker(members[0].cfg.logger, members[0].job, sweep).connect()
    # A member that FINISHED in the last attempt (it stopped early) keeps its run as it ended.
    run_ids = [
        b.run_id
        if b.status == "FINISHED"
        else run_of_last_attempt(m.job.output_dir, sweep.sweep_id, client, JobResult.read_if_any)
        for m, b in zip(members, before)
    ]
    if None in run_ids:
        log.info(
            "requeue   pack %s: not every member's run has the pack's checkpoint: the pack trains anew",
            members[0].job.pack_id,
        )
        return None
    for m, b, run_id in zip(members, before, run_ids):
        m.resume_run_id = run_id
        if b.status in (
            "FAILED",
            "FINISHED",
        ):  # it ended in the pack (diverged, stopped early): its slot stays as it ended
            m.ended_before, m.status, m.name = True, b.status, b.run_name or ""
            if b.status == "FINISHED":
                m.job.result = (
                    b  # its result stays the one its end wrote (packing.member_runs.ended)
                )
    return run_ids


def hand_over(job: Job, members: list[Member]) -> dict:
    """The pack as this process (rank 0) decided it, for the other processes of a DDP pack
    (seqlab.ddp.ranks.handed_pack): they train the same members, continuing the same runs."""
    return {
        "sweep_dir": str(job.sweep_dir),
        "num": job.num,
        "members": [
            {
                "k": m.k,
                "resume_run_id": m.resume_run_id,
                "ended_before": m.ended_before,
                "status": m.status,
            }
            for m in members
        ],
    }


def as_handed(members: list[Member], handed: dict) -> list[Member]:
    """In a DDP pack's other process: the members rank 0 trains, as it decided them (hand_over); a
    process of its own would read the sweep's results and runs while rank 0 writes them."""
    to_train = []
    for entry in handed["members"]:
        m = members[entry["k"]]
        m.resume_run_id, m.ended_before, m.status = (
            entry["resume_run_id"],
            entry["ended_before"],
            entry["status"],
        )
        to_train.append(m)
    return to_train
