"""The training task of every job: plain Python, callable without the CLI (`train(cfg)`). A job is
K >= 1 members trained in one step (issue 32): a run alone is a pack of one (`fit_job`), a pack of
a multirun K of its jobs (`fit_pack`). Both go through one recipe, top to bottom:

    recipe = Recipe(cfg, job, members)
    with recipe:          # whatever ends it, no member's run stays RUNNING
        recipe.setup()    # each member's run opened, the data loaded once, the network, module, Trainer
        recipe.train()    # trainer.fit: the one loop; a signal stops it with a checkpoint
        recipe.cleanup()  # each member's end: the network kept, final metrics, models, status

Heavy: the command line reaches it through the light seqlab.task, once `sweeps.job.ready` has found
the job is to train."""

from __future__ import annotations

import logging
import os
import time
from contextlib import ExitStack
from functools import partial
from pathlib import Path
from typing import Any, Optional

import pytorch_lightning as pl
from hydra.utils import instantiate
from omegaconf import DictConfig
from pytorch_lightning.callbacks import ModelCheckpoint

from seqlab import SeqlabError, ending_status
from seqlab import callbacks as callback_group
from seqlab.ddp.rank_watch import RankWatch, rank_that_died
from seqlab.ddp.ranks import (
    handed_pack,
    multi_process,
    process_group_scope,
    start_ranks_as_this_job,
)
from seqlab.packing.build import build_member, load_samples, pack_members
from seqlab.packing.continuing import as_handed, hand_over, planned_resume, previous_attempt
from seqlab.packing.data import PackData
from seqlab.packing.member_runs import (
    close,
    ended,
    finish_or_fail,
    log_datasets,
    open_runs,
    stopped,
)
from seqlab.packing.members import Member
from seqlab.packing.model import pack_of
from seqlab.packing.module import SeqRegressor
from seqlab.packing.optim import build_update
from seqlab.packing.refill import SlotFiller
from seqlab.resume.checkpoints import TimedCheckpoint
from seqlab.resume.interrupt import GracefulStop, check_checkpoint
from seqlab.resume.points import CHECKPOINT, publish_resume_point
from seqlab.resume.requeue import previous_attempt as previous_run
from seqlab.sweeps.job import Job, JobResult, ready, resume_command
from seqlab.sweeps.pruning import trial_callbacks
from seqlab.sweeps.refill import Refiller
from seqlab.sweeps.trial import current
from seqlab.tracking import StepMetricsRecorder
from seqlab.tracking.connect import open_tracker
from seqlab.tracking.costs import PROCESS
from seqlab.tracking.lifecycle import report
from seqlab.training import devices
from seqlab.training.evaluation import LOSS_TO_MSE
from seqlab.training.loop import FusedLoop
from seqlab.training.noise import quiet_libraries
from seqlab.training.perf import steps_per_call
from seqlab.training.trainer import build_trainer
from seqlab.validation import validate

log = logging.getLogger("seqlab")


def train(cfg: DictConfig, job: Optional[Job] = None) -> JobResult:
    """Train one configuration and record it in MLflow. Raises on failure, after the run has
    been ended FAILED (or KILLED) with the reason; returns the result otherwise."""
    job = job or Job(Path(cfg.paths.output_dir))
    done = ready(cfg, job)  # before any data is loaded
    return done if done is not None else fit_job(cfg, job)


def fit_job(cfg: DictConfig, job: Job) -> JobResult:
    """A job alone, checked by `ready` (sweeps.job): a pack of one member, its run the job's. A
    job its cluster started again (a requeue) continues its run; `resume=` (a run id here, set by a
    resumed sweep's plan too) continues that one. Raises after its run ended FAILED or KILLED."""
    if job.multirun and not cfg.resume and job.rank == 0:
        sweep = job.sweep_info()
        client = open_tracker(cfg.logger, job, sweep).connect()
        cfg.resume = previous_run(job.output_dir, sweep.sweep_id, client, JobResult.read_if_any)
        if cfg.resume:
            job.overrides.append(f"resume={cfg.resume}")
    member = Member(0, cfg, job, resume_run_id=cfg.resume or None, trial_link=current())
    with process_group_scope(cfg.trainer):
        result = fit(cfg, job, [member], Path(cfg.ckpt_path) if cfg.ckpt_path else None)[0]
    if member.status == "FAILED":  # its run has ended FAILED with the reason: the job fails with it
        raise SeqlabError(member.reason)
    return result


