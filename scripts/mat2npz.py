"""Convert a MATLAB .mat file (v5/v7 or v7.3) to the .npz format `data=npz` reads, so the data
can live outside MATLAB:

    python scripts/mat2npz.py data.mat data.npz [--x-key XrTrain --y-key YrTrain]
    python train.py data=npz data.path=data.npz

The .npz holds X (N, steps, features), y (N, responses), and where they apply `lengths` (real
steps of right-padded sequences) and X_val/y_val/lengths_val (from XrVal/YrVal)."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("mat", help="the .mat file")
    parser.add_argument("out", type=Path, help="the .npz file to write")
    parser.add_argument("--x-key", default="XrTrain")
    parser.add_argument("--y-key", default="YrTrain")
    parser.add_argument("--x-val-key", default="XrVal")
    parser.add_argument("--y-val-key", default="YrVal")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    import numpy as np

    from seqlab import SeqlabError
    from seqlab.data import load_mat

    try:
        data = load_mat(args.mat, None, 0, args.x_key, args.y_key, args.x_val_key, args.y_val_key)
    except SeqlabError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    arrays = {"X": data.x, "y": data.y}
    if data.lengths is not None:
        arrays["lengths"] = data.lengths
    if data.val is not None:
        arrays.update(X_val=data.val.x, y_val=data.val.y)
        if data.val.lengths is not None:
            arrays["lengths_val"] = data.val.lengths
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.out, **arrays)
    print(f"wrote {args.out}: " + ", ".join(f"{k} {v.shape}" for k, v in arrays.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
