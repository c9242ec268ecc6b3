"""A job's members built (issues 22 and 32): a pack's members, those the sweeper put in pack N
(`pack_job=N`, seqlab.sweeps.packs), each with its own config, composed by Hydra from its job's
overrides, and its own job (folder, result file) inside the pack's (`pack_members`); and each
member's data and network as its run alone builds them, the members' samples loaded once
(`load_samples`, `build_member`). seqlab.train trains them as one step, each member a full MLflow
run (a run alone is a job of one member, built and trained the same way)."""

from __future__ import annotations

import contextvars
import math
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional

import numpy as np
import pytorch_lightning as pl
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig

from seqlab import SeqlabError
from seqlab.data.kept import KEPT, generated
from seqlab.data.module import SeqDataModule
from seqlab.data.sources import SeqData
from seqlab.packing.configs import member_config
from seqlab.packing.data import samples_key
from seqlab.packing.members import Member
from seqlab.sweeps.job import Job
from seqlab.sweeps.packs import PackPlan, key_of, member_dir
from seqlab.sweeps.trial import member_link
from seqlab.tracking.costs import PROCESS


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


def load_samples(members: list[Member]) -> dict[str, Any]:
    """Each distinct set of the members' samples (packing.data.samples_key) loaded once, as many at
    a time as the job has cores: torch and NumPy release the GIL in the arithmetic and random draws
    that make synthetic data and in a file's reads, and each set depends on its own seed alone.
    Generated sets an earlier job of this process made are taken as they are (data.kept); those to
    make are drawn into one buffer of the pack's sets where they are alike (_one_buffer). The
    members' networks are then built in turn (build_member: their seeds go through the one global
    stream)."""
    configs: dict[str, DictConfig] = {}
    for m in members:
        configs.setdefault(samples_key(m.cfg.data), m.cfg.data)
    samples = {key: KEPT.get(key) for key in configs}
    modules = {key: instantiate(configs[key]) for key, data in samples.items() if data is None}
    slots = _one_buffer(configs, samples, modules)
    with ThreadPoolExecutor(max(1, min(len(modules), torch.get_num_threads()))) as pool:
        # Each in a copy of this context: Hydra's target policy (a context variable) holds there too.
        loads = {
            key: pool.submit(contextvars.copy_context().run, dm.load, slots.get(key))
            for key, dm in modules.items()
        }
        samples.update({key: load.result() for key, load in loads.items()})
    for key, data in samples.items():
        if generated(configs[key]):
            KEPT.put(key, data)
    return samples


def _one_buffer(
    configs: dict[str, DictConfig],
    samples: dict[str, Optional[SeqData]],
    modules: dict[str, SeqDataModule],
) -> dict[str, np.ndarray]:
    """Where each set still to make draws its inputs: its place in one buffer of every set's, in
    the members' order, where the sets are all generated alike (one count of samples of one shape;
    data.kept) and some are still to make. The kept ones are copied in. PackData.of then takes the
    buffer as it is (packing.data.joined) instead of joining the K sets' fresh memory once more: a
    pack of 32 sets of 16,384 days joined 3 GB in 1.6-10 s on this project's VM (the most while
    the process's memory is cold), where copying in the kept sets moves what the pack had already.
    {}: each set in its own memory, joined as before."""
    if len(samples) < 2 or not modules or not all(generated(c) for c in configs.values()):
        return {}
    shapes = {}
    for key, data in samples.items():
        if data is None:
            dm = modules[key]
            # One sample's shape, as the source makes it (a generated one: the same in any job).
            shapes[key] = (dm.n_samples, *dm.source(n_samples=1, seed=dm.seed).x.shape[1:])
        elif data.val is None and data.x.dtype == np.float32 and data.x.flags.c_contiguous:
            shapes[key] = data.x.shape
        else:
            return {}
    if len(set(shapes.values())) != 1:
        return {}
    n, *sample = next(iter(shapes.values()))
    # Room made first: the memory of sets this pack does not train, freed just before, is warm.
    # float32: what the generated sources draw (and the kept sets checked above hold).
    KEPT.make_room(len(shapes) * n * math.prod(sample) * np.float32().itemsize, keep=shapes)
    # torch's allocation: its huge pages (seqlab/__init__.py).
    buffer = torch.empty((len(shapes) * n, *sample), dtype=torch.float32).numpy()
    slots = {key: buffer[i * n : (i + 1) * n] for i, key in enumerate(shapes)}
    for key, data in samples.items():
        if data is not None:
            torch.from_numpy(slots[key]).copy_(torch.from_numpy(data.x))
            data.x = slots.pop(key)  # data.kept's set too: the same values, now in the buffer
    return slots


def build_member(m: Member, samples: dict[str, Any], device: Any) -> None:
    """The member's data (`samples`: load_samples's, what members with the same samples share),
    network, dropout stream and sample order, as its run alone builds them."""
    pl.seed_everything(m.cfg.seed, workers=True, verbose=False)
    m.datamodule = instantiate(m.cfg.data)
    # Its validation set alone: the pack trains on the shared samples, and what its run records
    # of its training set needs no copy of it (SeqDataModule.training_set).
    m.datamodule.setup("validate", samples=samples[samples_key(m.cfg.data)])
    m.network = instantiate(
        m.cfg.model, n_features=m.datamodule.n_features, n_outputs=m.datamodule.n_outputs
    )
    m.dropout_stream = torch.Generator()
    m.dropout_stream.set_state(torch.get_rng_state())
    m.order = torch.Generator(device=device.torch_device).manual_seed(m.cfg.data.seed)
