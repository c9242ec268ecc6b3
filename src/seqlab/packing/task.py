"""A pack's job (issue 22): the members the sweeper put in pack N (`pack_job=N`, seqlab.sweeps.packs)
trained as one packed step, each member a full MLflow run of the sweep, as it would be alone: its
params, per-step and epoch metrics, best_val_rmse, checkpoint, model, datasets and status, plus
the tags pack_id, pack_size and pack_member. Called by seqlab.task.main; where the pack cannot
train packed (its data has more than one step per sample), it raises Unpackable before any run
opens, and seqlab.task trains the members one by one."""

from __future__ import annotations

import logging
import os
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Callable, NoReturn, Optional

import pytorch_lightning as pl
import torch
from hydra import compose
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig, open_dict

from seqlab import SeqlabError, ending_status, one_line
from seqlab.callbacks.timing import target_tags
from seqlab.packing.continuing import planned_resume, previous_attempt
from seqlab.packing.data import PackData, samples_key
from seqlab.packing.members import Member
from seqlab.packing.model import PackedCNNLSTM
from seqlab.packing.module import PackModule
from seqlab.packing.optim import PackedGradientTreatment, packed_optimizer
from seqlab.resume.checkpoints import TimedCheckpoint
from seqlab.resume.interrupt import GracefulStop, prepare_resume
from seqlab.resume.points import CHECKPOINT, publish_resume_point
from seqlab.resume.requeue import Preempted
from seqlab.store.ghosts import heartbeat
from seqlab.sweeps.job import Job, JobResult
from seqlab.sweeps.packs import PackPlan, key_of, member_dir
from seqlab.sweeps.trial import as_current, member_link, open_trial
from seqlab.sweeps.workers import trainer_heartbeat
from seqlab.tracking.connect import open_tracker
from seqlab.tracking.datasets import log_training_data
from seqlab.tracking.describe import record_config
from seqlab.tracking.lifecycle import Ending, describe_run, end_run, finished_result, open_run, record_end
from seqlab.training import devices
from seqlab.training.module import LOSS_TO_MSE, final_metrics
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
    mine = [o for o in overrides if not key_of(o).startswith(("hydra.", "hydra/", "+hydra", "~hydra"))]
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
        member_job = Job(out, overrides, job.sweep_dir, job.num, concurrent_jobs=job.concurrent_jobs,
                         member=k, pack_id=pack_id)
        members.append(Member(k, member_config(overrides, out), member_job, trial_link=member_link(overrides)))
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
                m.job.write(JobResult(status, job.num, job.sweep_info().sweep_id, m.job.overrides,
                                      m.run_id, m.name or None, reason=one_line(error)))
        if isinstance(error, Preempted):
            log.error("preempted: the pack's runs ended KILLED; the job is requeued and continues them")
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
    elif job.multirun:  # started again by a cluster (a requeue): the pack continues its members' runs
        checkpoint = previous_attempt(job, members)
    left = [m for m in to_train if not m.ended_before]
    if checkpoint is not None and not left:  # every member left FAILED in an earlier start: nothing to train
        return results + [_ended(m) for m in to_train]
    if to_train:
        results += _train(cfg, job, to_train, checkpoint)
    return results


def _train(cfg: DictConfig, job: Job, members: list[Member], resume_run_ids: Optional[list[str]]) -> list[JobResult]:
    quiet_libraries(cfg.perf.loader)
    device = devices.resolve(cfg.trainer.accelerator)
    devices.use_cores(device, cfg.deterministic, job.cpu_share())
    # Each member built as its run alone builds it (train._fit, _build): its seed, its data, its
    # network; its dropout then draws from where the build left the global stream. Members whose
    # samples are the same read them once and share them (data.samples_key); each splits them as its run
    # alone would, and drops its split's copies until its run ends (SeqDataModule.release).
    samples: dict[str, Any] = {}
    steps = set()
    for m in members:
        pl.seed_everything(m.cfg.seed, workers=True, verbose=False)
        m.datamodule = instantiate(m.cfg.data)
        key = samples_key(m.cfg.data)
        if key not in samples:
            samples[key] = m.datamodule.load()
        m.datamodule.setup("fit", samples=samples[key])
        m.network = instantiate(m.cfg.model, n_features=m.datamodule.n_features, n_outputs=m.datamodule.n_outputs)
        m.dropout_stream = torch.Generator()
        m.dropout_stream.set_state(torch.get_rng_state())
        m.order = torch.Generator(device=device.torch_device).manual_seed(m.cfg.data.seed)
        steps.add(m.datamodule.n_steps)
        m.datamodule.release()
    if len(steps) > 1:
        raise Unpackable(f"the members' data differ in steps per sample ({', '.join(map(str, sorted(steps)))})")
    if any(m.datamodule.samples.lengths is not None for m in members):
        raise Unpackable("the data's sequences differ in length (packs train sequences of one length)")
    with ExitStack() as stack:
        # Whatever ends this block, no member's run stays RUNNING.
        stack.push(lambda kind, error, tb: _close(members, error))
        checkpoint = _open_runs(cfg, job, members, stack, device)
        return _fit(cfg, job, members, device, resume_run_ids, checkpoint)


