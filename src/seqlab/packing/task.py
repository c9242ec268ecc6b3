"""A pack's job (issue 22): the members the sweeper put in pack N (`pack_job=N`, seqlab.sweeps.packs)
trained as one packed step, each member a full MLflow run of the sweep, as it would be alone: its
params, per-step and epoch metrics, best_val_rmse, checkpoint, model, datasets and status, plus
the tags pack_id, pack_size and pack_member. Called by seqlab.task.main; where the pack cannot
train packed (its data has more than one step per sample), it raises Unpackable before any run
opens, and seqlab.task trains the members one by one. The members' runs are opened and ended
by seqlab.packing.member_runs; this module builds the members and trains the pack."""

from __future__ import annotations

import contextvars
import logging
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Callable, Optional

import pytorch_lightning as pl
import torch
from hydra import compose
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig, open_dict

from seqlab import SeqlabError, ending_status, one_line
from seqlab.packing.continuing import planned_resume, previous_attempt
from seqlab.packing.data import PackData, samples_key
from seqlab.packing.member_runs import close, ended, finish_or_fail, open_runs, stopped
from seqlab.packing.members import Member
from seqlab.packing.model import PackedCNNLSTM
from seqlab.packing.module import PackModule
from seqlab.packing.optim import PackedGradientTreatment, packed_optimizer
from seqlab.resume.checkpoints import TimedCheckpoint
from seqlab.resume.interrupt import GracefulStop
from seqlab.resume.points import CHECKPOINT, publish_resume_point
from seqlab.resume.requeue import Preempted
from seqlab.sweeps.job import Job, JobResult
from seqlab.sweeps.packs import PackPlan, key_of, member_dir
from seqlab.sweeps.trial import as_current, member_link
from seqlab.tracking.costs import PROCESS
from seqlab.training import devices
from seqlab.training.module import LOSS_TO_MSE
from seqlab.training.noise import quiet_libraries
from seqlab.training.perf import optimizer_factory, steps_per_call
from seqlab.training.trainer import build_trainer
from seqlab.validation import validate

log = logging.getLogger("seqlab")


class Unpackable(SeqlabError):
    """This pack's members cannot train packed: they train one by one (the reason is one line)."""


def member_config(overrides: list[str], output_dir: Path) -> DictConfig:
    """A member's own config, composed by Hydra from its job's overrides: what its job alone composes
    (the pack job's own keys are its members' shared ones), in its folder inside the pack's. Hydra's
    own overrides (the launcher, a trial's environment) are the pack job's."""
    mine = [
        o for o in overrides if not key_of(o).startswith(("hydra.", "hydra/", "+hydra", "~hydra"))
    ]
    member = compose(config_name=HydraConfig.get().job.config_name, overrides=mine)
    with open_dict(member):
        member.paths.output_dir = str(output_dir)
    return member


def pack_members(cfg: DictConfig, job: Job) -> list[Member]:
    """The members of this job's pack, each with its config and its own job (folder, result file)."""
    plan = PackPlan.read(job.sweep_dir)
    if not 0 <= cfg.pack_job < len(plan.packs):
        raise SeqlabError(f"pack_job={cfg.pack_job}: the sweep has {len(plan.packs)} pack(s)")
    pack_id = f"{job.sweep_info().sweep_id or job.sweep_dir.name}-p{cfg.pack_job}"
    members = []
    for k, overrides in enumerate(plan.packs[cfg.pack_job]):
        overrides = [o for o in overrides if key_of(o) != "resume"]
        out = member_dir(job.output_dir, k)
        member_job = Job(
            out,
            overrides,
            job.sweep_dir,
            job.num,
            concurrent_jobs=job.concurrent_jobs,
            member=k,
            pack_id=pack_id,
        )
        with PROCESS.phase("member configs"):
            member_cfg = member_config(overrides, out)
        members.append(Member(k, member_cfg, member_job, trial_link=member_link(overrides)))
    return members


