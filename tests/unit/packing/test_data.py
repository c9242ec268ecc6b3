"""packing.data.PackData: the members' batches, shared where their data order is one."""

from __future__ import annotations

import torch

from seqlab.packing.data import PackData


class _Member:
    def __init__(self, seed: int) -> None:
        self.order = torch.Generator().manual_seed(seed)


def _data(k: int) -> PackData:
    x = torch.arange(40 * 6, dtype=torch.float32).view(40, 6)
    return PackData(
        x=x,
        y=x[:, :1].clone(),
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
    x, y = data.batch(orders, 1)
    assert x.shape == (3, 8, 6) and x.stride(0) == 0 and y.shape == (3, 8, 1)
    rows = orders[0, 8:16]
    for k in range(3):  # each member's batch is the rows its own order names
        torch.testing.assert_close(x[k], data.x[rows])
        torch.testing.assert_close(y[k], data.y[rows])
    (val,) = list(data.val_chunks())
    assert val.stride(0) == 0 and torch.equal(val[2], data.x[32:40])


def test_members_with_their_own_orders_get_their_own_batches():
    data = _data(2)
    members = [_Member(5), _Member(6)]  # they differ in data.seed
    assert not data.shares_order(members)
    orders = data.orders(members)
    assert not data.one_order
    x, _ = data.batch(orders, 0)
    assert x.stride(0) != 0
    for k in range(2):
        torch.testing.assert_close(x[k], data.x[orders[k, :8]])
