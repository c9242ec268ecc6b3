"""packing.data.PackData: the members' batches, shared where their data order is one, and a run
alone's (a pack of one) with its sequences' lengths."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from seqlab.packing.data import PackData


class _Member:
    def __init__(self, seed: int) -> None:
        self.order = torch.Generator().manual_seed(seed)


def _data(k: int, lengths: bool = False) -> PackData:
    x = torch.arange(40 * 6, dtype=torch.float32).view(40, 6)
    return PackData(
        x=x,
        y=x[:, :1].clone(),
        lengths=torch.arange(40) % 5 + 1 if lengths else None,
        train_rows=torch.arange(32).expand(k, -1),
        val_rows=torch.arange(32, 40).expand(k, -1),
        batch_size=8,
        n_batches=4,
        shuffle=True,
    )


def test_members_with_one_data_order_get_one_gathered_batch_as_a_view():
    data = _data(3)
    members = [_Member(5), _Member(5), _Member(5)]  # they differ in lr, not in data.seed
    assert data.shares_order(members)  # known before the first epoch: the pack line says it
    orders = data.orders(members)
    assert data.one_order
    (x, y, lengths), (x2, _, _) = data.batches(orders, 1, 3)
    assert x.shape == (3, 8, 6) and x.stride(0) == 0 and y.shape == (3, 8, 1) and lengths is None
    for b, xb in ((1, x), (2, x2)):
        rows = orders[0, 8 * b : 8 * (b + 1)]
        for k in range(3):  # each member's batch is the rows its own order names
            torch.testing.assert_close(xb[k], data.x[rows])
    torch.testing.assert_close(y[1], data.y[orders[0, 8:16]])
    ((val, val_lengths),) = list(data.val_chunks())
    assert val.stride(0) == 0 and torch.equal(val[2], data.x[32:40]) and val_lengths is None


def test_members_with_their_own_orders_get_their_own_batches():
    data = _data(2)
    members = [_Member(5), _Member(6)]  # they differ in data.seed
    assert not data.shares_order(members)
    orders = data.orders(members)
    assert not data.one_order
    ((x, _, _),) = data.batches(orders, 0, 1)
    assert x.stride(0) != 0
    for k in range(2):
        torch.testing.assert_close(x[k], data.x[orders[k, :8]])


def test_a_run_alone_is_a_pack_of_one_whose_batches_follow_its_order_with_their_lengths():
    data = _data(1, lengths=True)
    orders = data.orders([_Member(5)])
    assert data.one_order  # one member: its item is gathered at once, no read-back to know it
    batches = list(data.batches(orders, 0, 4))
    assert len(batches) == 4
    for b, (x, y, lengths) in enumerate(batches):
        rows = orders[0, 8 * b : 8 * (b + 1)]
        assert x.shape == (1, 8, 6) and lengths.shape == (1, 8)
        torch.testing.assert_close(x[0], data.x[rows])
        torch.testing.assert_close(y[0], data.y[rows])
        assert torch.equal(lengths[0], data.lengths[rows])
    ((val, val_lengths),) = list(data.val_chunks())
    assert torch.equal(val_lengths[0], data.lengths[32:40])


def test_under_ddp_each_process_trains_the_share_a_job_alones_process_trains():
    """PackData.shard: rank r of P takes every P-th sample of each member's order from r on, as a
    DDP job alone's process does (data.module.TensorBatches); shuffled or not, and too small a
    share is refused in one line."""
    from seqlab import SeqlabError
    from seqlab.data.module import TensorBatches

    for shuffle in (True, False):
        seen = []
        for rank in (0, 1):
            data = _data(2)
            data.shuffle = shuffle
            data = data.shard(rank, 2)
            assert data.n_batches == 2 and data.n_samples == 16  # 32 samples, batch 8 a process
            orders = data.orders([_Member(5), _Member(6)])
            alone = TensorBatches(
                data.x[:32], data.y[:32], 8, shuffle, True, seed=6, rank=rank, world_size=2
            )
            expected = torch.cat([x for x, _ in alone])
            # each batch as it is served (the inputs' buffer is reused from batch to batch)
            got = torch.cat([x[1].clone() for x, _, _ in data.batches(orders, 0, data.n_batches)])
            torch.testing.assert_close(got, expected)  # member 1 (data.seed 6) as its job alone
            seen.append(orders[0])
        assert sorted(torch.cat(seen).tolist()) == list(range(32))  # disjoint shares, all rows
    with pytest.raises(SeqlabError, match="give each of the 8 processes 4, fewer than one batch"):
        _data(1).shard(0, 8)


def test_sets_joined_once_are_taken_as_they_lie_by_the_next_job_and_kept_by_their_config():
    # A pack joins its members' sets into one buffer; the next job that trains those sets (a
    # study's next batch size, from data.kept) takes that buffer as it is, with no copy.
    from omegaconf import OmegaConf

    from seqlab.data.kept import KeptSamples, generated
    from seqlab.data.sources import SeqData, synthetic_daily_load
    from seqlab.packing.data import joined, samples_key

    sets = [synthetic_daily_load(6, seed) for seed in range(3)]
    firsts = [s.x.copy() for s in sets]
    x = joined(sets, "x")
    assert x.shape == (18, 1, 1440) and all(s.x.base is x for s in sets)
    assert all(np.array_equal(s.x, f) for s, f in zip(sets, firsts))  # the same values, now views
    again = joined(sets[1:], "x")  # a pack of two of those sets: the same memory
    assert again.base is x and np.array_equal(again, np.concatenate(firsts[1:]))
    other = joined([sets[2], sets[0]], "x")  # not in that order: joined anew
    assert not np.shares_memory(other, x) and np.array_equal(
        other, np.concatenate([firsts[2], firsts[0]])
    )
    assert joined([SeqData(firsts[0], sets[0].y)], "x") is firsts[0]

    # What makes the samples, not how a job splits or batches them, keys them.
    cfg = OmegaConf.create(
        {"source": {"_target_": "seqlab.data.synthetic_daily_load"}, "seed": 1, "batch_size": 64}
    )
    other_batch = OmegaConf.merge(cfg, {"batch_size": 4096, "val_fraction": 0.3})
    assert (
        samples_key(cfg)
        == samples_key(other_batch)
        != samples_key(OmegaConf.merge(cfg, {"seed": 2}))
    )
    assert generated(cfg) and not generated(OmegaConf.create({"source": {"_target_": "mine.load"}}))
    sets = [synthetic_daily_load(6, seed) for seed in range(3)]  # each in its own memory
    kept = KeptSamples(max_bytes=2 * sets[0].x.nbytes + 100)
    for seed, s in enumerate(sets):
        kept.put(str(seed), s)
    assert kept.get("0") is None and kept.get("1") is sets[1] and kept.get("2") is sets[2]
    kept.put("0", sets[0])  # "1" is now the least recently used
    assert kept.get("1") is None and kept.get("2") is sets[2]

    # Sets that lie in one buffer count it once, and only dropping all of them frees it; room for
    # a pack's buffer is made before it is allocated, keeping the sets that pack trains.
    pack = [synthetic_daily_load(6, seed) for seed in range(3, 6)]
    buffer = joined(pack, "x")
    y = pack[0].y.nbytes
    kept = KeptSamples(max_bytes=buffer.nbytes + 4 * y + sets[0].x.nbytes)
    for seed, s in zip(range(3, 6), pack):
        kept.put(str(seed), s)
    assert kept.held() == buffer.nbytes + 3 * y
    kept.put("0", sets[0])
    assert kept.get("3") is pack[0] and kept.get("0") is sets[0]  # it all fits
    # "5", the oldest, is dropped and frees nothing (the buffer is 3's and 4's too); then "0".
    kept.make_room(sets[0].x.nbytes, keep=["3", "4"])
    assert kept.get("5") is None and kept.get("0") is None and kept.get("3") is pack[0]
    assert kept.held() == buffer.nbytes + 2 * y
    kept.make_room(10 * buffer.nbytes, keep=["3"])  # no room for it: all but "3" dropped
    assert kept.get("4") is None and kept.get("3") is pack[0]
    assert kept.held() == buffer.nbytes + y


def test_a_packs_validation_inputs_are_kept_for_the_next_job_of_the_same_generated_sets():
    # A study's next pack of the same seeds (another batch size) takes the last pack's gathered
    # validation inputs as they are; a pack of the first of those members, a view of them.
    from functools import partial
    from types import SimpleNamespace

    from omegaconf import OmegaConf

    from seqlab.data.module import SeqDataModule
    from seqlab.data.sources import synthetic_daily_load
    from seqlab.packing import data as pack_data

    def members(k: int, batch_size: int = 8, target: str = "seqlab.data.synthetic_daily_load"):
        out = []
        for seed in range(k):
            cfg = OmegaConf.create(
                {
                    "source": {"_target_": target},
                    "seed": seed,
                    "n_samples": 40,
                    "batch_size": batch_size,
                }
            )
            dm = SeqDataModule(
                partial(synthetic_daily_load), n_samples=40, batch_size=batch_size, seed=seed
            )
            dm.setup("validate", samples=dm.load())
            out.append(SimpleNamespace(cfg=SimpleNamespace(data=cfg), datamodule=dm))
        return out

    pack_data._KEPT_VAL = None
    four = members(4)
    first = PackData.of(four, torch.device("cpu"))
    fresh = first.x.index_select(0, first.val_rows.reshape(-1)).view(first.val_x.shape)
    assert torch.equal(first.val_x, fresh)
    again = PackData.of(members(4, batch_size=16), torch.device("cpu"))  # new sets, same configs
    assert again.val_x.data_ptr() == first.val_x.data_ptr() and torch.equal(again.val_x, fresh)
    two = PackData.of(members(2), torch.device("cpu"))
    assert two.val_x.data_ptr() == first.val_x.data_ptr() and torch.equal(two.val_x, fresh[:2])
    # Samples a source of the user's own makes (a file may change): gathered anew, and not kept.
    own = PackData.of(members(4, target="mine.load"), torch.device("cpu"))
    assert own.val_x.data_ptr() != first.val_x.data_ptr() and torch.equal(own.val_x, fresh)
    assert pack_data._KEPT_VAL is None


def test_a_packs_generated_sets_are_drawn_into_one_buffer_the_kept_ones_copied_in(monkeypatch):
    # A pack's sets still to make are drawn straight into one buffer of all its sets (and those a
    # previous job kept are copied in), so PackData.of takes that buffer as it is: the same values
    # as each set made alone.
    from types import SimpleNamespace

    from omegaconf import OmegaConf

    from seqlab.data.kept import KeptSamples
    from seqlab.data.sources import synthetic_daily_load
    from seqlab.packing import build
    from seqlab.packing.data import joined, samples_key

    monkeypatch.setattr(build, "KEPT", KeptSamples())

    def member(seed: int, n: int = 40, layout: str = "windows"):
        data = {
            "_target_": "seqlab.data.SeqDataModule",
            "source": {
                "_target_": "seqlab.data.synthetic_daily_load",
                "_partial_": True,
                "layout": layout,
            },
            "n_samples": n,
            "seed": seed,
            "batch_size": 8,
        }
        return SimpleNamespace(cfg=OmegaConf.create({"data": data}))

    def loaded(members):
        samples = build.load_samples(members)
        return [samples[samples_key(m.cfg.data)] for m in members]

    two = loaded([member(0), member(1)])
    buffer = two[0].x.base
    assert two[1].x.base is buffer and joined(two, "x").base is buffer  # no join: a view
    four = loaded([member(s) for s in range(4)])
    assert four[0] is two[0] and four[1] is two[1]  # the kept sets, now in the pack's new buffer
    assert all(s.x.base is four[0].x.base is not buffer for s in four)
    assert joined(four, "x").base is four[0].x.base
    for seed, s in enumerate(four):
        alone = synthetic_daily_load(40, seed)
        assert np.array_equal(s.x, alone.x) and np.array_equal(s.y, alone.y)

    # Sets of different shapes: each in its own memory, joined as before.
    mixed = loaded([member(5, n=40), member(6, n=30)])
    assert not np.shares_memory(mixed[0].x, mixed[1].x)
    assert np.array_equal(mixed[1].x, synthetic_daily_load(30, 6).x)

    # The univariate layout (X as 1440 steps of one feature) is drawn there too, the same values.
    profile = loaded([member(s, n=6, layout="profile") for s in (7, 8)])
    assert profile[0].x.shape == (6, 1440, 1) and profile[1].x.base is profile[0].x.base
    assert np.array_equal(profile[1].x, synthetic_daily_load(6, 8, layout="profile").x)


def test_synthetic_data_drawn_into_a_given_buffer_is_the_data_drawn_alone():
    from seqlab.data.sources import synthetic_daily_load

    for layout, shape in (("windows", (5, 3, 1440)), ("profile", (5, 3 * 1440, 1))):
        out = np.empty(shape, dtype=np.float32)
        data = synthetic_daily_load(5, 3, layout=layout, seq_len=3, out=out)
        alone = synthetic_daily_load(5, 3, layout=layout, seq_len=3)
        assert data.x is out and np.array_equal(out, alone.x) and np.array_equal(data.y, alone.y)
    with pytest.raises(ValueError, match="does not hold 5 samples of 1 x 1440"):
        synthetic_daily_load(5, 3, out=np.empty((4, 1, 1440), dtype=np.float32))