def _open_runs(cfg: DictConfig, job: Job, members: list[Member], stack: ExitStack, device) -> Optional[Path]:
    """Each member's run opened (continued, where it has resume_run_id); the pack's checkpoint a
    continued pack starts from."""
    sweep = job.sweep_info()
    checkpoint = None
    for m in members:
        if m.ended_before:
            continue  # its run stays as it ended: FAILED
        m.tracker = open_tracker(m.cfg.logger, m.job, sweep)
        m.opening = describe_run(m.cfg, m.job, m.tracker, device, sweep, pack_id=m.job.pack_id,
                                 pack_size=str(len(members)), pack_member=str(m.k), torch_threads=str(torch.get_num_threads()),
                                 **(m.trial_link.tags() if m.trial_link else {}))
        m.name = m.opening.name
        if m.resume_run_id:
            # A run alone's resume, before the run reopens: the config checked against the run's, what
            # its server had not stored sent first; the pack's one checkpoint fetched once.
            fetched = prepare_resume(m.tracker.connect(), m.resume_run_id, m.opening.params, m.job.output_dir / "resume",
                                     fetch=checkpoint is None)
            checkpoint = checkpoint or fetched
        # The journal in the member's folder: a server's backlog that kill -9 cut off is sent by the resume.
        open_run(m.tracker, m.cfg, m.job, sweep, m.opening, m.resume_run_id)
        stack.enter_context(heartbeat(m.tracker))
        m.trial = open_trial(m.trial_link) if m.trial_link else None
        record_config(m.cfg, m.job, m.tracker, m.opening.params, continued=m.resume_run_id is not None,
                      code=m.opening.code)
        m.datamodule.setup("fit")  # its sets, for their digests, one member at a time
        log_training_data(m.tracker, m.cfg.data, m.datamodule, resumed=m.resume_run_id is not None,
                          data_changed=cfg.resume_data == "changed")  # the resumed sweep's command line says it
        m.datamodule.release()
    # The members' trials live while this process trains them, whatever becomes of the sweeper (sweeps.workers).
    trials = [m.trial for m in members if m.trial is not None]
    if trials:
        stack.callback(trainer_heartbeat(trials).stop)
    return checkpoint


def _fit(cfg: DictConfig, job: Job, members: list[Member], device, resume_run_ids: Optional[list[str]],
         checkpoint: Optional[Path]) -> list[JobResult]:
    """The pack trained by Lightning's Trainer (packing.module.PackModule), with a run alone's graceful
    stop and time-based checkpoint; then each member's end."""
    first = members[0]
    tracked = next(m for m in members if m.tracker is not None)  # the pack's settings for every run
    model = PackedCNNLSTM([m.network for m in members]).to(device.torch_device)
    # Each full step replayed as one CUDA graph on a GPU, as a run alone's (training.loop, perf.cuda_graph).
    graphs = device.accelerator == "gpu" and str(cfg.perf.cuda_graph).lower() not in ("off", "false")
    optimizer, scheduler, gradients, lr_scale = _packed_update(cfg, members, model, capturable=graphs)
    data = PackData.of(members, device.torch_device)
    has_val = data.val_rows is not None
    per_call, val_every = steps_per_call(cfg.perf.steps_per_call, data.n_batches,
                                         cfg.trainer.val_check_interval if has_val else None)
    n_outputs, to_mse = first.datamodule.n_outputs, LOSS_TO_MSE[first.cfg.module.loss]
    module = PackModule(model, optimizer, scheduler, gradients, first.cfg.module.loss, lambda loss: to_mse(loss, n_outputs),
                        data, members, lr_scale=lr_scale, steps_per_call=per_call,
                        flush_every_n_steps=tracked.tracker.flush_every_n_steps, flush_every_s=tracked.tracker.flush_every_s,
                        exact_dropout=device.accelerator == "cpu", cuda_graph=str(cfg.perf.cuda_graph),
                        progress=sys.stderr if cfg.perf.progress == "line" else None,
                        # A member that stops early (patience, its pruner) ends its run there, as its run alone ends.
                        end_member=lambda m: _finish_or_fail(m, module, trainer, device, time.perf_counter() - start))
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
    callbacks = [stop] + ([TimedCheckpoint(ckpt, cfg.checkpoint.interval_s, publish, before_save=module.flush)]
                          if cfg.checkpoint.interval_s > 0 else [])
    trainer = build_trainer(cfg, device, callbacks, False, True, has_val, val_every)
    log.info("pack      %s: %d members in one step on %s (%s); %s", first.job.pack_id, len(members), device.accelerator,
             device.name, ", ".join(m.name for m in members))
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
        _stopped(members, stop, trainer.global_step)
    wall = time.perf_counter() - start
    return [_finish_or_fail(m, module, trainer, device, wall) for m in members]


