"""The fast path: the same numbers as a plain PyTorch loop, on-device batching, no host
synchronisation in the hot loop, and the benchmark script."""

from __future__ import annotations

import pytest
import torch
from conftest import ROOT, runs_of
from harness.inprocess import run_script
from harness.perf import _eager_capture

from seqlab.train import train
from seqlab.training.evaluation import half_mse

# -- on-device batching -------------------------------------------------------------------------


@pytest.mark.parametrize("drop_last", [False, True])
def test_items_of_k_batches_cover_each_sample_once_and_drop_only_the_last_partial_batch(drop_last):
    from seqlab.data import TensorBatches

    x = torch.arange(23.0).reshape(23, 1, 1)
    batches = TensorBatches(
        x,
        x[:, 0],
        batch_size=4,
        shuffle=True,
        drop_last=drop_last,
        seed=0,
        device=torch.device("cpu"),
        batches_per_item=2,
    )
    orders = []
    for _ in range(2):  # two epochs
        items = list(batches)
        seen = torch.cat([item[0].flatten() for item in items]).tolist()
        assert len(items) == len(batches) == 3
        assert [len(item[0]) for item in items] == ([8, 8, 4] if drop_last else [8, 8, 7])
        assert len(seen) == len(set(seen)) == (20 if drop_last else 23)
        for xb, yb in items:
            torch.testing.assert_close(xb[:, 0], yb)
        orders.append(seen)
    assert orders[0] != orders[1]  # each epoch a new permutation


def test_graphed_step_warms_up_captures_and_leaves_partial_batches_eager():
    from seqlab.training.cudagraph import GraphedStep

    calls = []

    def step(x, y, lengths):
        calls.append(len(x))
        return (x - y).pow(2).mean(), x * 2

    graphed = GraphedStep(
        step, batch_size=4, warmup_steps=2, capture=_eager_capture, warm_up=lambda s, i: s(*i)
    )
    x, y = torch.ones(4, 1), torch.zeros(4, 1)
    assert graphed(x, y, None)[0] == 1  # warm-up 1
    assert graphed(x, y, None)[0] == 1  # warm-up 2
    loss, pred = graphed(3 * x, y, None)  # captured, then replayed on these inputs
    assert loss == 9 and torch.equal(pred, 6 * x)
    assert graphed(x[:3], y[:3], None) is None  # a partial batch: the caller runs it eagerly
    loss, _ = graphed(2 * x, y, None)
    assert loss == 4


def test_a_failed_capture_falls_back_to_eager_with_one_warning(caplog):
    from seqlab.training.cudagraph import GraphedStep

    def broken_capture(step, inputs):
        raise RuntimeError("operation not permitted when stream is capturing")

    graphed = GraphedStep(
        lambda x, y, lengths: (x.sum(), x), batch_size=2, warmup_steps=0, capture=broken_capture
    )
    with caplog.at_level("WARNING", logger="seqlab"):
        assert graphed(torch.ones(2, 1), torch.ones(2, 1), None) is None
        assert graphed(torch.ones(2, 1), torch.ones(2, 1), None) is None
    warnings = [r for r in caplog.records if "CUDA graph capture failed" in r.getMessage()]
    assert len(warnings) == 1 and "training eagerly" in warnings[0].getMessage()


