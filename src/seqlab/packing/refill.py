"""A pack's freed slots taken by a search's next trials (hydra.sweeper.refill, issue 36 point 4): at
an epoch's end, each slot whose member has ended (pruned, diverged, its own epochs done) goes to the
trial the study gives next (seqlab.sweeps.refill), its member built as its job alone builds it and
its run opened, and trains in the slot from the next step (`take_slot`), as its job alone would."""

from __future__ import annotations

import logging
from contextlib import ExitStack
from typing import Any, Optional

import torch
from hydra.utils import instantiate

from seqlab import one_line
from seqlab.callbacks.timing import EpochTimer
from seqlab.packing.build import build_member
from seqlab.packing.configs import member_config
from seqlab.packing.member_runs import log_datasets, open_runs
from seqlab.packing.members import Member
from seqlab.sweeps.job import Job
from seqlab.sweeps.packs import member_dir
from seqlab.sweeps.refill import Refiller, RefillLog, refilled_overrides
from seqlab.sweeps.search_outcomes import tell_ended
from seqlab.sweeps.trial import member_link
from seqlab.validation import validate

log = logging.getLogger("seqlab")


class SlotFiller:
    """A pack job's source of members for its freed slots: the study's next trials, built from the
    samples the pack loaded (`samples`: load_samples's), their runs kept open on the job's `stack`,
    each written to the job's refills.json for the sweeper to tell."""

    def __init__(
        self, refiller: Refiller, job: Job, samples: dict[str, Any], stack: ExitStack, device: Any
    ) -> None:
        self.refiller, self.job, self.samples, self.stack = refiller, job, samples, stack
        self.device = device
        self.log = RefillLog()
        self.exhausted = False  # the study has no trial left: freed slots stay frozen
        self.told: set[int] = set()  # the members whose trials this job told (by identity)
        self.may_decay = "module.l2_regularization" in refiller.space  # a new member's own L2

    def end_own_epochs(self, module: Any, epoch: int) -> None:
        """Members started at different epochs: each stops at the end of its own
        trainer.max_epochs (its run ends now, and its slot may go to the next trial), while the
        pack trains on for the others."""
        for m in module.members:
            if m.active and m.own_epoch(epoch) >= m.cfg.trainer.max_epochs:
                m.stop(module.trained, module.model.member(m.k))

    def refill(self, module: Any, epoch: int) -> None:
        """Each slot whose member's run has ended goes to the study's next trial, until it has none.
        The ended members' trials are told first, so that the pruner and the sampler count them."""
        for m in module.members:
            if m.trial is not None and not m.run_open and id(m) not in self.told:
                self.told.add(id(m))
                try:
                    state = tell_ended(m.trial, m.job.result)
                    m.tracker.client.set_tag(m.run_id, "trial_state", state)  # its run ended
                except Exception as error:  # noqa: BLE001 - the sweeper tells it when the pack returns
                    log.warning(
                        "refill    trial %d not told yet: %s", m.trial.number, one_line(error)
                    )
        for k, m in enumerate(module.members):
            if m.active or m.run_open or self.exhausted:
                continue
            new = self.fill(m, module)
            if new is None:
                self.exhausted = True
                break
            take_slot(module, k, new, epoch)
        if module.none_left and any(m.active for m in module.members):
            module.trainer.should_stop = module.none_left = False  # the new members train on

    def fill(self, old: Member, module: Any) -> Optional[Member]:
        """The member of the study's next trial for the slot `old` leaves, its run opened; None
        where the study has no trial left."""
        trial = self.refiller.next_trial()
        if trial is None:
            return None
        index = len(module.members) + len(module.retired)  # its folder: after the pack's own
        new = self._build(old, trial, index)
        open_runs(self.job, [new], self.stack, self.device, pack_size=len(module.members))
        log_datasets(new, data_changed=False)
        new.datamodule.release()
        timer = next(c for c in module.trainer.callbacks if isinstance(c, EpochTimer))
        new.start_s = timer.trained_s  # its time to target counts from its start
        with new.own_failure("its tags"):
            new.tracker.set_tags({"refilled_slot_of": old.name})
        self.log.add(self.job.output_dir, trial.number, index)
        log.info(
            "refill    trial %d takes member %d's slot (%s, %s) at epoch %d",
            trial.number,
            old.k,
            old.name,
            "pruned" if old.pruned else old.status,
            module.trainer.current_epoch + 1,
        )
        return new

    def _build(self, old: Member, trial: Any, index: int) -> Member:
        """Its config composed by Hydra from `old`'s overrides with the trial's values, its own
        folder (member<index>), its data, network, dropout stream and order as its job alone builds
        them (the pack's global random streams put back after), its learning rate."""
        overrides = refilled_overrides(old.job.overrides, trial)
        out = member_dir(self.job.output_dir, index)
        job = Job(
            out,
            overrides,
            self.job.sweep_dir,
            self.job.num,
            concurrent_jobs=self.job.concurrent_jobs,
            member=index,
            pack_id=old.job.pack_id,
        )
        new = Member(old.k, member_config(overrides, out), job, trial_link=member_link(overrides))
        validate(new.cfg)
        gpu = [torch.cuda.current_device()] if self.device.accelerator == "gpu" else []
        with torch.random.fork_rng(devices=gpu):  # its build seeds them, as its job alone's
            build_member(new, self.samples, self.device)
        optimizer = instantiate(new.cfg.optimizer)(params=new.network.parameters())
        new.lr_scale = optimizer.param_groups[0]["lr"]  # its rate in the packed optimizer
        return new


@torch.no_grad()
def take_slot(module: Any, k: int, new: Member, epoch: int) -> None:
    """`new` (built as its job alone builds it: network, dropout stream, data order) trains in slot
    k of `module` (packing.module.SeqRegressor) from the next step: its weights, dropout rate and
    stream, its optimizer state as a fresh optimizer's (packing.optim: restart), its L2 and
    threshold, its steps and epochs counted from here (Member.own_step); the pack trains on until
    its last epoch too."""
    module.retired.append(module.members[k])
    new.start_step, new.start_epoch = module.trained, epoch
    module.members[k] = new  # the list the loop's items, the recorder and the callbacks read
    module.model.load_member(k, new.network.state_dict())
    module.model.dropout[k] = new.cfg.model.dropout
    if module.streams is not None:
        module.streams[k] = new.dropout_stream
    update = module.update
    update.optimizer.restart(k, new.lr_scale)
    update.gradients.set_member(
        k, new.cfg.module.l2_regularization, new.cfg.module.gradient_threshold
    )
    module.loop.gradients = update.gradients if update.gradients.active else None
    loop = module.trainer.fit_loop
    loop.max_epochs = max(loop.max_epochs, epoch + new.cfg.trainer.max_epochs)
