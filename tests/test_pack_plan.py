"""Issue 22, point 3: which jobs of a multirun train together. Jobs that differ only in packable
keys form packs of at most `pack` members; everything else keeps jobs apart; a config that cannot
train packed sends its jobs one by one with one line saying why."""

from __future__ import annotations

import itertools

import pytest

from seqlab import SeqlabError
from seqlab.sweeps.packs import PackPlan, group, numbered, pack_size, why_unpackable


def _jobs(**swept):
    keys = list(swept)
    return [
        [f"{k}={v}" for k, v in zip(keys, values)] for values in itertools.product(*swept.values())
    ]


def test_jobs_differing_only_in_packable_keys_form_packs_of_at_most_the_size():
    jobs = _jobs(**{"data.batch_size": [32, 64], "seed": [0, 1, 2, 3, 4]})
    launches, notes = group(jobs, "2")
    packs = [launch.members for launch in launches if launch.members]
    alone = [launch.overrides for launch in launches if not launch.members]
    # Per batch size: seeds 0+1, 2+3 packed, seed 4 alone (a pack of one is a job).
    assert packs == [
        [["data.batch_size=32", "seed=0"], ["data.batch_size=32", "seed=1"]],
        [["data.batch_size=32", "seed=2"], ["data.batch_size=32", "seed=3"]],
        [["data.batch_size=64", "seed=0"], ["data.batch_size=64", "seed=1"]],
        [["data.batch_size=64", "seed=2"], ["data.batch_size=64", "seed=3"]],
    ]
    assert alone == [["data.batch_size=32", "seed=4"], ["data.batch_size=64", "seed=4"]]
    assert notes == []
    # A pack's own overrides are what its members share, plus its place in packs.json.
    listed = numbered(launches)
    assert listed[0] == ["data.batch_size=32", "pack_job=0"]
    assert sum(o[-1].startswith("pack_job=") for o in listed) == 4


def test_every_packable_key_packs_and_a_shape_key_does_not():
    jobs = _jobs(
        **{
            "optimizer.lr": [0.001, 0.01],
            "module.l2_regularization": [0, 0.001],
            "model.dropout": [0.0, 0.2],
            "module.gradient_threshold": ["null", 1.0],
            "seed": [0, 1],
        }
    )
    launches, _ = group(jobs, 32)
    assert len(launches) == 1 and len(launches[0].members) == 32
    launches, _ = group(_jobs(**{"model.hidden_size": [8, 16], "seed": [0, 1]}), 8)
    assert [len(launch.members) for launch in launches] == [2, 2]


def test_pack_off_and_a_swept_pack_value():
    jobs = _jobs(seed=[0, 1, 2])
    assert all(launch.members is None for launch in group(jobs, "off")[0])
    # pack=1,3 swept: each value its own group; pack=1 runs one by one.
    launches, _ = group(_jobs(pack=[1, 3], seed=[0, 1, 2]), "off")
    assert [len(launch.members) if launch.members else 1 for launch in launches] == [1, 1, 1, 3]


def test_an_unpackable_config_runs_one_by_one_with_one_line_why():
    launches, notes = group(
        _jobs(seed=[0, 1]),
        8,
        unpackable=lambda overrides: "perf=naive trains through Lightning's own loop",
    )
    assert [launch.members for launch in launches] == [None, None]
    assert len(notes) == 1 and "2 job(s)" in notes[0] and "perf=naive" in notes[0]


@pytest.mark.parametrize("value", ["0", "-3", "many"])
def test_a_bad_pack_value_is_one_line(value):
    with pytest.raises(SeqlabError, match=r"pack=.*pack=8.*pack=off"):
        pack_size(value)


@pytest.mark.slow
def test_why_unpackable_names_the_key(compose_cfg):
    assert why_unpackable(compose_cfg()) is None
    assert "perf=naive" in why_unpackable(compose_cfg("perf=naive"))
    assert "DDP" in why_unpackable(compose_cfg("trainer.devices=2"))
    for packs_now in (
        ["optimizer.weight_decay=0.01"],
        ["optimizer=adamw"],
        ["trainer.gradient_clip_val=0.5"],
        ["trainer.precision=bf16-mixed"],
        ["trainer.check_val_every_n_epoch=null", "trainer.val_check_interval=5"],
        ["data=daily_profile"],
    ):
        assert why_unpackable(compose_cfg(*packs_now)) is None, packs_now  # refused before issue 32
    # Loss scaling would reach MATLAB's L2 and threshold with scaled gradients.
    assert "precision" in why_unpackable(compose_cfg("trainer.precision=16-mixed"))


def test_the_plan_file_round_trips(tmp_path):
    PackPlan([[["seed=0"], ["seed=1"]]]).write(tmp_path)
    assert PackPlan.read(tmp_path).packs == [[["seed=0"], ["seed=1"]]]
    with pytest.raises(SeqlabError, match="packs.json"):
        PackPlan.read(tmp_path / "elsewhere")


@pytest.mark.slow
def test_replicas_make_each_job_a_pack_of_its_config_with_distinct_seeds(compose_cfg):
    from seqlab.sweeps.packs import replicated

    def compose(overrides):
        return compose_cfg(*overrides)

    jobs = _jobs(seed=[0, 1], **{"data.batch_size": [32]}, replicas=[1, 3])
    out, notes = replicated(jobs, 1, compose)
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
    out, notes = replicated(_jobs(perf=["naive", "fast"], replicas=[2]), 1, compose)
    assert [o for o in out if "perf=naive" in o] == [] and len(out) == 2
    assert notes == [
        "replicas  1 job(s) left out: perf=naive trains through Lightning's own loop, and replicas train packed"
    ]
    with pytest.raises(SeqlabError, match="no job of this multirun can pack"):
        replicated(_jobs(perf=["naive"], replicas=[2]), 1, compose)
    with pytest.raises(SeqlabError, match="replicas=0: give how many networks"):
        replicated(_jobs(seed=[0]), 0, compose)


def test_replicas_in_a_single_run_says_how_to_ask_for_them(run_cli):
    proc = run_cli("replicas=4", "data.n_samples=256")
    assert proc.returncode == 1
    assert (
        "error: replicas=4 trains a job's config as a pack, which a multirun makes: python train.py -m replicas=4"
        in (proc.stdout + proc.stderr)
    )
