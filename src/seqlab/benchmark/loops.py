"""The loops `scripts/benchmark.py` times side by side (seqlab.benchmark.throughput), each on the
same model, data and steps: `plain`, the loop people write by hand; `bare`, the default's own math
with nothing around it (the limit the default is held to: on a GPU it replays the same CUDA graph
of each step the default replays); `packed`, K networks trained as the product trains a job of K
members; and the product itself (`framework_loop`: train(), with MLflow tracking)."""

from __future__ import annotations

import contextlib
import copy
import io
import time
from functools import partial

import mlflow
import torch
from hydra.utils import instantiate

from seqlab.callbacks.timing import EpochTimer
from seqlab.packing.data import PackData
from seqlab.packing.members import Member
from seqlab.packing.model import pack_of
from seqlab.packing.module import SeqRegressor
from seqlab.packing.optim import build_update
from seqlab.tracking import StepMetricsRecorder
from seqlab.train import train
from seqlab.training import devices
from seqlab.training.cudagraph import GraphedStep
from seqlab.training.devices import synchronize
from seqlab.training.evaluation import LOSS_FUNCTIONS
from seqlab.training.loop import FusedLoop
from seqlab.training.noise import quiet_libraries
from seqlab.training.perf import DirectFusedStep, optimizer_factory
from seqlab.training.trainer import build_trainer


def _setup(cfg, device: str):
    """What both hand-written loops start from: the config's data and model on the device, its loss."""

    torch.manual_seed(cfg.seed)
    dev = torch.device("cuda" if device == "gpu" else device)
    data = instantiate(cfg.data.source)(n_samples=cfg.data.n_samples, seed=cfg.data.seed)
    x, y = torch.from_numpy(data.x).to(dev), torch.from_numpy(data.y).to(dev)
    model = instantiate(cfg.model, n_features=x.shape[2], n_outputs=y.shape[1]).to(dev)
    return dev, x, y, model, LOSS_FUNCTIONS[cfg.module.loss]