@pytest.mark.gpu
@pytest.mark.parametrize(
    "data", ["data=synthetic", "data=daily_profile"]
)  # shortcut path; cuDNN LSTM
def test_cuda_graph_training_matches_eager_on_a_gpu(compose_cfg, store, caplog, monkeypatch, data):
    overrides = (
        data,
        "data.n_samples=2000",
        "trainer.max_epochs=2",
        "scheduler=none",
        "trainer.accelerator=gpu",
    )
    train(compose_cfg(*overrides, "perf.cuda_graph=off", "logger.experiment_name=eager"))
    # The module's own path (FusedLoop builds its GraphedStep, cudagraph.capture_cuda captures);
    # only CUDA's replay is counted on its way.
    replays, replay = [], torch.cuda.CUDAGraph.replay

    def counted(graph):
        replays.append(1)
        return replay(graph)

    monkeypatch.setattr(torch.cuda.CUDAGraph, "replay", counted)
    with caplog.at_level("INFO", logger="seqlab"):
        train(compose_cfg(*overrides, "perf.cuda_graph=on", "logger.experiment_name=graphed"))
    assert "training step captured as a CUDA graph" in caplog.text
    assert "capture failed" not in caplog.text
    # 1600 training samples: 25 full batches an epoch, 50 steps; 3 warm up, 47 are graph replays.
    assert len(replays) == 47
    (eager,), (graphed,) = runs_of(store, "eager"), runs_of(store, "graphed")
    a = [m.value for m in store.get_metric_history(eager.info.run_id, "train_loss")]
    b = [m.value for m in store.get_metric_history(graphed.info.run_id, "train_loss")]
    assert len(a) == len(b) == 50
    assert b == pytest.approx(a, rel=1e-3)


@pytest.mark.gpu
def test_no_synchronisation_in_the_gpu_hot_loop(compose_cfg, monkeypatch):
    """Synchronising calls raise inside the fused loop (its batches gathered on the way included),
    from its second call on (the first warms up and captures), with per-step metrics flushed
    outside it."""
    from seqlab.training.loop import FusedLoop

    run, calls, strict_steps = FusedLoop.run_batches, [], []

    def strict(self, *args, **kwargs):
        calls.append(len(calls))
        if len(calls) == 1:
            return run(self, *args, **kwargs)
        torch.cuda.set_sync_debug_mode("error")
        try:
            n, loss = run(self, *args, **kwargs)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        strict_steps.append(n)
        return n, loss

    monkeypatch.setattr(FusedLoop, "run_batches", strict)
    result = train(
        compose_cfg(
            "data.n_samples=8000",
            "trainer.max_epochs=1",
            "trainer.accelerator=gpu",
            "data.val_fraction=0",
            "logger.flush_every_n_steps=1000",
            "perf.steps_per_call=25",
        )
    )
    assert result.status == "FINISHED"
    # 8000 samples in batches of 64: 125 steps in 5 calls of 25; the last 4 calls (100 steps) ran
    # with synchronisation made an error, and each returned, so none synchronised.
    assert len(calls) == 5 and strict_steps == [25, 25, 25, 25]


def test_benchmark_refuses_a_bad_batch_size_list_in_one_line(tmp_path):
    proc = run_script(ROOT / "scripts" / "benchmark.py", ["--batch-sizes", "64,x"])
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: --batch-sizes must be positive integers, e.g. 64,512,4096, and --repeats positive"
    ]
    bad = run_script(ROOT / "scripts" / "benchmark.py", ["--pack", "8,x"])
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        "error: --pack must be positive integers, e.g. 1,3,8,32"
    ]


@pytest.mark.parametrize(
    "wanted, batches, interval, expected",
    [
        (50, 100, None, (50, None)),  # validation each epoch: calls of 50 steps
        (50, 9, None, (9, None)),  # at most an epoch
        (50, 128, 50, (2, 25)),  # every 50 iterations: a divisor of 128 and 50
        (50, 100, 0.5, (50, 1)),  # half an epoch = 50 iterations = 1 call
        (50, 100, 1.0, (50, 1.0)),  # once an epoch
    ],
)
def test_steps_per_call_keeps_validation_on_its_iteration(wanted, batches, interval, expected):
    from seqlab.training.perf import steps_per_call

    assert steps_per_call(wanted, batches, interval) == expected


# -- the loop itself, against a bare loop of the same math ---------------------------------------


