"""Issue 22, point 3: which jobs of a multirun train together. Jobs that differ only in packable
keys form packs of at most `pack` members; everything else keeps jobs apart; a config that cannot
train packed sends its jobs one by one with one line saying why."""

from __future__ import annotations

import pytest
from harness.pack_plan import _jobs

from seqlab import SeqlabError
from seqlab.sweeps.packs import group, why_unpackable


def test_why_unpackable_names_the_key(compose_cfg):
    assert why_unpackable(compose_cfg()) is None
    assert "perf=naive" in why_unpackable(compose_cfg("perf=naive"))
    for packs_now in (
        ["optimizer.weight_decay=0.01"],
        ["optimizer=adamw"],
        ["trainer.gradient_clip_val=0.5"],
        ["trainer.precision=bf16-mixed"],
        ["trainer.precision=16-mixed"],  # its treatment on unscaled gradients (issue 32)
        ["trainer.precision=64-true"],
        ["trainer.check_val_every_n_epoch=null", "trainer.val_check_interval=5"],
        ["data=daily_profile"],
        ["trainer.devices=2", "trainer.strategy=ddp"],  # a pack across ranks
    ):
        assert why_unpackable(compose_cfg(*packs_now)) is None, packs_now  # refused before issue 32
    assert "CNN-LSTM" in why_unpackable(compose_cfg("model._target_=my.Net"))


def test_replicas_make_each_job_a_pack_of_its_config_with_distinct_seeds(compose_cfg):
    from seqlab.sweeps.packs import replicated

    def unpackable(overrides):
        return why_unpackable(compose_cfg(*overrides))

    def seed_of(overrides):
        return compose_cfg(*overrides).seed

    compose = (unpackable, seed_of)

    jobs = _jobs(seed=[0, 1], **{"data.batch_size": [32]}, replicas=[1, 3])
    out, notes = replicated(jobs, 1, *compose)
    # replicas=1 jobs as they were; each replicas=3 job as three, seeds seed*3 + i, packed 3 wide.
    assert out == [
        ["seed=0", "data.batch_size=32", "replicas=1"],
        ["data.batch_size=32", "replicas=3", "seed=0", "pack=3"],
        ["data.batch_size=32", "replicas=3", "seed=1", "pack=3"],
        ["data.batch_size=32", "replicas=3", "seed=2", "pack=3"],
        ["seed=1", "data.batch_size=32", "replicas=1"],
        ["data.batch_size=32", "replicas=3", "seed=3", "pack=3"],
        ["data.batch_size=32", "replicas=3", "seed=4", "pack=3"],
        ["data.batch_size=32", "replicas=3", "seed=5", "pack=3"],
    ]
    assert notes == []
    launches, _ = group(out, "off")
    assert [len(launch.members) if launch.members else 1 for launch in launches] == [1, 3, 1, 3]
    # A job that cannot pack has no replicas: it is left out with one line; a sweep of only those is refused.
    out, notes = replicated(_jobs(perf=["naive", "fast"], replicas=[2]), 1, *compose)
    assert [o for o in out if "perf=naive" in o] == [] and len(out) == 2
    assert notes == [
        "replicas  1 job(s) left out: perf=naive trains through Lightning's own loop, and replicas train packed"
    ]
    with pytest.raises(SeqlabError, match="no job of this multirun can pack"):
        replicated(_jobs(perf=["naive"], replicas=[2]), 1, *compose)
    with pytest.raises(SeqlabError, match="replicas=0: give how many networks"):
        replicated(_jobs(seed=[0]), 0, *compose)
