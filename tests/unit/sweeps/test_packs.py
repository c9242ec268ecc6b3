"""Issue 22, point 3: which jobs of a multirun train together. Jobs that differ only in packable
keys form packs of at most `pack` members; everything else keeps jobs apart; a config that cannot
train packed sends its jobs one by one with one line saying why."""

from __future__ import annotations

import pytest
from harness.pack_plan import _jobs

from seqlab import SeqlabError
from seqlab.sweeps.packs import PackPlan, group, numbered, pack_size


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


def test_the_plan_file_round_trips(tmp_path):
    PackPlan([[["seed=0"], ["seed=1"]]]).write(tmp_path)
    assert PackPlan.read(tmp_path).packs == [[["seed=0"], ["seed=1"]]]
    with pytest.raises(SeqlabError, match="packs.json"):
        PackPlan.read(tmp_path / "elsewhere")


def test_replicas_in_a_single_run_says_how_to_ask_for_them(run_cli):
    proc = run_cli("replicas=4", "data.n_samples=256")
    assert proc.returncode == 1
    assert (
        "error: replicas=4 trains a job's config as a pack, which a multirun makes: python train.py -m replicas=4"
        in (proc.stdout + proc.stderr)
    )