@pytest.mark.parametrize("matlab", [False, True], ids=["defaults", "matlab-settings"])
def test_the_fused_loop_is_a_bare_loop_of_the_same_math(matlab):
    """FusedLoop built directly (no Lightning), against the benchmark's `bare` math written out:
    zeroed gradients, the one-step shortcut, fused Adam, (L2 and threshold), clipping. The same
    losses and the same weights after 12 steps in items of 4."""
    from seqlab.model import CNNLSTM
    from seqlab.packing.model import OneMember
    from seqlab.tracking import StepLog
    from seqlab.training.evaluation import MEMBER_LOSSES
    from seqlab.training.gradients import GradientTreatment
    from seqlab.training.loop import FusedLoop

    torch.manual_seed(0)
    x, y = torch.randn(12 * 16, 1, 40), torch.randn(12 * 16, 1)
    models = [CNNLSTM(40, init="matlab" if matlab else "pytorch", dropout=0.0) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    params = [[p for p in m.parameters() if p.requires_grad] for m in models]
    optimizers = [torch.optim.Adam(p, lr=1e-2, fused=True) for p in params]
    l2, threshold = (1e-4, 0.05) if matlab else (0.0, None)

    log = StepLog()
    loop = FusedLoop(
        OneMember(models[0]),  # a run alone: a pack of one
        optimizers[0],
        MEMBER_LOSSES["half_mse"],
        log,
        batch_size=16,
        gradients=GradientTreatment(models[0], l2, threshold, clip=0.5),
    )
    steps = 0
    for item in range(3):  # items of 4 batches, each (1, batch, features): the step dropped
        batches = [
            (x[i * 16 : (i + 1) * 16, 0][None], y[i * 16 : (i + 1) * 16][None], None)
            for i in range(item * 4, (item + 1) * 4)
        ]
        n, _ = loop.run_batches(batches, first_step=steps + 1)
        steps += n
    assert steps == 12 and log.steps == list(range(1, 13))
    looped = [float(v) for v in log.losses]

    model, optimizer = models[1], optimizers[1]
    treat = GradientTreatment(model, l2, threshold)
    for p in params[1]:
        p.grad = torch.zeros_like(p)
    bare = []
    for i in range(12):
        torch._foreach_zero_([p.grad for p in params[1]])
        loss = half_mse(
            model.forward_one_step(x[i * 16 : (i + 1) * 16, 0]), y[i * 16 : (i + 1) * 16]
        )
        loss.backward()
        if treat.active:
            treat()
        torch.nn.utils.clip_grad_norm_(params[1], 0.5)
        optimizer.step()
        bare.append(loss.item())
    assert looped == pytest.approx(bare, rel=1e-5, abs=1e-7)
    for a, b in zip(models[0].state_dict().values(), models[1].state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    preds, targets = loop.take_epoch()
    assert preds.shape == targets.shape == (1, 12 * 16, 1) and torch.equal(targets[0], y)


@pytest.mark.gpu  # on a CPU, Lightning trains 16-mixed as bf16-mixed: no loss scaling there
@pytest.mark.parametrize("impl", ["fused", "foreach"])
def test_under_16_mixed_the_gradient_treatment_sees_unscaled_gradients(
    compose_cfg, store, monkeypatch, impl
):
    """trainer.precision=16-mixed scales the loss (a GradScaler, 2**16 at first): MATLAB's threshold
    and trainer.gradient_clip_val must act on the gradients unscaled, with fused Adam (which
    unscales inside its own step) as with an optimizer Lightning unscales itself."""
    from seqlab.training.gradients import GradientTreatment

    seen, call = [], GradientTreatment.__call__

    def recorded(self):
        seen.append(max(float(p.grad.norm()) for p in self.params))
        call(self)

    monkeypatch.setattr(GradientTreatment, "__call__", recorded)
    result = train(
        compose_cfg(
            "trainer.precision=16-mixed",
            "trainer.accelerator=gpu",
            "module.gradient_threshold=1.0",
            f"perf.optimizer_impl={impl}",
            "data.n_samples=256",
            "trainer.max_epochs=1",
        )
    )
    assert result.status == "FINISHED" and len(seen) == 4  # 205 training samples: 4 steps
    assert max(seen) < 100  # scaled, the largest gradient would be some 2**16 times its size