def run_pack(cfg: DictConfig, job: Job, alone: Callable[[DictConfig, Job], Any]) -> None:
    """The pack job's task (seqlab.task.main hands it over): its members trained together, each
    its own run; or, where the pack cannot train packed, one by one as jobs of their own
    (`alone`: seqlab.task's job path). A failure ends every member's run and writes its result; the
    sweep goes on and its summary reports it."""
    members = pack_members(cfg, job)
    try:
        train_pack(cfg, job, members)
    except Unpackable as why:
        log.info("pack      %s: its %d members train one by one", why, len(members))
        for m in members:
            with as_current(m.trial_link):  # a search's trial reports to its trial as a job alone
                alone(m.cfg, m.job)
    except BaseException as error:  # noqa: BLE001 - each member's run has been ended; its result is written here
        status = ending_status(error)[0]
        for m in members:
            if m.job.result is None or m.job.result.status == "RUNNING":
                m.job.write(
                    JobResult(
                        status,
                        job.num,
                        job.sweep_info().sweep_id,
                        m.job.overrides,
                        m.run_id,
                        m.name or None,
                        reason=one_line(error),
                    )
                )
        if isinstance(error, Preempted):
            log.error(
                "preempted: the pack's runs ended KILLED; the job is requeued and continues them"
            )
            error.requeue()  # submitit requeues the job and ends this process
        if isinstance(error, SystemExit):
            raise
        if isinstance(error, KeyboardInterrupt):
            raise SystemExit(130) from None
        if isinstance(error, SeqlabError):
            log.error("error: %s", one_line(error))
        else:
            log.exception("pack failed: %s", one_line(error))


def train_pack(cfg: DictConfig, job: Job, members: list[Member]) -> list[JobResult]:
    """Train the pack; the members' results, also written to their result files. A resumed sweep
    (resume=latest|<sweep id>): members that FINISHED are skipped; a pack whose members were all
    KILLED with its checkpoint (or FAILED in it) continues from it; the others train anew. A job
    its cluster requeued continues its members' runs (seqlab.packing.continuing)."""
    for m in members:
        validate(m.cfg)
    results, to_train = [], members
    checkpoint = None
    if cfg.resume:
        to_train, results, checkpoint = planned_resume(cfg, members)
    elif (
        job.multirun
    ):  # started again by a cluster (a requeue): the pack continues its members' runs
        checkpoint = previous_attempt(job, members)
    left = [m for m in to_train if not m.ended_before]
    if (
        checkpoint is not None and not left
    ):  # every member left FAILED in an earlier start: nothing to train
        return results + [ended(m) for m in to_train]
    if to_train:
        results += _train(cfg, job, to_train, checkpoint)
    return results


def _train(
    cfg: DictConfig, job: Job, members: list[Member], resume_run_ids: Optional[list[str]]
) -> list[JobResult]:
    quiet_libraries(cfg.perf.loader)
    device = devices.resolve(cfg.trainer.accelerator)
    devices.use_cores(device, cfg.deterministic, job.cpu_share())
    # Each member built as its run alone builds it (train._fit, _build): its seed, its data, its
    # network; its dropout then draws from where the build left the global stream. Members whose
    # samples are the same read them once (_load_samples) and share them; each splits them as its run
    # alone would, and drops its split's copies until its run ends (SeqDataModule.release).
    with PROCESS.phase("data and networks"):
        samples = _load_samples(members)
    steps = set()
    for m in members:
        with PROCESS.phase("data and networks"):
            _build_member(m, samples, device)
        steps.add(m.datamodule.n_steps)
    if len(steps) > 1:
        raise Unpackable(
            f"the members' data differ in steps per sample ({', '.join(map(str, sorted(steps)))})"
        )
    if any(m.datamodule.samples.lengths is not None for m in members):
        raise Unpackable(
            "the data's sequences differ in length (packs train sequences of one length)"
        )
    with ExitStack() as stack:
        # Whatever ends this block, no member's run stays RUNNING.
        stack.push(lambda kind, error, tb: close(members, error))
        checkpoint = open_runs(cfg, job, members, stack, device)
        return _fit(cfg, job, members, device, resume_run_ids, checkpoint)


