"""Issue 22, point 1 and the model's part of point 5: K members of the CNN-LSTM packed into one
module compute, member by member, what each network computes alone, and train as each would
alone: the same initial weights, data order and dropout masks give the same losses."""

from __future__ import annotations

import io

import pytest
import torch

from seqlab.model import CNNLSTM
from seqlab.packing.model import PackedCNNLSTM, share_streams
from seqlab.tracking.records import Best, EpochTiming, Reached, Stopped
from seqlab.training.evaluation import LOSS_FUNCTIONS, MEMBER_LOSSES

SHAPE = dict(n_features=16, n_outputs=1, filters=3, kernel_size=5, hidden_size=8)


def _members(seeds, dropout=0.0, init="matlab"):
    """Each member built as its run alone builds it (its seed, then its init); its random stream
    then goes on from where the build left the global one, as the run's would. `dropout`: one
    for all, or a list, one a member."""
    members, streams = [], []
    for k, seed in enumerate(seeds):
        torch.manual_seed(seed)
        members.append(
            CNNLSTM(
                **SHAPE, dropout=dropout[k] if isinstance(dropout, list) else dropout, init=init
            )
        )
        stream = torch.Generator()
        stream.set_state(torch.get_rng_state())
        streams.append(stream)
    return members, streams


def _data(n=96, seed=123):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 1, SHAPE["n_features"], generator=g)
    return x, x[:, 0, :4].sum(dim=1, keepdim=True) + 0.1 * torch.randn(n, 1, generator=g)


def test_each_member_computes_what_its_network_computes_alone():
    members, _ = _members([0, 1, 2, 3])
    packed = PackedCNNLSTM(members)
    x = torch.randn(4, 32, SHAPE["n_features"])
    for training in (True, False):  # batch statistics, then the running ones
        packed.train(training)
        out = packed.forward_one_step(x)
        assert out.shape == (4, 32, 1)
        for k, member in enumerate(members):
            member.train(training)
            torch.testing.assert_close(out[k], member.forward_one_step(x[k]), rtol=1e-5, atol=1e-6)
    for k, member in enumerate(
        members
    ):  # the BatchNorm statistics the training pass updated, per member
        torch.testing.assert_close(
            packed.bn_running_var[k], member.bn.running_var, rtol=1e-5, atol=1e-7
        )
        assert int(packed.bn_num_batches_tracked[k]) == int(member.bn.num_batches_tracked) == 1


def test_members_of_padded_sequences_compute_and_learn_what_each_computes_alone():
    """Sequences of different lengths (right-padded, with their lengths) pack too: each member's
    LSTM output at its sequence's last real step, as CNNLSTM.forward takes it, forward and
    backward."""
    members, _ = _members([0, 1])
    packed = PackedCNNLSTM(members)
    x = torch.randn(2, 8, 6, SHAPE["n_features"])
    lengths = torch.tensor([[6, 3, 1, 6, 2, 5, 4, 6], [1, 6, 6, 2, 3, 4, 5, 6]])
    out = packed(x, None, lengths)
    assert out.shape == (2, 8, 1)
    out.pow(2).sum().backward()
    for k, member in enumerate(members):
        alone = member(x[k], lengths[k])
        torch.testing.assert_close(out[k], alone, rtol=1e-5, atol=1e-6)
        alone.pow(2).sum().backward()
        torch.testing.assert_close(
            packed.lstm_weight_ih.grad[k], member.lstm.weight_ih_l0.grad, rtol=1e-4, atol=1e-6
        )


def test_members_sharing_one_batch_compute_and_learn_what_each_computes_alone():
    """Issue 35, point 3: one batch for every member (a view with a stride of 0 over them, as
    PackData.batch hands a shared data order on) takes one product for every member's convolution;
    each member's outputs and gradients are what its network alone computes on that batch."""
    members, _ = _members([0, 1, 2, 3])
    packed = PackedCNNLSTM(members)
    batch = torch.randn(32, SHAPE["n_features"])
    shared = batch.unsqueeze(0).expand(4, -1, -1)
    assert shared.stride(0) == 0
    out = packed.forward_one_step(shared)
    out.pow(2).sum().backward()
    for k, member in enumerate(members):
        alone = member.forward_one_step(batch)
        torch.testing.assert_close(out[k], alone, rtol=1e-5, atol=1e-6)
        alone.pow(2).sum().backward()
        tap = (SHAPE["kernel_size"] - 1) // 2  # one step: only the centre tap has a gradient
        torch.testing.assert_close(
            packed.conv_centre.grad[k], member.conv.weight.grad[..., tap], rtol=1e-5, atol=1e-6
        )
        torch.testing.assert_close(
            packed.fc_weight.grad[k], member.fc.weight.grad, rtol=1e-5, atol=1e-6
        )


