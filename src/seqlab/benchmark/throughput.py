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
before each clock read; each row's FLOP and bytes against the machine's peaks: roofline.py. A
row's ratio to `bare` also comes with its noise: each repeat's ratio to the bare run beside it
(the two ran a few seconds apart), and the 95% interval of their mean (seqlab.sweeps.stats)."""

from __future__ import annotations

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

import torch
from hydra import compose, initialize_config_dir

import seqlab.schema  # noqa: F401
from seqlab.benchmark.loops import BARE_LOOPS, framework_loop, packed_loop
from seqlab.benchmark.roofline import Peaks, config_step_cost, fractions, measure_peaks
from seqlab.hydra_version import VERSION_BASE
from seqlab.sweeps.stats import Summary
from seqlab.tracking import MlflowTracker
from seqlab.tracking.records import epoch_median
from seqlab.training.devices import cpu_name

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
    # Each repeat's model-steps/s over the same repeat's bare run (paired: alternated, seconds
    # apart), and the 95% Student-t interval of their mean: None without bare or with one repeat.
    paired_ratios: list[float] = field(default_factory=list)
    ratio_lo: Optional[float] = None
    ratio_hi: Optional[float] = None


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
                            BARE_LOOPS[loop](cfg, device)
                            if loop in BARE_LOOPS
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
                noise = paired_ratios(runs[(loop, k)], runs.get(("bare", 1), []), k)
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
                        list(noise.values),
                        noise.lo,
                        noise.hi,
                    )
                )
    return rows


def paired_ratios(rates: list[float], bare: list[float], members: int) -> Summary:
    """Each repeat's model-steps/s (`members` x its it/s) over the bare run of the same repeat,
    summarised with the 95% interval of their mean (empty without bare runs)."""
    return Summary(tuple(members * r / b for r, b in zip(rates, bare)))


def _interval(row: Row) -> str:
    if row.loop == "bare" or row.ratio_lo is None:
        return "-"
    return f"{row.ratio_lo:.2f}-{row.ratio_hi:.2f}x"


def _label(loop: str, members: int) -> str:
    return f"packed{members}{loop[len('packed') :]}" if loop in PACKED else loop


def table(rows: list[Row]) -> str:
    lines = [
        f"{'device':6} {'shape':8} {'batch':>5} {'loop':9} {'it/s':>9} {'model-steps/s':>13} {'samples/s':>11} "
        f"{'vs plain':>8} {'vs bare':>8} {'95% (paired)':>13} {'FLOP':>6} {'bytes':>6}"
    ]
    for r in rows:
        lines.append(
            f"{r.device:6} {r.shape:8} {r.batch_size:5} {_label(r.loop, r.members):9} {r.it_per_s:9,.1f} "
            f"{r.model_steps_per_s:13,.1f} {r.samples_per_s:11,.0f} {r.ratio_to_plain:7.2f}x {r.ratio_to_bare:7.2f}x"
            f" {_interval(r):>13} {r.flop_fraction:6.1%} {r.byte_fraction:6.1%}"
        )
    lines.append(
        "vs bare: the medians' ratio; 95% (paired): the interval of the mean of each repeat's ratio to "
        "the bare run beside it (a shared machine's speed moves between runs: a target inside it is "
        "not told apart)"
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
    lines += one_order_lines(rows)
    return "\n".join(lines)


def one_order_lines(rows: list[Row]) -> list[str]:
    """For each packedK-lr row beside a packedK row of the same device, shape and batch: its
    model-steps/s over theirs (K members of one data order, sharing each batch, against K members
    of K orders), as the medians' ratio and the 95% interval of each repeat's ratio to the packedK
    run beside it: the two run seconds apart, so the pair sees one speed of a shared machine."""
    seeds = {(r.device, r.shape, r.batch_size, r.members): r for r in rows if r.loop == "packed"}
    lines = []
    for r in rows:
        other = seeds.get((r.device, r.shape, r.batch_size, r.members))
        if r.loop != "packed-lr" or other is None:
            continue
        paired = paired_ratios(r.runs, other.runs, 1)  # as a row against bare: one by one
        interval = "" if paired.lo is None else f", 95% (paired) {paired.lo:.2f}-{paired.hi:.2f}x"
        lines.append(
            f"{_label(r.loop, r.members)} over {_label(other.loop, other.members)} ({r.device}, "
            f"{r.shape}, batch {r.batch_size}): {r.it_per_s / other.it_per_s:.2f}x{interval} "
            f"({paired.n} repeats; one data order shared by the members against one order each)"
        )
    return lines


def to_json(rows: list[Row], settings: dict) -> str:
    return json.dumps(
        {"machine": machine(), "settings": settings, "rows": [asdict(r) for r in rows]}, indent=2
    )


def log_to_mlflow(
    rows: list[Row], settings: dict, tracking_uri: str, artifact_root: Optional[str]
) -> str:

    tracker = MlflowTracker(tracking_uri, "seqlab-benchmark", artifact_root, synchronous=True)
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
