"""Throughput side by side: a plain PyTorch loop, a bare loop of the default's own math (the limit),
perf=naive and the default, on every device present, for the seed shape (1 step x 1440 features)
and the 1440 x 1 shape, at one or more batch sizes.

    python scripts/benchmark.py                      # the full table (a few minutes on 2 cores)
    python scripts/benchmark.py --shapes seed --batch-sizes 64,512,4096 --loops bare,default
    python scripts/benchmark.py --shapes seed --loops bare,packed --pack 1,3,8,32   # many networks in one step
    python scripts/benchmark.py --shapes seed --loops packed,packed-lr --pack 32    # 32 seeds, and 32 rates of one seed
    python scripts/benchmark.py --smoke --out b.json # seconds: checks that it all runs
    python scripts/benchmark.py --mlflow             # also stored as a run in experiment seqlab-benchmark
    python scripts/benchmark.py --overhead           # what the default run, a pack of 8 and 8 jobs one
                                                     # by one spend outside training, phase by phase
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _integers(text: str) -> tuple[int, ...]:
    """'64,512' -> (64, 512); () where any part is not a whole number."""
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        return ()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--devices", help="comma-separated: cpu,gpu (default: every device present)"
    )
    parser.add_argument(
        "--shapes",
        default="seed,profile",
        help="comma-separated: seed (1 step x 1440 features, 100 batches an epoch), profile (1440 steps x 1 "
        "feature), study (the seed shape in epochs of 4 batches, as sweep=device_batch at batch 4096)",
    )
    parser.add_argument("--batch-sizes", default="64", help="comma-separated, e.g. 64,512,4096")
    parser.add_argument(
        "--loops",
        default=",".join(("plain", "bare", "naive", "default")),
        help="comma-separated among plain,bare,naive,default,packed (ratios need plain and bare)",
    )
    parser.add_argument(
        "--pack",
        help="comma-separated member counts for the packed loop, e.g. 1,3,8,32 (adds packed to "
        "--loops; default 8 where --loops names packed)",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="tiny runs, one repeat: checks it runs, measures nothing",
    )
    parser.add_argument("--out", type=Path, help="write the table as JSON here")
    parser.add_argument(
        "--mlflow", action="store_true", help="also record it as an MLflow run (project store)"
    )
    parser.add_argument(
        "--overhead",
        action="store_true",
        help="instead of throughput: what commands spend outside training, by phase (their runs' "
        "costs.json); the default run, a pack of 8 and the same 8 jobs one by one",
    )
    parser.add_argument(
        "--cases",
        default="single,pack,one-by-one",
        help="with --overhead, comma-separated among single,pack,one-by-one",
    )
    args = parser.parse_args(argv)
    if args.overhead:
        return _overhead(args)

    import torch

    from seqlab.benchmark import throughput as benchmark

    devices = (
        args.devices.split(",")
        if args.devices
        else ["cpu"] + (["gpu"] if torch.cuda.is_available() else [])
    )
    shapes = args.shapes.split(",")
    loops = tuple(args.loops.split(","))
    if args.pack and not set(benchmark.PACKED) & set(loops):
        loops += ("packed",)
    batch_sizes, packs = _integers(args.batch_sizes), _integers(args.pack or "8")
    if [s for s in shapes if s not in benchmark.SHAPES] or [
        name for name in loops if name not in benchmark.LOOPS
    ]:
        print(
            f"error: --shapes must be among {','.join(benchmark.SHAPES)}, --loops among {','.join(benchmark.LOOPS)}",
            file=sys.stderr,
        )
        return 2
    if not batch_sizes or min(batch_sizes) < 1 or args.repeats < 1:
        print(
            "error: --batch-sizes must be positive integers, e.g. 64,512,4096, and --repeats positive",
            file=sys.stderr,
        )
        return 2
    if not packs or min(packs) < 1:
        print("error: --pack must be positive integers, e.g. 1,3,8,32", file=sys.stderr)
        return 2
    if "gpu" in devices and not torch.cuda.is_available():
        print("error: --devices gpu asked for a CUDA GPU, but none is present", file=sys.stderr)
        return 2
    repeats = 1 if args.smoke else args.repeats
    settings = {
        "batch_sizes": args.batch_sizes,
        "repeats": repeats,
        "smoke": args.smoke,
        "shapes": args.shapes,
        "loops": ",".join(loops),
        **({"pack": ",".join(map(str, packs))} if set(benchmark.PACKED) & set(loops) else {}),
    }
    print(f"machine: {benchmark.machine()}")
    rows = benchmark.run(
        devices, shapes, batch_sizes, repeats, args.smoke, loops=loops, packs=packs
    )
    print("\n" + benchmark.table(rows))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(benchmark.to_json(rows, settings))
        print(f"wrote {args.out}")
    if args.mlflow:
        root = Path(os.environ.get("SEQLAB_ROOT", ROOT))
        run_id = benchmark.log_to_mlflow(
            rows, settings, f"sqlite:///{root}/mlruns/mlflow.db", str(root / "mlruns" / "artifacts")
        )
        print(f"mlflow run {run_id} in experiment 'seqlab-benchmark'")
    return 0


def _overhead(args) -> int:
    from seqlab.benchmark import overhead, throughput

    cases = args.cases.split(",")
    unknown = [c for c in cases if c not in overhead.CASES]
    if unknown or args.repeats < 1:
        print(
            f"error: --cases must be among {','.join(overhead.CASES)} and --repeats positive "
            f"(got {','.join(unknown) or args.repeats})",
            file=sys.stderr,
        )
        return 2
    repeats = 1 if args.smoke else args.repeats
    print(f"machine: {throughput.machine()}")
    for case in cases:
        words = " ".join((overhead.SMOKE if args.smoke else overhead.CASES)[case])
        print(f"{case:11} python train.py {words}")
    # Each case's runs in a store of their own, removed after: the measure keeps their costs.json.
    with tempfile.TemporaryDirectory(prefix="seqlab-overhead-") as root:
        try:
            measured = overhead.measure(cases, repeats, args.smoke, Path(root))
        except RuntimeError as error:
            print(f"error: {error}", file=sys.stderr)
            return 1
    summary = overhead.summary(measured.commands)
    print("\n" + overhead.table(summary, repeats))
    print("\n".join(overhead.verdicts(measured)))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        settings = {"cases": args.cases, "repeats": repeats, "smoke": args.smoke}
        args.out.write_text(overhead.to_json(measured, summary, settings))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