def test_a_member_comes_out_as_a_plain_network_and_goes_back():
    members, _ = _members([5, 6])
    packed = PackedCNNLSTM(members)
    alone = CNNLSTM(**SHAPE)
    alone.load_state_dict(packed.member(1))  # strict: every key of a CNNLSTM, in its shapes
    assert all(
        torch.equal(alone.state_dict()[key], value)
        for key, value in members[1].state_dict().items()
    )
    assert (
        not packed.lstm_bias_hh.requires_grad
    )  # MATLAB's second LSTM bias stays frozen, as in the members
    packed.load_member(0, members[1].state_dict())
    assert all(torch.equal(v, packed.member(1)[key]) for key, v in packed.member(0).items())
    with pytest.raises(ValueError, match="one shape"):
        PackedCNNLSTM([members[0], CNNLSTM(**{**SHAPE, "hidden_size": 9})])


@pytest.mark.parametrize("loss", ["half_mse", "mse"])
def test_a_member_loss_is_the_loss_of_its_network_alone(loss):
    pred, target = torch.randn(5, 32, 2), torch.randn(5, 32, 2)
    per_member = MEMBER_LOSSES[loss](pred, target)
    assert per_member.shape == (5,)
    for k in range(5):
        torch.testing.assert_close(per_member[k], LOSS_FUNCTIONS[loss](pred[k], target[k]))


@pytest.mark.parametrize(
    "dropout", [0.0, 0.25, [0.0, 0.1, 0.4]], ids=["no-dropout", "dropout", "dropout-per-member"]
)
def test_packed_training_equals_each_member_trained_alone(dropout):
    """100 Adam steps, batch 16, each member its own seed: its data order and dropout masks from
    its own stream, drawn in the order its run alone draws them (a permutation an epoch, a mask a
    step). One fused Adam over the packed tensors is K Adams (Adam is elementwise)."""
    seeds, steps, bs = [0, 1, 2], 100, 16
    x, y = _data()
    batches = len(x) // bs

    def alone(seed, p):
        members, _ = _members([seed], p)
        model = members[0]
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2, fused=True)
        losses = []
        while len(losses) < steps:
            order = torch.randperm(len(x))  # the global stream, where the build left it
            for i in range(batches):
                idx = order[i * bs : (i + 1) * bs]
                optimizer.zero_grad()
                loss = LOSS_FUNCTIONS["half_mse"](model.forward_one_step(x[idx, 0]), y[idx])
                loss.backward()
                optimizer.step()
                losses.append(loss.item())
        return losses[:steps]

    expected = [
        alone(seed, dropout[k] if isinstance(dropout, list) else dropout)
        for k, seed in enumerate(seeds)
    ]

    members, streams = _members(seeds, dropout)
    packed = PackedCNNLSTM(members)
    optimizer = torch.optim.Adam(
        [p for p in packed.parameters() if p.requires_grad], lr=1e-2, fused=True
    )
    losses = []
    while len(losses) < steps:
        orders = torch.stack([torch.randperm(len(x), generator=g) for g in streams])
        for i in range(batches):
            idx = orders[:, i * bs : (i + 1) * bs]  # (K, batch): each member's own batch
            optimizer.zero_grad()
            per_member = MEMBER_LOSSES["half_mse"](
                packed.forward_one_step(x[idx, 0], streams), y[idx]
            )
            per_member.sum().backward()  # each member's gradient is its own loss's
            optimizer.step()
            losses.append(per_member.detach().tolist())
    got = torch.tensor(losses[:steps]).T
    torch.testing.assert_close(got, torch.tensor(expected), rtol=1e-4, atol=1e-6)
    assert got[:, -1].mean() < 0.5 * got[:, 0].mean()  # they trained