def fit_pack(cfg: DictConfig, job: Job) -> list[JobResult]:
    """A pack's job of a multirun (`pack_job=N`): its members from the sweep's plan, each its own run
    of the sweep. A resumed sweep (resume=latest|<sweep id>): members that FINISHED are skipped; a
    pack whose members were all KILLED with its checkpoint (or FAILED in it) continues from it; the
    others train anew. A job its cluster requeued continues its members' runs
    (seqlab.packing.continuing). Errors end every member's run, and each result says why."""
    members = pack_members(cfg, job)
    try:
        for m in members:
            validate(m.cfg)
        results, to_train, resumed = [], members, False
        handed = handed_pack() if job.rank > 0 else None
        if handed is not None:  # a DDP pack's other process: as its rank 0 decided
            to_train = as_handed(members, handed)
        elif cfg.resume:
            to_train, results, run_ids = planned_resume(cfg, members)
            resumed = run_ids is not None
        elif job.multirun:
            resumed = previous_attempt(job, members) is not None
        if resumed and all(m.ended_before for m in to_train):
            return results + [ended(m) for m in to_train]  # every member ended in an earlier start
        with process_group_scope(cfg.trainer):  # DDP: a pack across processes, as a job alone
            return results + (fit(cfg, job, to_train) if to_train else [])
    except BaseException as error:
        # Each member's run has been ended; a member whose run never opened gets its result here.
        status, reason = ending_status(error)
        for m in members:
            if m.job.result is None or m.job.result.status == "RUNNING":
                result = JobResult(
                    status, job.num, job.sweep_info().sweep_id, m.job.overrides, m.run_id
                )
                result.run_name, result.reason = m.name or None, reason
                m.job.write(result)
        raise


def fit(
    cfg: DictConfig, job: Job, members: list[Member], start_from: Optional[Path] = None
) -> list[JobResult]:
    """The members trained as one job, each its own run: the recipe."""
    recipe = Recipe(cfg, job, members, start_from)
    with recipe:
        recipe.setup()
        recipe.train()
        return recipe.cleanup()