def _packed_update(cfg: DictConfig, members: list[Member], model, capturable: bool = False):
    """The pack's optimizer, schedule and gradient treatment over its packed tensors, and each
    member's rate as a multiple of the optimizer's (lr_scale). Each member's optimizer is built as its
    run alone builds it (conf/optimizer/ instantiated, over its own network); the members differ only
    in their rate (a packable key), the rest is the pack's."""
    own = [instantiate(m.cfg.optimizer)(params=m.network.parameters()) for m in members]
    lrs = [o.param_groups[0]["lr"] for o in own]
    if len(set(lrs)) == 1:
        # One learning rate: the configured optimizer over the packed tensors is each member's own
        # (Adam, AdamW, SGD and RMSprop are elementwise), fused as a single run's.
        optimizer = optimizer_factory(instantiate(members[0].cfg.optimizer), cfg.perf.optimizer_impl,
                                      capturable=capturable)(params=model.parameters())
        lr_scale = torch.ones(len(members))
    else:
        optimizer = packed_optimizer(own, model.parameters())
        lr_scale = torch.tensor(lrs)
    first = members[0].cfg
    scheduler = instantiate(first.scheduler)(optimizer=optimizer) if first.scheduler and "_target_" in first.scheduler else None
    module_cfgs = [m.cfg.module for m in members]
    gradients = PackedGradientTreatment(model.l2_parameters(), [p for p in model.parameters() if p.requires_grad],
                                        [c.l2_regularization for c in module_cfgs], [c.gradient_threshold for c in module_cfgs],
                                        first.module.gradient_threshold_method, clip=cfg.trainer.gradient_clip_val)
    return optimizer, scheduler, (gradients if gradients.active else None), lr_scale


def _stopped(members: list[Member], stop: GracefulStop, step: int) -> NoReturn:
    """A signal stopped the pack, its checkpoint published: the training members' runs end KILLED
    (their ExitStack), then the job is requeued (submitit's USR2: run_pack) or exits 130/143."""
    preempted = stop.preempted()
    for m in members:
        if m.active:
            m.status, m.reason = "KILLED", f"stopped by {stop.signal} at step {step}"
    if preempted is not None:
        then = "the job is requeued and continues these runs"
    elif os.environ.get("SLURM_JOB_ID"):  # scontrol requeue, or scancel: SIGTERM says not which
        then = "if SLURM requeued the job, it continues these runs by itself; else continue the sweep with its command and resume=latest"
    else:
        then = "continue the sweep with its command and resume=latest"
    log.error("stopped by %s at step %d; checkpoint %s; %s", stop.signal, step, stop.saved, then)
    if preempted is not None:
        raise preempted from None  # run_pack requeues the job once every run has ended
    raise SystemExit(130 if stop.signal == "SIGINT" else 143) from None


def _finish_or_fail(m: Member, module: PackModule, trainer, device, wall: float) -> JobResult:
    """The member's run ended as its job alone ends it; where its own run refuses (deleted in the UI,
    an upload its store refuses), that member ends FAILED and the pack's other members still end theirs.
    Its own training and validation sets are split again for its end, and dropped after it."""
    if m.job.result is not None and m.job.result.status != "RUNNING":
        return m.job.result  # its run ended where it stopped, or before this start of the pack
    if m.status != "FAILED":
        m.datamodule.setup("fit")
    try:
        return _finish(m, module, trainer, device, wall)
    except Exception as error:  # noqa: BLE001 - one member's run, not the pack's
        m.status = "RUNNING"  # it did not end as FINISHED
        m.fail(f"its MLflow run refused the end of its run: {one_line(error)}")
        try:
            return _ended(m)
        except Exception as failure:  # noqa: BLE001 - its result is written all the same (_ended)
            log.error("member %d: its run could not be ended: %s", m.k, one_line(failure))
            return m.job.result
    finally:
        m.datamodule.release()