def test_members_of_one_seed_and_rate_draw_one_dropout_mask_each_the_one_it_draws_alone():
    """Issue 35: members whose streams are in one state and who drop at one rate (an optimizer.lr
    sweep of one seed) share one stream object, and the pack draws each mask once for them: every
    member's masks, and its stream where the steps leave it, are those of its own stream."""
    seeds, rates = [0, 0, 1, 0], [0.25, 0.25, 0.25, 0.5]
    members, own = _members(seeds, rates)
    _, copies = _members(seeds, rates)
    shared = share_streams(copies, rates)
    assert shared[0] is shared[1]  # one seed, one rate
    assert len({id(g) for g in shared}) == 3  # another seed, another rate: their own
    alone, packed = PackedCNNLSTM(members), PackedCNNLSTM(members)
    h = torch.randn(4, 16, SHAPE["hidden_size"])
    for _ in range(5):
        assert torch.equal(packed._dropout(h, shared), alone._dropout(h, own))
    assert all(torch.equal(g.get_state(), o.get_state()) for g, o in zip(shared, own))


# -- per-member settings ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "method,clip",
    [("l2norm", None), ("global-l2norm", None), ("absolute-value", None), ("l2norm", 0.05)],
)
def test_members_with_their_own_rate_l2_and_threshold_train_as_each_alone(method, clip):
    """Point 2: each member its own optimizer.lr, module.l2_regularization and gradient threshold
    (None: none); 100 steps of the packed optimizer and treatment against each member with Adam and
    seqlab.training.gradients alone, the same data order. With `clip` (trainer.gradient_clip_val,
    issue 32): then torch's clip_grad_norm_ over each member's parameters, as the fused loop clips."""
    from seqlab.packing.optim import PackedAdam, PackedGradientTreatment
    from seqlab.training.gradients import GradientTreatment
    from seqlab.training.loop import gradient_buffers

    seeds, lrs, l2s, thresholds = (
        [0, 1, 2],
        [1e-2, 3e-3, 3e-2],
        [0.0, 1e-3, 1e-2],
        [None, 1.0, 0.05],
    )
    steps, bs = 100, 16
    x, y = _data()
    orders = [
        torch.randperm(len(x), generator=torch.Generator().manual_seed(50 + s)) for s in seeds
    ]

    def batch(k, i):
        i %= len(x) // bs
        return orders[k][i * bs : (i + 1) * bs]

    expected = []
    for k, seed in enumerate(seeds):
        (model,), _ = _members([seed])
        optimizer = torch.optim.Adam(model.parameters(), lr=lrs[k], fused=True)
        treatment = GradientTreatment(model, l2s[k], thresholds[k], method)
        alone_grads = gradient_buffers([p for p in model.parameters() if p.requires_grad])
        losses = []
        for i in range(steps):
            torch._foreach_zero_(alone_grads)
            loss = LOSS_FUNCTIONS["half_mse"](
                model.forward_one_step(x[batch(k, i), 0]), y[batch(k, i)]
            )
            loss.backward()
            treatment()
            if clip:
                torch.nn.utils.clip_grad_norm_(
                    [p for p in model.parameters() if p.requires_grad], clip, foreach=True
                )
            optimizer.step()
            losses.append(loss.item())
        expected.append(losses)

    members, _ = _members(seeds)
    packed = PackedCNNLSTM(members)
    params = [p for p in packed.parameters() if p.requires_grad]
    optimizer = PackedAdam(params, lrs)
    treatment = PackedGradientTreatment(
        packed.l2_parameters(), packed.learnables(), l2s, thresholds, method, clip=clip
    )
    # Gradients kept as zeroed buffers, as the fused loop keeps them for a run alone and a pack
    # (training.loop): tensors one-step data leaves unused (the LSTM's recurrent weights, the
    # convolution's other taps) still get MATLAB's L2 and their update.
    grads = gradient_buffers(params)
    losses = []
    for i in range(steps):
        idx = torch.stack([batch(k, i) for k in range(len(seeds))])
        torch._foreach_zero_(grads)
        per_member = MEMBER_LOSSES["half_mse"](packed.forward_one_step(x[idx, 0]), y[idx])
        per_member.sum().backward()
        treatment()
        optimizer.step()
        losses.append(per_member.detach().tolist())
    torch.testing.assert_close(torch.tensor(losses).T, torch.tensor(expected), rtol=1e-4, atol=1e-6)
    assert {
        n for n, p in packed.named_parameters() if any(p is q for q in packed.l2_parameters())
    } == {
        "conv_centre",
        "conv_sides",
        "bn_weight",
        "bn_bias",
        "lstm_weight_ih",
        "lstm_weight_hh",
        "fc_weight",
    }