def plain_loop(cfg, device: str) -> list[float]:
    """The loop people write by hand: tensors on the device, a new permutation each epoch, the
    same model, loss and optimizer settings as the config, no tracking. Returns it/s per epoch."""

    dev, x, y, model, loss_fn = _setup(cfg, device)
    optimizer = instantiate(cfg.optimizer)(params=model.parameters())
    bs = cfg.data.batch_size
    rates = []
    for _ in range(cfg.trainer.max_epochs):
        synchronize(dev)
        start = time.perf_counter()
        order = torch.randperm(len(x), device=dev)
        xs, ys = x[order], y[order]
        for i in range(len(x) // bs):
            optimizer.zero_grad()
            loss = loss_fn(model(xs[i * bs : (i + 1) * bs]), ys[i * bs : (i + 1) * bs])
            loss.backward()
            optimizer.step()
        synchronize(dev)
        rates.append((len(x) // bs) / (time.perf_counter() - start))
    return rates


def bare_loop(cfg, device: str) -> list[float]:
    """The limit: the same math as the default (perf=fast) with nothing around it. The exact
    one-step shortcut forward where the data has one step, the optimizer fused, gradients kept as
    zeroed tensors (as the default keeps them, so unused parameters still get their update), the
    data on the device, an on-device permutation each epoch into a reused buffer; on a GPU each
    full step replayed as the one CUDA graph the default replays (training.cudagraph, its optimizer
    made capturable as the default's), since without it a GPU's step is its kernel launches.
    Returns it/s per epoch."""

    dev, x, y, model, loss_fn = _setup(cfg, device)
    graphs = dev.type == "cuda" and str(cfg.perf.cuda_graph).lower() not in ("off", "false")
    optimizer = optimizer_factory(
        instantiate(cfg.optimizer), cfg.perf.optimizer_impl, capturable=graphs
    )(model.parameters())
    grads = []
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
        grads.append(p.grad)
    update = DirectFusedStep(optimizer) if DirectFusedStep.applies(optimizer) else optimizer.step
    forward = (lambda xb: model.forward_one_step(xb[:, 0])) if x.shape[1] == 1 else model

    def step(xb, yb, lengths):
        torch._foreach_zero_(grads)
        loss = loss_fn(forward(xb), yb)
        loss.backward()
        update()  # the fused optimizer's kernel as the default loop calls it (training.perf)
        return loss, loss

    bs = cfg.data.batch_size
    graphed = GraphedStep(step, bs) if graphs else None
    xs, ys = torch.empty_like(x), torch.empty_like(y)
    rates = []
    for _ in range(cfg.trainer.max_epochs):
        synchronize(dev)
        start = time.perf_counter()
        order = torch.randperm(len(x), device=dev)
        torch.index_select(x, 0, order, out=xs)
        torch.index_select(y, 0, order, out=ys)
        for i in range(len(x) // bs):
            xb, yb = xs[i * bs : (i + 1) * bs], ys[i * bs : (i + 1) * bs]
            if graphed is None or graphed(xb, yb, None) is None:
                step(xb, yb, None)
        synchronize(dev)
        rates.append((len(x) // bs) / (time.perf_counter() - start))
    return rates


class _NoRun:
    """A pack member's run in the benchmark: it keeps nothing (as `bare` tracks nothing)."""

    log_checkpoints = None
    flush_every_n_steps, flush_every_s = 50, 1.0

    def log_series(self, *args, **kwargs) -> None:
        pass

    def log_metrics(self, *args, **kwargs) -> None:
        pass


def packed_loop(cfg, device: str, members: int, one_order: bool = False) -> list[float]:
    """`members` networks of the config trained as the product trains a job of K members: its
    LightningModule (seqlab.packing.module.SeqRegressor: the packed network, its update as
    packing.optim.build_update makes it, each member's own order each epoch, and on a CPU each
    member's own dropout stream), the step recorder and the epoch timer, driven by the Trainer
    every job gets (training.trainer.build_trainer), without tracking. Member k is built from seed
    cfg.seed + k; one_order: every member from cfg.seed, with its own learning rate (0.3x to 3x the
    config's), as an optimizer.lr sweep of one seed packs: one data order, each batch shared.
    Returns the pack's steps/s per epoch, as the job's timer times them (model-steps/s: members x
    that)."""

    quiet_libraries(cfg.perf.loader)
    resolved = devices.resolve(device)
    dev, x, y, _, _ = _setup(cfg, device)
    seeds = [cfg.seed] * members if one_order else [cfg.seed + k for k in range(members)]
    scales = torch.logspace(-0.5, 0.5, members).tolist() if one_order else [1.0] * members
    pack = []
    for k in range(members):
        member_cfg = copy.deepcopy(cfg)
        member_cfg.optimizer.lr = cfg.optimizer.lr * scales[k]
        torch.manual_seed(seeds[k])
        net = instantiate(cfg.model, n_features=x.shape[2], n_outputs=y.shape[1])
        stream = torch.Generator()  # the global stream where its build left it (seqlab.train)
        stream.set_state(torch.get_rng_state())
        order = torch.Generator(device=dev).manual_seed(seeds[k])
        pack.append(
            Member(k, member_cfg, None, _NoRun(), network=net, dropout_stream=stream, order=order)
        )
    bs = cfg.data.batch_size
    data = PackData(
        x=x[:, 0] if x.shape[1] == 1 else x,
        y=y,
        lengths=None,
        train_rows=torch.arange(len(x), device=dev).expand(members, -1),
        val_rows=None,
        batch_size=bs,
        n_batches=len(x) // bs,
        shuffle=True,
    )
    graphs = device == "gpu" and str(cfg.perf.cuda_graph).lower() not in ("off", "false")
    recorder = StepMetricsRecorder(pack, 50, lambda loss: loss, every_s=1.0)
    module = SeqRegressor(
        pack_of([m.network for m in pack], cfg.perf.exact_shortcuts),
        pack,
        data,
        partial(
            build_update,
            networks=[m.network for m in pack],
            optimizers=[instantiate(m.cfg.optimizer) for m in pack],
            scheduler=None,
            impl=cfg.perf.optimizer_impl,
            capturable=graphs,
            one_step=data.steps == 1,
        ),
        cfg.module.loss,
        step_log=recorder.steps,
        loop=partial(FusedLoop, cuda_graph=str(cfg.perf.cuda_graph)),
        exact_dropout=device == "cpu",
    )
    module.set_items_per_call(cfg.perf.steps_per_call)
    callbacks = [recorder, EpochTimer()]
    trainer = build_trainer(cfg, resolved, callbacks, False, True, False, None)
    trainer.fit(module)
    return [epoch.it_per_s for epoch in pack[0].epochs]


def framework_loop(cfg) -> list[float]:
    """seqlab's own training (train()), tracking into a throw-away MLflow store."""

    # Progress output is part of each loop's cost, but not of the benchmark's report.
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        train(cfg)

    client = mlflow.MlflowClient(cfg.logger.tracking_uri)
    experiment = client.get_experiment_by_name(cfg.logger.experiment_name)
    run = client.search_runs(
        [experiment.experiment_id], order_by=["attributes.start_time DESC"], max_results=1
    )[0]
    return [m.value for m in client.get_metric_history(run.info.run_id, "it_per_s")]


BARE_LOOPS = {"plain": plain_loop, "bare": bare_loop}