def _finish(m: Member, module: PackModule, trainer, device, wall: float) -> JobResult:
    """The member's run as its job alone ends it: the network kept, final metrics, checkpoint,
    curves, model, status; its result."""
    tracker, cfg = m.tracker, m.cfg
    if m.status == "FAILED":
        return _ended(m)
    step = m.final_step or trainer.global_step
    weights, kept = m.kept(module.model.member(m.k), trainer.global_step)
    m.network.load_state_dict(weights)
    m.network.to(device.torch_device)
    baseline = m.datamodule.baseline_val_rmse()
    summary = final_metrics(m.network, cfg.module.loss, cfg.module.bn_statistics, m.datamodule, device.torch_device, wall,
                            m.median, baseline)
    if m.median("it_per_s") is not None:  # the pack's networks trained per second (the comparison's model-steps/s)
        summary["pack_model_steps_per_s_median"] = len(module.members) * m.median("it_per_s")
    if cfg.metrics.target_rmse is not None:  # callbacks.timing.TimeToTarget's tags, for a run alone
        tracker.set_tags(target_tags(cfg.metrics.target_rmse, m.reached))
    ending = Ending(m.network, m.datamodule.train.x, kept, summary, step, m.job.output_dir / "checkpoints" / "last.ckpt",
                    baseline, best=m.best, best_weights=m.best_weights, logged=m.logged,
                    time_to_target_s=m.reached["time_to_target_s"] if m.reached else None, pruned=m.pruned)
    ending.checkpoint.parent.mkdir(parents=True, exist_ok=True)
    # The member's network as a Lightning checkpoint's state_dict; its optimizer state is in the pack's.
    torch.save({"state_dict": {f"model.{k}": v.cpu() for k, v in m.network.state_dict().items()},
                "global_step": step, "epoch": trainer.current_epoch, "pack_id": m.job.pack_id, "pack_member": m.k},
               ending.checkpoint)
    record_end(tracker, m.job, m.name, ending)
    m.status = "FINISHED"
    result = finished_result(cfg, m.job, tracker, m.opening, ending)
    _ended(m, result)
    log.info("done      %s (member %d of pack %s): val_rmse %s, best %s, %s it/s (the pack's)", m.name, m.k,
             m.job.pack_id, _fmt(result.val_rmse), _fmt(result.best_val_rmse), _fmt(result.it_per_s, ",.0f"))
    return result


def _fmt(value, spec: str = ".4g") -> str:
    return "-" if value is None else format(value, spec)


def _ended(m: Member, result: Optional[JobResult] = None) -> JobResult:
    """End the member's run with its status (and reason), its job's artifacts logged; its result written."""
    tracker = m.tracker
    result = result or JobResult(m.status, m.job.num, m.job.sweep_info().sweep_id, m.job.overrides,
                                 m.run_id, m.name, batch_size=m.cfg.data.batch_size, reason=m.reason)
    if m.ended_before:  # its run ended in an earlier start of the pack: a FAILED one's result is written here
        if m.status != "FINISHED":  # a FINISHED one's was written as it ended (or by the resumed sweep's plan)
            m.job.write(result)
        return m.job.result
    try:
        end_run(tracker, m.status, m.reason, m.job.output_dir.parent)  # the pack job's files: its members share them
    finally:
        m.job.write(result)  # whatever its run did, the sweep reads the member's result
    return result


def _close(members: list[Member], error: Optional[BaseException]) -> None:
    """Runs the pack leaves open (an error, Ctrl-C, a stop): ended KILLED or FAILED, each result written."""
    for m in members:
        if m.tracker is None or m.tracker.run_id is None or (m.job.result is not None and m.job.result.status != "RUNNING"):
            continue  # never opened, or ended already
        if m.status == "RUNNING":
            m.status, reason = ending_status(error) if error is not None else ("FAILED", "the pack ended")
            m.reason = m.reason or reason
        try:
            _ended(m)
        except Exception as failure:  # noqa: BLE001 - every member's run gets its end
            log.error("member %d: its run could not be ended: %s", m.k, one_line(failure))
