"""Side-by-side throughput of the same model on the same data for the same steps, in one process:
(a) `plain`: the loop people write by hand; (b) `bare`: the default's own math (exact one-step
shortcuts, fused optimizer, data on the device) as a bare Python loop, no Lightning, no tracking:
the limit the default is held to; (c) `naive`: perf=naive; (d) `default` (perf=fast), with MLflow
tracking on for (c) and (d); (e) `packed`: K networks in one packed step, trained as the product
trains a pack (seqlab.packing.module, through the Trainer every job gets) without tracking, whose
model-steps/s (K x its steps/s) is set against `bare`'s, which is what K bare loops one after
another give; its members differ in seed (their weights, data order and dropout), or, with
`packed-lr`, only in the learning rate (one data order: each batch shared, issue 35). Runs
alternate (a, b, c, d, e, a, b, ...) so that a noisy machine slows all alike; each figure is the
median over repeats of the median epoch, the first (warm-up) left out, the device synchronised
before each clock read; each row's FLOP and bytes against the machine's peaks: roofline.py."""

from __future__ import annotations

import contextlib
import copy
import io
import itertools
import json
import logging
import os
import platform
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

import mlflow
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

import seqlab.schema  # noqa: F401
from seqlab.benchmark.roofline import Peaks, config_step_cost, fractions, measure_peaks
from seqlab.callbacks.timing import epoch_median
from seqlab.hydra_version import VERSION_BASE
from seqlab.packing.data import PackData
from seqlab.packing.members import Member
from seqlab.packing.model import PackedCNNLSTM
from seqlab.packing.module import PackModule
from seqlab.packing.task import packed_update
from seqlab.tracking import MlflowTracker
from seqlab.train import train
from seqlab.training import devices
from seqlab.training.devices import cpu_name, synchronize
from seqlab.training.module import LOSS_FUNCTIONS
from seqlab.training.noise import quiet_libraries
from seqlab.training.perf import DirectFusedStep, optimizer_factory
from seqlab.training.trainer import build_trainer

CONF_DIR = Path(__file__).resolve().parents[3] / "conf"

# name -> (data overrides, batches per epoch, epochs)
SHAPES = {
    "seed": (["data=synthetic", "data.source.seq_len=1"], 100, 6),  # 1 step x 1440 features
    "profile": (["data=daily_profile"], 8, 4),  # 1440 steps x 1 feature: LSTM-bound
    # The seed shape in short epochs of 4 batches, as sweep=device_batch trains at batch 4096
    # (16384 samples, 80% for training): the per-epoch work counts as it does in that study.
    "study": (["data=synthetic", "data.source.seq_len=1"], 4, 30),
}
SMOKE_SHAPES = {
    "seed": (["data=synthetic"], 4, 2),
    "profile": (["data=daily_profile"], 2, 2),
    "study": (["data=synthetic"], 2, 2),
}
LOOPS = ("plain", "bare", "naive", "default", "packed", "packed-lr")
DEFAULT_LOOPS = LOOPS[:4]
PACKED = ("packed", "packed-lr")  # the loops of K networks in one step (--pack sets the Ks)


@dataclass
class Row:
    device: str
    shape: str
    loop: str
    batch_size: int
    steps_per_epoch: int
    it_per_s: float
    samples_per_s: float
    ratio_to_plain: float = 0.0  # model-steps/s over plain's
    ratio_to_bare: float = 0.0  # model-steps/s over bare's (a pack's: K bare loops in turn)
    runs: list[float] = field(default_factory=list)  # it/s of each repeat
    members: int = 1  # networks trained by each step (a pack's K)
    model_steps_per_s: float = 0.0  # members x it_per_s; samples_per_s is this x batch_size
    # The step's arithmetic and the bytes it must move at the least (benchmark.roofline), and the
    # share of this machine's measured peak of each that the row's steps a second use.
    flop_per_step: float = 0.0
    bytes_per_step: float = 0.0
    flop_fraction: float = 0.0
    byte_fraction: float = 0.0


