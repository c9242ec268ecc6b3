"""Write the synthetic daily-load data to a file in the format `data=npz` or `data=csv` reads,
as a template for bringing your own data:

    python scripts/make_example_data.py data/example.npz --n-samples 2000
    python train.py data=npz data.path=data/example.npz
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "out",
        type=Path,
        help="output file: .npz (X, y arrays) or .csv (one sample a row, target last)",
    )
    parser.add_argument("--n-samples", type=int, default=2000)
    parser.add_argument("--seq-len", type=int, default=1, help="days (steps) per sample")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.out.suffix not in (".npz", ".csv"):
        print(f"error: {args.out}: the file name must end in .npz or .csv", file=sys.stderr)
        return 2

    import numpy as np

    from seqlab.data import synthetic_daily_load

    data = synthetic_daily_load(args.n_samples, args.seed, seq_len=args.seq_len)
    x, y = data.x, data.y
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if args.out.suffix == ".npz":
        np.savez_compressed(args.out, X=x, y=y)
    else:
        table = np.concatenate([x.reshape(len(x), -1), y], axis=1)
        header = ",".join([f"x{i}" for i in range(table.shape[1] - 1)] + ["target"])
        np.savetxt(args.out, table, delimiter=",", header=header, comments="", fmt="%.6g")
    print(f"wrote {args.out}: X {x.shape} (samples, steps, features), y {y.shape}")
    print(
        f"train on it: python train.py data={args.out.suffix[1:]} data.path={args.out}"
        + (
            f" data.source.seq_len={args.seq_len}"
            if args.out.suffix == ".csv" and args.seq_len > 1
            else ""
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