def _load_samples(members: list[Member]) -> dict[str, Any]:
    """Each distinct set of the members' samples (data.samples_key) loaded once, as many at a time
    as the job has cores: NumPy releases the GIL in the arithmetic and random draws that make
    synthetic data and in a file's reads, and each set depends on its own seed alone. The members'
    networks are then built in turn (_build_member: their seeds go through the one global stream)."""
    configs: dict[str, DictConfig] = {}
    for m in members:
        configs.setdefault(samples_key(m.cfg.data), m.cfg.data)
    modules = {key: instantiate(data) for key, data in configs.items()}
    with ThreadPoolExecutor(max(1, min(len(modules), torch.get_num_threads()))) as pool:
        # Each in a copy of this context: Hydra's target policy (a context variable) holds there too.
        loads = {
            key: pool.submit(contextvars.copy_context().run, dm.load) for key, dm in modules.items()
        }
        return {key: load.result() for key, load in loads.items()}


def _build_member(m: Member, samples: dict[str, Any], device) -> None:
    """The member's data (`samples`: _load_samples's, what members with the same samples share),
    network, dropout stream and sample order, as its run alone builds them."""
    pl.seed_everything(m.cfg.seed, workers=True, verbose=False)
    m.datamodule = instantiate(m.cfg.data)
    m.datamodule.setup("fit", samples=samples[samples_key(m.cfg.data)])
    m.network = instantiate(
        m.cfg.model, n_features=m.datamodule.n_features, n_outputs=m.datamodule.n_outputs
    )
    m.dropout_stream = torch.Generator()
    m.dropout_stream.set_state(torch.get_rng_state())
    m.order = torch.Generator(device=device.torch_device).manual_seed(m.cfg.data.seed)
    m.datamodule.release()


def _fit(
    cfg: DictConfig,
    job: Job,
    members: list[Member],
    device,
    resume_run_ids: Optional[list[str]],
    checkpoint: Optional[Path],
) -> list[JobResult]:
    """The pack trained by Lightning's Trainer (packing.module.PackModule), with a run alone's graceful
    stop and time-based checkpoint; then each member's end."""
    first = members[0]
    tracked = next(m for m in members if m.tracker is not None)  # the pack's settings for every run
    model = PackedCNNLSTM([m.network for m in members]).to(device.torch_device)
    # Each full step replayed as one CUDA graph on a GPU, as a run alone's (training.loop, perf.cuda_graph).
    graphs = device.accelerator == "gpu" and str(cfg.perf.cuda_graph).lower() not in (
        "off",
        "false",
    )
    data = PackData.of(members, device.torch_device)
    optimizer, scheduler, gradients, lr_scale = packed_update(
        cfg, members, model, data.x.dim() == 2, capturable=graphs
    )
    has_val = data.val_rows is not None
    per_call, val_every = steps_per_call(
        cfg.perf.steps_per_call, data.n_batches, cfg.trainer.val_check_interval if has_val else None
    )
    n_outputs, to_mse = first.datamodule.n_outputs, LOSS_TO_MSE[first.cfg.module.loss]
    module = PackModule(
        model,
        optimizer,
        scheduler,
        gradients,
        first.cfg.module.loss,
        lambda loss: to_mse(loss, n_outputs),
        data,
        members,
        lr_scale=lr_scale,
        steps_per_call=per_call,
        flush_every_n_steps=tracked.tracker.flush_every_n_steps,
        flush_every_s=tracked.tracker.flush_every_s,
        exact_dropout=device.accelerator == "cpu",
        cuda_graph=str(cfg.perf.cuda_graph),
        progress=sys.stderr if cfg.perf.progress == "line" else None,
        # A member that stops early (patience, its pruner) ends its run there, as its run alone ends.
        end_member=lambda m: finish_or_fail(
            m, module, trainer, device, time.perf_counter() - start
        ),
    )
    # The pack's checkpoint, as every member run's resume point (the artifact resume= looks for).
    ckpt = job.output_dir / "checkpoints" / CHECKPOINT

    def publish(path: Path, step: int) -> None:
        # Every open run's resume point, a member that failed in it too (the checkpoint holds its
        # status: a resume keeps it FAILED in its slot).
        for m in members:
            if m.run_open:
                with m.own_failure("the pack's checkpoint", step):
                    publish_resume_point(m.tracker, path, step)

    stop = GracefulStop(ckpt)
    callbacks = [stop] + (
        [TimedCheckpoint(ckpt, cfg.checkpoint.interval_s, publish, before_save=module.flush)]
        if cfg.checkpoint.interval_s > 0
        else []
    )
    trainer = build_trainer(cfg, device, callbacks, False, True, has_val, val_every)
    log.info(
        "pack      %s: %d members in one step on %s (%s)%s; %s",
        first.job.pack_id,
        len(members),
        device.accelerator,
        device.name,
        ", one batch for all (one data order)" if data.shares_order(members) else "",
        ", ".join(m.name for m in members),
    )
    for m in members:
        if m.run_open:
            with m.own_failure("its system metrics"):
                m.tracker.start_system_metrics()  # the pack's process, sampled into each member's run
    start = time.perf_counter()
    try:
        trainer.fit(module, ckpt_path=checkpoint if resume_run_ids is not None else None)
    except BaseException:
        if stop.saved is None:
            raise
        publish(stop.saved, trainer.global_step)
        stopped(members, stop, trainer.global_step)
    wall = time.perf_counter() - start
    return [finish_or_fail(m, module, trainer, device, wall) for m in members]