@pytest.mark.parametrize("weight_decay", [None, 0.05], ids=["as-configured", "weight_decay"])
@pytest.mark.parametrize("name", ["adam", "adamw", "sgdm", "rmsprop"])
def test_each_configured_optimizer_packs_with_a_rate_per_member(name, weight_decay):
    """The config's optimizer (conf/optimizer/NAME.yaml) packed, each member its own learning rate
    and the piecewise schedule (StepLR) over them all: 60 steps against each member with that
    optimizer and schedule alone. With its weight decay too (issue 32): torch's own, coupled, or
    decoupled for AdamW."""
    import functools

    from conftest import CONF_DIR
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from seqlab.packing.optim import packed_optimizer

    partial = instantiate(OmegaConf.load(CONF_DIR / "optimizer" / f"{name}.yaml"))
    if weight_decay is not None:
        partial = functools.partial(
            partial.func, **{**partial.keywords, "weight_decay": weight_decay}
        )
    seeds, lrs, steps, bs = [0, 1], [1e-3, 4e-3], 60, 16
    x, y = _data()

    def batch(i):
        i %= len(x) // bs
        return torch.arange(i * bs, (i + 1) * bs)

    expected = []
    for k, seed in enumerate(seeds):
        (model,), _ = _members([seed])
        optimizer = partial(params=model.parameters(), lr=lrs[k])
        schedule = torch.optim.lr_scheduler.StepLR(optimizer, step_size=20, gamma=0.5)
        losses = []
        for i in range(steps):
            optimizer.zero_grad()
            loss = LOSS_FUNCTIONS["half_mse"](model.forward_one_step(x[batch(i), 0]), y[batch(i)])
            loss.backward()
            optimizer.step()
            schedule.step()
            losses.append(loss.item())
        expected.append(losses)

    members, _ = _members(seeds)
    packed = PackedCNNLSTM(members)
    own = [
        partial(params=m.parameters(), lr=lr) for m, lr in zip(members, lrs)
    ]  # as each member's run builds it
    optimizer = packed_optimizer(own, [p for p in packed.parameters() if p.requires_grad])
    schedule = torch.optim.lr_scheduler.StepLR(optimizer, step_size=20, gamma=0.5)
    losses = []
    for i in range(steps):
        idx = batch(i).expand(len(seeds), -1)
        optimizer.zero_grad()
        per_member = MEMBER_LOSSES["half_mse"](packed.forward_one_step(x[idx, 0]), y[idx])
        per_member.sum().backward()
        optimizer.step()
        schedule.step()
        losses.append(per_member.detach().tolist())
    torch.testing.assert_close(torch.tensor(losses).T, torch.tensor(expected), rtol=1e-4, atol=1e-6)


def test_an_optimizer_setting_a_pack_cannot_train_is_one_line():
    from seqlab import SeqlabError
    from seqlab.packing.optim import packed_optimizer

    params = [torch.nn.Parameter(torch.zeros(2, 3))]

    def own(
        cls, **settings
    ):  # each member's optimizer over its own network, as its run alone builds it
        return [cls([torch.nn.Parameter(torch.zeros(3))], lr=1e-3, **settings) for _ in range(2)]

    with pytest.raises(
        SeqlabError,
        match=r"^optimizer.nesterov=True cannot be packed \(only False\): pack=off to train it$",
    ):
        packed_optimizer(own(torch.optim.SGD, momentum=0.9, nesterov=True), params)
    with pytest.raises(SeqlabError, match=r"^optimizer Adagrad cannot be packed"):
        packed_optimizer(own(torch.optim.Adagrad), params)