class Recipe:
    """One job's training, for its K >= 1 members: setup, train, cleanup. `start_from`: a
    checkpoint to start a new run from (ckpt_path=); a continued run's (resume=, a requeue) is
    fetched as its run reopens."""

    def __init__(
        self, cfg: DictConfig, job: Job, members: list[Member], start_from: Optional[Path] = None
    ) -> None:
        self.cfg, self.job, self.members = cfg, job, members
        self.start_from = start_from
        self.stack = ExitStack()
        self.wall = 0.0

    def __enter__(self) -> "Recipe":
        self.stack.__enter__()
        # Whatever ends the job, no member's run stays RUNNING.
        self.stack.push(lambda kind, error, tb: close(self.members, error))
        return self

    def __exit__(self, *exc: Any) -> Optional[bool]:
        return self.stack.__exit__(*exc)

    # -- setup -----------------------------------------------------------------------------------
    def setup(self) -> None:
        cfg, job, members = self.cfg, self.job, self.members
        quiet_libraries(cfg.perf.loader)
        try:
            self.device, error = devices.resolve(cfg.trainer.accelerator), None
        except SeqlabError as failure:  # recorded in the run, which opens first
            self.device, error = None, failure
        threads = cfg.perf.threads or job.cpu_share(cfg.trainer)  # before the torch_threads tag
        self.stack.enter_context(devices.use_cores(self.device, cfg.deterministic, threads))
        resumed = open_runs(job, members, self.stack, self.device)
        if error is not None:
            raise error
        self.continuing, self.start_from = resumed is not None, resumed or self.start_from
        # Each member built as its run alone builds it: its seed, its data, its network; its dropout
        # then draws from where the build left the global stream. Members whose samples are the
        # same read them once (load_samples) and share them.
        with PROCESS.phase("data and networks"):
            samples = load_samples(members)
        # A packed search that refills freed slots builds its new members from the same samples.
        # (One process: the search refuses refill with DDP, sweeps.refill.check_refill.)
        refiller = Refiller.from_environment() if len(members) > 1 and job.rank == 0 else None
        self.slots = (
            SlotFiller(refiller, job, samples, self.stack, self.device) if refiller else None
        )
        for m in members:
            with PROCESS.phase("data and networks"):
                build_member(m, samples, self.device)
            if len(members) == 1:
                log.info("data      %s", m.datamodule.describe())
            log_datasets(m, data_changed=cfg.resume_data == "changed")
            # A pack trains on the members' shared samples: each member's own split sets exist only
            # at its run's start (here) and end (packing.member_runs).
            m.datamodule.release()
        self.module, self.trainer, self.stop = self._build()
        self._describe()
        if self.start_from is not None:  # one line, before training, for a file that is no fit
            what = f"resume={cfg.resume}" if self.continuing else f"ckpt_path={cfg.ckpt_path}"
            check_checkpoint(self.start_from, self.module, what)
            log.info("resume    from %s", self.start_from)

    def _build(self) -> tuple[SeqRegressor, pl.Trainer, GracefulStop]:
        """The module with its loop, the callbacks and the Trainer, each from its config group."""
        cfg, job, members, device = self.cfg, self.job, self.members, self.device
        perf, ddp, first = cfg.perf, multi_process(cfg.trainer), members[0]
        data = PackData.of(members, device.torch_device)
        has_val = data.val_rows is not None
        val_every = cfg.trainer.val_check_interval if has_val else None
        # The fused loop: K optimizer steps per Lightning call (see perf.steps_per_call). Under
        # DDP too: each process trains its share of every member's epoch (PackData.shard, once
        # Lightning knows the ranks) and the loop averages each step's gradients over the
        # processes itself (ddp.gradients). The steps per call are counted here on the whole
        # epoch, not a process's share, so under DDP an interval in iterations is placed per step.
        fused = perf.steps_per_call > 1
        per_call, val_every = (
            steps_per_call(perf.steps_per_call, data.n_batches, val_every)
            if fused and not (ddp and val_every is not None and val_every != 1.0)
            else (1, val_every)
        )
        if ddp:
            pack = hand_over(job, members) if cfg.get("pack_job") is not None else None
            start_ranks_as_this_job(job.output_dir, job.overrides, pack)
        graphs = (  # each full step replayed as one CUDA graph (training.cudagraph); not with
            # DDP's collective between the backward and the update (ddp.gradients)
            fused
            and not ddp
            and device.accelerator == "gpu"
            and str(cfg.trainer.precision) in ("32-true", "32")
            and str(perf.cuda_graph).lower() not in ("off", "false")
        )
        n_outputs, to_mse = first.datamodule.n_outputs, LOSS_TO_MSE[first.cfg.module.loss]
        recorder = StepMetricsRecorder(
            members,
            first.tracker.flush_every_n_steps,
            lambda loss: to_mse(loss, n_outputs),
            every_s=0.0 if ddp else first.tracker.flush_every_s,
        )
        batches = None
        if not fused:  # Lightning's automatic optimisation over the one member's data module
            dm = first.datamodule
            dm.configure_batching(perf.loader, perf.data_on_device, 1)
            batches = partial(_loader, dm, lambda: module.trainer)
        scheduler = first.cfg.scheduler
        module = instantiate(first.cfg.module)(
            # A pack's members may differ in these (packable keys): each member's own.
            l2_regularization=[m.cfg.module.l2_regularization for m in members],
            gradient_threshold=[m.cfg.module.gradient_threshold for m in members],
            model=pack_of([m.network for m in members], perf.exact_shortcuts),
            members=members,
            data=data,
            update=partial(
                build_update,
                networks=[m.network for m in members],
                optimizers=[instantiate(m.cfg.optimizer) for m in members],
                scheduler=instantiate(scheduler) if scheduler and "_target_" in scheduler else None,
                clip=cfg.trainer.gradient_clip_val if fused else None,
                impl=perf.optimizer_impl,
                capturable=graphs,
                one_step=data.steps == 1,
                restartable=self.slots is not None,  # its slots refilled (packing.refill)
                may_decay=bool(self.slots and self.slots.may_decay),
            ),
            step_log=recorder.steps,
            loop=partial(FusedLoop, cuda_graph=str(perf.cuda_graph)) if fused else None,
            batches=batches,
            exact_dropout=device.accelerator == "cpu",
            loss_on_progress_bar=perf.progress == "bar",
        )
        module.set_items_per_call(per_call)
        module.resuming = self.continuing
        # A member that stops (patience, its pruner, a NaN loss) ends its run while the others train.
        module.end_member = lambda m: finish_or_fail(
            m, module.model, trainer, device, self._since()
        )
        module.slots = self.slots
        # Ctrl-C, SIGTERM and submitit's USR2 stop at a step boundary with a checkpoint (not under
        # DDP, where each process would decide on its own signal).
        stop = GracefulStop(job.output_dir / "checkpoints" / CHECKPOINT, enabled=not ddp)
        every = self._callbacks(recorder, stop, ddp)
        trainer = build_trainer(cfg, device, every, False, fused, has_val, val_every)
        return module, trainer, stop

    def _callbacks(self, recorder: StepMetricsRecorder, stop: GracefulStop, ddp: bool) -> list:
        """The job's own callbacks (the step recorder, the graceful stop, the time-based checkpoint;
        under DDP the rank watch), then the callbacks group's and a search's trial reports."""
        cfg, job, members = self.cfg, self.job, self.members
        # Ctrl-C/SIGTERM/USR2, and every checkpoint.interval_s, a checkpoint that resume= continues
        # from (not under DDP, where the processes would have to agree on the moment).
        own = [recorder, stop]
        if cfg.checkpoint.interval_s > 0 and not ddp:
            own.append(
                TimedCheckpoint(
                    stop.path, cfg.checkpoint.interval_s, self._publish, before_save=recorder.flush
                )
            )
        chosen = callback_group.build(cfg.callbacks)
        # Epoch checkpoints off (perf.checkpoint_every_n_epochs=0, the default): Lightning would still
        # keep the callback's state in every checkpoint and warn about its folder on each resume.
        chosen = {
            k: c
            for k, c in chosen.items()
            if not (isinstance(c, ModelCheckpoint) and not c.every_n_epochs)
        }
        # DDP: the other ranks' processes, watched from rank 0 (a rank that dies: one line naming it)
        watch = (
            [RankWatch.installed(job.output_dir, members[0].tracker)]
            if ddp and job.rank == 0
            else []
        )
        return [*own, *watch, *chosen.values(), *trial_callbacks(members)]

    def _publish(self, path: Path, step: int) -> None:
        """The checkpoint as every open member run's resume point, a member that failed in it too
        (the checkpoint holds its status: a resume keeps it as it ended)."""
        for m in self.members:
            if m.run_open:
                with m.own_failure("the checkpoint", step):
                    publish_resume_point(m.tracker, path, step)

    def _describe(self) -> None:
        members, device, cfg = self.members, self.device, self.cfg
        first = members[0]
        if len(members) > 1:
            log.info(
                "pack      %s: %d members in one step on %s (%s)%s; %s",
                first.job.pack_id,
                len(members),
                device.accelerator,
                device.name,
                ", one batch for all (one data order)"
                if self.module.data.shares_order(members)
                else "",
                ", ".join(m.name for m in members),
            )
        else:
            model = first.network
            log.info(
                "model     %s, %s parameters, init=%s",
                type(model).__name__,
                f"{sum(p.numel() for p in model.parameters()):,}",
                cfg.model.init,
            )
            log.info(
                "device    %s (%s); perf=%s, %d step(s) per call",
                device.accelerator,
                device.name,
                cfg.perf.name,
                self.module.items.per_item if self.module.items is not None else 1,
            )
            log.info(
                "mlflow    run %s (%s) in experiment '%s'",
                first.tracker.run_id,
                first.name,
                first.tracker.experiment_name,
            )

    # -- train -----------------------------------------------------------------------------------
    def train(self) -> None:
        """trainer.fit; on Ctrl-C, SIGTERM or submitit's USR2 the graceful stop saved a checkpoint:
        it goes to every run, with how to continue, and the runs end KILLED."""
        for m in self.members:
            if m.run_open:
                with m.own_failure("its system metrics"):
                    m.tracker.start_system_metrics()  # this process, sampled into each member's run
        trainer, stop = self.trainer, self.stop
        self.start = time.perf_counter()
        try:
            trainer.fit(self.module, ckpt_path=self.start_from)
        except BaseException as error:
            died = rank_that_died(trainer, error)
            if died is not None:
                raise died from None  # another rank died: the line that names it, not rank 0's lost collective
            if stop.saved is None or self.job.rank != 0:
                if stop.signal == "SIGINT":  # a second Ctrl-C: Lightning made it an exit with 1
                    raise KeyboardInterrupt from None
                raise
            step = trainer.global_step
            self._publish(stop.saved, step)
            stopped(self.members, stop.signal, step)
            log.error(
                "stopped by %s at step %d (epoch %d); checkpoint %s; %s",
                stop.signal,
                step,
                trainer.current_epoch + 1,
                stop.saved,
                self._then(stop),
            )
            preempted = stop.preempted()
            if preempted is not None:
                raise preempted from None  # requeued once the runs have ended (seqlab.task)
            raise SystemExit(130 if stop.signal == "SIGINT" else 143) from None
        self.wall = self._since()

    def _since(self) -> float:
        return time.perf_counter() - self.start

    def _then(self, stop: GracefulStop) -> str:
        """How the stopped job continues."""
        if stop.preempted() is not None:
            return "the job is requeued and continues its run(s)"
        if len(self.members) > 1:
            then = "continue the sweep with its command and resume=latest"
        else:
            then = f"continue with:\n  {resume_command(self.job.overrides, self.members[0].run_id)}"
        if self.job.multirun and os.environ.get("SLURM_JOB_ID"):
            # scontrol requeue, or scancel: SIGTERM says not which
            return f"if SLURM requeued the job, it continues its run(s) by itself; else {then}"
        return then

    # -- cleanup ---------------------------------------------------------------------------------
    def cleanup(self) -> list[JobResult]:
        """Each member's end (the network kept, final metrics, checkpoint, curves, models,
        status); the report of a run alone."""
        job = self.job
        # The ends' own arithmetic (final metrics, the networks' examples and checks) is small
        # operations, done while the delivery process stores and draws on the other core: on two
        # threads each waits for a busy core (a 0.5 ms forward took up to 40 ms so on the 2-core VM,
        # on one thread at most 4 ms; the pack of 32's models 155 -> 110-145 ms a member).
        with devices.torch_threads(1):
            results = [
                finish_or_fail(m, self.module.model, self.trainer, self.device, self.wall)
                for m in self.members
            ] + [m.job.result for m in self.module.retired]  # ended as they left their slots
        if len(self.members) == 1 and results[0].status == "FINISHED" and job.rank == 0:
            report(job, self.members[0].tracker, results[0], self.trainer, self.device, self.wall)
        return results


def _loader(datamodule: Any, trainer: Any) -> Any:
    """The training batches of Lightning's automatic optimisation: the data module's loader, which
    reads the Trainer for the process's rank and device (each DDP process trains on its share)."""
    datamodule.trainer = trainer()
    datamodule.setup("fit")
    return datamodule.train_dataloader()