def packed_update(
    cfg: DictConfig, members: list[Member], model, one_step: bool, capturable: bool = False
):
    """The pack's optimizer, schedule and gradient treatment over its packed tensors, and each
    member's rate as a multiple of the optimizer's (lr_scale). Each member's optimizer is built as its
    run alone builds it (conf/optimizer/ instantiated, over its own network); the members differ only
    in their rate (a packable key), the rest is the pack's. `one_step`: the data has one step per
    sample (the convolution's other taps then take no part where nothing decays them)."""
    own = [instantiate(m.cfg.optimizer)(params=m.network.parameters()) for m in members]
    decays = any(o.defaults.get("weight_decay", 0.0) for o in own) or any(
        m.cfg.module.l2_regularization for m in members
    )
    if one_step and not decays:
        model.freeze_unused()
    params = [p for p in model.parameters() if p.requires_grad]
    lrs = [o.param_groups[0]["lr"] for o in own]
    if len(set(lrs)) == 1:
        # One learning rate: the configured optimizer over the packed tensors is each member's own
        # (Adam, AdamW, SGD and RMSprop are elementwise), fused as a single run's.
        optimizer = optimizer_factory(
            instantiate(members[0].cfg.optimizer), cfg.perf.optimizer_impl, capturable=capturable
        )(params=params)
        lr_scale = torch.ones(len(members))
    else:
        optimizer = packed_optimizer(own, params)
        lr_scale = torch.tensor(lrs)
    first = members[0].cfg
    scheduler = (
        instantiate(first.scheduler)(optimizer=optimizer)
        if first.scheduler and "_target_" in first.scheduler
        else None
    )
    module_cfgs = [m.cfg.module for m in members]
    gradients = PackedGradientTreatment(
        model.l2_parameters(),
        model.learnables(),
        [c.l2_regularization for c in module_cfgs],
        [c.gradient_threshold for c in module_cfgs],
        first.module.gradient_threshold_method,
        clip=cfg.trainer.gradient_clip_val,
    )
    return optimizer, scheduler, (gradients if gradients.active else None), lr_scale