def test_a_scheduler_scales_every_members_rate():
    from seqlab.packing.optim import PackedAdam

    members, _ = _members([0, 1])
    packed = PackedCNNLSTM(members)
    optimizer = PackedAdam([p for p in packed.parameters() if p.requires_grad], [1e-2, 1e-3])
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    for _ in range(2):
        optimizer.step()
        scheduler.step()
    group = optimizer.param_groups[0]
    assert group["lr"] == pytest.approx(0.25)  # the schedule's factor after two drops
    torch.testing.assert_close(group["lr"] * group["member_lr"], torch.tensor([2.5e-3, 2.5e-4]))
    with pytest.raises(ValueError, match="first dimension must be the 3 members"):
        PackedAdam(packed.parameters(), [1e-2, 1e-3, 1e-4])


def test_members_with_their_own_dropout_drop_at_their_own_rate():
    """Without per-member streams (the benchmark's packs), each member still drops at its own p."""
    members, _ = _members([0, 1, 2], [0.0, 0.2, 0.6])
    packed = PackedCNNLSTM(members).train()
    h = torch.ones(3, 4000, 24)
    dropped = (packed._dropout(h, None) == 0).float().mean(dim=(1, 2))
    assert dropped[0] == 0 and abs(dropped[1] - 0.2) < 0.02 and abs(dropped[2] - 0.6) < 0.02
    kept = packed._dropout(h, None)[2]
    assert torch.allclose(
        kept[kept > 0], torch.tensor(1 / 0.4)
    )  # scaled by 1 / (1 - p), as nn.Dropout does


def test_a_members_state_comes_back_whole_from_a_pack_checkpoint():
    """A resumed pack continues each member's data order where it stopped (and its logged checkpoints)."""
    from seqlab.packing.members import Member

    saved = Member(
        0, cfg=None, job=None, order=torch.Generator().manual_seed(7), logged=[("m-1", 52)]
    )
    torch.randperm(10, generator=saved.order)  # an epoch's shuffle drawn
    resumed = Member(0, cfg=None, job=None, order=torch.Generator().manual_seed(0))
    resumed.load_state(saved.state())
    assert torch.equal(resumed.order.get_state(), saved.order.get_state())
    assert resumed.logged == [("m-1", 52)]
    assert torch.equal(
        torch.randperm(10, generator=resumed.order), torch.randperm(10, generator=saved.order)
    )


def _pack_module(run_ids=("a", "b")):
    """The module of a pack of two members over _data(), attached to a Trainer that has not fitted,
    its update made (as Lightning's configure_optimizers makes it)."""
    from functools import partial

    import pytorch_lightning as pl

    from seqlab.packing.data import PackData
    from seqlab.packing.members import Member
    from seqlab.packing.module import SeqRegressor
    from seqlab.packing.optim import Update
    from seqlab.tracking.steps import StepLog
    from seqlab.training.loop import FusedLoop

    nets, _ = _members([0, 1])
    x, y = _data()
    members = [
        Member(
            k, cfg=None, job=None, order=torch.Generator().manual_seed(k), resume_run_id=run_ids[k]
        )
        for k in range(2)
    ]
    rows = torch.arange(len(x)).expand(2, -1)
    data = PackData(
        x=x[:, 0],
        y=y,
        lengths=None,
        train_rows=rows,
        val_rows=None,
        batch_size=16,
        n_batches=len(x) // 16,
        shuffle=True,
    )
    packed = PackedCNNLSTM(nets)

    def update(model, **settings):
        return Update(torch.optim.Adam(model.parameters()), None, None, [1.0, 1.0])

    m = SeqRegressor(
        packed, members, data, update, "half_mse", step_log=StepLog(), loop=partial(FusedLoop)
    )
    m.set_items_per_call(2)
    m.resuming = True
    m.trainer = pl.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False)
    m.configure_optimizers()
    return m


def test_a_member_that_stopped_early_is_frozen_while_the_others_train():
    """Issue 32, point 2: a member stopped early (patience) or pruned keeps the weights it stopped with."""
    pack = _pack_module()
    pack.members[1].last_weights = pack.model.member(1)
    before = [pack.model.member(k) for k in range(2)]
    orders, _, _ = next(iter(pack.items))
    pack.on_train_start()  # the pack's loop: a run alone's, with the member dimension
    n, losses = pack.loop.run_batches(pack.data.batches(orders, 0, 3), first_step=1)
    assert (
        n == 3 and pack.trained == 3 and losses.shape == (2,) and pack.step_log.steps == [1, 2, 3]
    )
    after = [pack.model.member(k) for k in range(2)]
    assert all(torch.equal(before[1][key], after[1][key]) for key in before[1])
    assert not torch.equal(before[0]["fc.weight"], after[0]["fc.weight"])