def machine() -> dict[str, str]:
    info = {
        "cpu": cpu_name(),
        "cpu_cores": str(os.cpu_count()),
        "torch": torch.__version__,
        "threads": str(torch.get_num_threads()),
        "python": platform.python_version(),
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["cuda"] = str(torch.version.cuda)
    return info


def _compose(overrides: list[str]):

    with initialize_config_dir(str(CONF_DIR), **VERSION_BASE):
        return compose("train", overrides=overrides)


def _overrides(
    shape: str, device: str, batch_size: int, smoke: bool, root: Path
) -> tuple[list[str], int, int]:
    data, batches, epochs = (SMOKE_SHAPES if smoke else SHAPES)[shape]
    n = batches * batch_size
    return (
        [
            *data,
            f"data.n_samples={n}",
            "data.val_fraction=0",
            f"data.batch_size={batch_size}",
            f"trainer.accelerator={device}",
            f"trainer.max_epochs={epochs}",
            "scheduler=none",
            f"paths.root_dir={root}",
            f"paths.output_dir={root}/out",
            "logger.experiment_name=benchmark",
        ],
        batches,
        epochs,
    )


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
    data on the device, an on-device permutation each epoch into a reused buffer. Returns it/s
    per epoch."""

    dev, x, y, model, loss_fn = _setup(cfg, device)
    optimizer = optimizer_factory(instantiate(cfg.optimizer), cfg.perf.optimizer_impl)(
        model.parameters()
    )
    grads = []
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
        grads.append(p.grad)
    step = DirectFusedStep(optimizer) if DirectFusedStep.applies(optimizer) else optimizer.step
    forward = (lambda xb: model.forward_one_step(xb[:, 0])) if x.shape[1] == 1 else model
    bs = cfg.data.batch_size
    xs, ys = torch.empty_like(x), torch.empty_like(y)
    rates = []
    for _ in range(cfg.trainer.max_epochs):
        synchronize(dev)
        start = time.perf_counter()
        order = torch.randperm(len(x), device=dev)
        torch.index_select(x, 0, order, out=xs)
        torch.index_select(y, 0, order, out=ys)
        for i in range(len(x) // bs):
            torch._foreach_zero_(grads)
            loss = loss_fn(forward(xs[i * bs : (i + 1) * bs]), ys[i * bs : (i + 1) * bs])
            loss.backward()
            step()  # the fused optimizer's kernel as the default loop calls it (training.perf)
        synchronize(dev)
        rates.append((len(x) // bs) / (time.perf_counter() - start))
    return rates


class _NoRun:
    """A pack member's run in the benchmark: it keeps nothing (as `bare` tracks nothing)."""

    log_checkpoints = None

    def log_series(self, *args, **kwargs) -> None:
        pass

    def log_metrics(self, *args, **kwargs) -> None:
        pass


def packed_loop(cfg, device: str, members: int, one_order: bool = False) -> list[float]:
    """`members` networks of the config trained as the product trains a pack: its LightningModule
    (seqlab.packing.module.PackModule: the packed network, its optimizer and schedule as
    packing.task.packed_update builds them, each member's own order each epoch, and on a CPU each
    member's own dropout stream) driven by the Trainer every job gets
    (training.trainer.build_trainer), without tracking. Member k is built from seed cfg.seed + k;
    one_order: every member from cfg.seed, with its own learning rate (0.3x to 3x the config's), as
    an optimizer.lr sweep of one seed packs: one data order, each batch shared.
    Returns the pack's steps/s per epoch, as the module times them (model-steps/s: members x that)."""

    quiet_libraries(cfg.perf.loader)
    dev, x, y, _, _ = _setup(cfg, device)
    seeds = [cfg.seed] * members if one_order else [cfg.seed + k for k in range(members)]
    scales = torch.logspace(-0.5, 0.5, members).tolist() if one_order else [1.0] * members
    pack = []
    for k in range(members):
        member_cfg = copy.deepcopy(cfg)
        member_cfg.optimizer.lr = cfg.optimizer.lr * scales[k]
        torch.manual_seed(seeds[k])
        net = instantiate(cfg.model, n_features=x.shape[2], n_outputs=y.shape[1])
        stream = torch.Generator()  # the global stream where its build left it (packing.task)
        stream.set_state(torch.get_rng_state())
        order = torch.Generator(device=dev).manual_seed(seeds[k])
        pack.append(Member(k, member_cfg, None, _NoRun(), network=net, dropout_stream=stream))
        pack[-1].order = order
    model = PackedCNNLSTM([m.network for m in pack]).to(dev)
    optimizer, scheduler, gradients, lr_scale = packed_update(cfg, pack, model, x.shape[1] == 1)
    bs = cfg.data.batch_size
    data = PackData(
        x=x[:, 0] if x.shape[1] == 1 else x,
        y=y,
        train_rows=torch.arange(len(x), device=dev).expand(members, -1),
        val_rows=None,
        batch_size=bs,
        n_batches=len(x) // bs,
        shuffle=True,
    )
    module = PackModule(
        model,
        optimizer,
        scheduler,
        gradients,
        cfg.module.loss,
        float,
        data,
        pack,
        lr_scale=lr_scale,
        steps_per_call=cfg.perf.steps_per_call,
        flush_every_n_steps=cfg.logger.flush_every_n_steps,
        flush_every_s=cfg.logger.flush_every_s,
        exact_dropout=device == "cpu",
    )
    trainer = build_trainer(cfg, devices.resolve(device), [], False, True, False, None)
    trainer.fit(module)
    return [epoch["it_per_s"] for epoch in pack[0].epochs]


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


_BARE_LOOPS = {"plain": plain_loop, "bare": bare_loop}


def run(
    devices: list[str],
    shapes: list[str],
    batch_sizes: tuple[int, ...] = (64,),
    repeats: int = 3,
    smoke: bool = False,
    progress=print,
    loops: tuple[str, ...] = DEFAULT_LOOPS,
    packs: tuple[int, ...] = (8,),
) -> list[Row]:
    """`packs`: the member counts the `packed` loop runs (one row each)."""
    quiet = logging.getLogger("seqlab")
    level = quiet.level
    quiet.setLevel(logging.WARNING)  # each run's own report is not the benchmark's
    try:
        return _run(devices, shapes, batch_sizes, repeats, smoke, progress, loops, packs)
    finally:
        quiet.setLevel(level)


def _run(devices, shapes, batch_sizes, repeats, smoke, progress, loops, packs) -> list[Row]:
    rows: list[Row] = []
    peaks: dict[str, Peaks] = {}
    with tempfile.TemporaryDirectory(prefix="seqlab-bench-") as tmp:
        root = Path(tmp)
        for device, shape, batch_size in itertools.product(devices, shapes, batch_sizes):
            if device not in peaks:  # timed before its rows, on the device they run on
                peaks[device] = measure_peaks(torch.device("cuda" if device == "gpu" else device))
                progress(
                    f"  {device:4} peaks: {peaks[device].flop_per_s / 1e9:,.1f} GFLOP/s (fp32 "
                    f"matrix product), {peaks[device].bytes_per_s / 1e9:,.1f} GB/s (copy)"
                )
            overrides, batches, _ = _overrides(shape, device, batch_size, smoke, root)
            configs = {
                loop: _compose([*overrides, "perf=naive"] if loop == "naive" else overrides)
                for loop in loops
            }
            # (loop, members): each pack size is a loop of its own.
            variants = [(loop, k) for loop in loops for k in (packs if loop in PACKED else (1,))]
            runs: dict[tuple[str, int], list[float]] = {v: [] for v in variants}
            for repeat in range(repeats):
                for loop, k in list(variants):
                    cfg = configs[loop]
                    if loop in PACKED:
                        rates = packed_loop(cfg, device, k, one_order=loop == "packed-lr")
                    else:
                        rates = (
                            _BARE_LOOPS[loop](cfg, device)
                            if loop in _BARE_LOOPS
                            else framework_loop(cfg)
                        )
                    runs[(loop, k)].append(epoch_median(rates))
                    progress(
                        f"  {device:4} {shape:8} bs{batch_size:<5} {_label(loop, k):9} repeat {repeat + 1}/{repeats}: "
                        f"{runs[(loop, k)][-1]:,.1f} it/s"
                    )
            medians = {v: statistics.median(values) for v, values in runs.items()}
            plain, bare = (
                medians.get(("plain", 1), float("nan")),
                medians.get(("bare", 1), float("nan")),
            )
            for (loop, k), it in medians.items():
                model_steps = it * k
                cost = config_step_cost(configs[loop], batch_size, k, loop == "packed-lr")
                flop_fraction, byte_fraction = fractions(cost, it, peaks[device])
                rows.append(
                    Row(
                        device,
                        shape,
                        loop,
                        batch_size,
                        batches,
                        it,
                        model_steps * batch_size,
                        model_steps / plain,
                        model_steps / bare,
                        runs[(loop, k)],
                        k,
                        model_steps,
                        cost.flop,
                        cost.bytes,
                        flop_fraction,
                        byte_fraction,
                    )
                )
    return rows


def _label(loop: str, members: int) -> str:
    return f"packed{members}{loop[len('packed') :]}" if loop in PACKED else loop


def table(rows: list[Row]) -> str:
    lines = [
        f"{'device':6} {'shape':8} {'batch':>5} {'loop':9} {'it/s':>9} {'model-steps/s':>13} {'samples/s':>11} "
        f"{'vs plain':>8} {'vs bare':>8} {'FLOP':>6} {'bytes':>6}"
    ]
    for r in rows:
        lines.append(
            f"{r.device:6} {r.shape:8} {r.batch_size:5} {_label(r.loop, r.members):9} {r.it_per_s:9,.1f} "
            f"{r.model_steps_per_s:13,.1f} {r.samples_per_s:11,.0f} {r.ratio_to_plain:7.2f}x {r.ratio_to_bare:7.2f}x"
            f" {r.flop_fraction:6.1%} {r.byte_fraction:6.1%}"
        )
    lines.append(
        "FLOP, bytes: the share of this machine's measured peak arithmetic and memory traffic the "
        "row's steps use (benchmark/roofline.py); far below both: bound by launches and Python"
    )
    if any(r.members > 1 for r in rows):
        lines.append(
            "packedK: K networks in one step; it/s is the pack's steps/s, model-steps/s K x that; "
            "vs bare: over K bare loops one after another"
        )
    return "\n".join(lines)


def to_json(rows: list[Row], settings: dict) -> str:
    return json.dumps(
        {"machine": machine(), "settings": settings, "rows": [asdict(r) for r in rows]}, indent=2
    )


def log_to_mlflow(
    rows: list[Row], settings: dict, tracking_uri: str, artifact_root: Optional[str]
) -> str:

    tracker = MlflowTracker(
        tracking_uri, "seqlab-benchmark", artifact_root, synchronous=True, step_writer="inline"
    )
    with tracker.run(
        f"benchmark-{time.strftime('%Y%m%d-%H%M%S')}",
        {f"machine.{k}": v for k, v in machine().items()},
    ):
        tracker.log_params({k: str(v) for k, v in settings.items()})
        tracker.log_metrics(
            {
                f"{r.device}.{r.shape}.bs{r.batch_size}.{_label(r.loop, r.members)}.it_per_s": r.it_per_s
                for r in rows
            }
            | {
                f"{r.device}.{r.shape}.bs{r.batch_size}.{_label(r.loop, r.members)}.ratio_to_plain": r.ratio_to_plain
                for r in rows
            }
            | {
                f"{r.device}.{r.shape}.bs{r.batch_size}.{_label(r.loop, r.members)}.ratio_to_bare": r.ratio_to_bare
                for r in rows
            },
            step=0,
        )
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "benchmark.json"
            path.write_text(to_json(rows, settings))
            tracker.log_artifact(path)
            (Path(tmp) / "benchmark.txt").write_text(table(rows) + "\n")
            tracker.log_artifact(Path(tmp) / "benchmark.txt")
    return tracker.run_id