def test_a_failed_members_status_and_its_data_order_come_back_from_the_packs_checkpoint():
    """Issue 32: a member that failed before the checkpoint is FAILED after it (never FINISHED); a pack
    stopped inside an epoch replays that epoch's order from where it stopped; another pack's checkpoint
    is refused in one line."""
    from seqlab import SeqlabError

    module = _pack_module
    saved = module()
    orders = [item[0] for item in saved.items]  # an epoch drawn: each member's own order
    saved.members[1].fail("the training loss became nan at step 3: training diverged", 3)
    saved.trainer.fit_loop.epoch_loop.batch_progress.current.completed = (
        1  # one item of the epoch trained
    )
    # What the callbacks recorded of member 0, as typed records (tracking.records).
    first = saved.members[0]
    first.epochs = [EpochTiming(0.5, 200.0, 12800.0), EpochTiming(0.4, 250.0, 16000.0)]
    first.record.best, first.record.since_best = Best(0.25, 20, 2), 1
    first.reached, first.stopped = Reached(0.9, 20, 2), Stopped(30, 3)
    checkpoint = {}
    saved.on_save_checkpoint(checkpoint)
    # Plain values and tensors only: it loads without unpickling any class of this project.
    buffer = io.BytesIO()
    torch.save(checkpoint, buffer)
    buffer.seek(0)
    checkpoint = torch.load(buffer, weights_only=True)
    resumed = module()
    resumed.on_load_checkpoint(checkpoint)
    again = resumed.members[0]
    assert again.epochs == first.epochs and again.timing() == EpochTiming(0.4, 250.0, 16000.0)
    assert (again.best, again.record.since_best) == (Best(0.25, 20, 2), 1)
    assert (again.reached, again.stopped) == (Reached(0.9, 20, 2), Stopped(30, 3))
    assert [(m.status, m.active) for m in resumed.members] == [("RUNNING", True), ("FAILED", False)]
    assert (
        resumed.members[1].reason.startswith("the training loss became nan")
        and resumed.members[1].final_step == 3
    )
    replayed = list(resumed.items)
    assert len(replayed) == len(saved.items) - 1 and replayed[0][1] == 2  # from the second item on
    assert torch.equal(replayed[0][0], orders[0])  # the same order as the stopped epoch's
    with pytest.raises(SeqlabError, match="another pack's"):
        module(("a", "c")).on_load_checkpoint(checkpoint)
    # one from before a run alone and a pack trained in one module: refused in one line
    older = {key: value for key, value in checkpoint.items() if key != "members"}
    with pytest.raises(SeqlabError, match="older seqlab"):
        module().on_load_checkpoint(older)


def test_a_run_alone_is_a_pack_of_one_whose_state_is_its_networks_own():
    """packing.model.OneMember: a run alone's network as member 0 of the loop's member dimension.
    Its state dict is the network's (a run alone's checkpoint loads into a plain CNNLSTM), its
    one-step shortcut and its full forward compute what the network computes, and training mode
    reaches the network."""
    from seqlab.packing.model import OneMember

    (net,), _ = _members([0], dropout=0.0)
    one = OneMember(net)
    assert list(one.state_dict()) == list(net.state_dict())
    assert [id(p) for p in one.parameters()] == [id(p) for p in net.parameters()]
    x = torch.randn(1, 16, SHAPE["n_features"])
    torch.testing.assert_close(one(x)[0], net.forward_one_step(x[0]))
    torch.testing.assert_close(OneMember(net, one_step_shortcut=False)(x)[0], net(x[0][:, None]))
    one.eval()
    assert not net.training and not net.bn.training
    state = one.member(0)
    with torch.no_grad():
        net.fc.bias.add_(1.0)
    one.load_member(0, state)
    torch.testing.assert_close(net.fc.bias, state["fc.bias"])
