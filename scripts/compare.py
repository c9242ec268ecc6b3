"""Compare MLflow runs side by side: a table, plots and a verdict (logic in src/seqlab/sweeps/: runs.py, verdict.py, compare.py).
Runs that differ only in `seed` are repeats of one configuration: the table gives n, mean and
95% interval per configuration, and the verdict ranks configurations only where Welch's t-test
at 5% tells them apart ("tied within noise" otherwise).

    python scripts/compare.py --experiment device-batch --sweep latest
    python scripts/compare.py --experiment device-batch --sweep latest --rank-by best_val_rmse
    python scripts/compare.py --experiment seqlab --filter "params.data.batch_size = '64'"
    python scripts/compare.py --diff RUN_A RUN_B      # two runs: only the params and tags that differ, then the metrics
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    root = Path(os.environ.get("SEQLAB_ROOT", ROOT))
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--experiment", default="seqlab")
    parser.add_argument(
        "--sweep", help="a sweep id, or 'latest'; its parent run gets the results as artifacts"
    )
    parser.add_argument(
        "--filter", default="", help="an MLflow search filter, e.g. \"tags.accelerator = 'cpu'\""
    )
    parser.add_argument(
        "--target", type=float, help="target val_rmse (default: the runs' metrics.target_rmse)"
    )
    parser.add_argument("--tracking-uri", default=f"sqlite:///{root}/mlruns/mlflow.db")
    parser.add_argument("--out", type=Path, default=root / "logs" / "compare")
    parser.add_argument(
        "--no-log", action="store_true", help="do not store the results on the sweep's parent run"
    )
    parser.add_argument(
        "--rank-by",
        default="config",
        choices=(
            "config",
            "it_per_s",
            "samples_per_s",
            "model_steps_per_s",
            "time_to_target_s",
            "val_rmse",
            "best_val_rmse",
        ),
        help="order of the table: by configuration, or best first by a metric's mean "
        "(val_rmse: the final value; best_val_rmse: the lowest a run reached; "
        "model_steps_per_s: networks trained per second, a pack's members counted whole)",
    )
    parser.add_argument(
        "--diff",
        nargs=2,
        metavar=("RUN_A", "RUN_B"),
        help="two run ids: only the params and tags that differ, then every metric side by side",
    )
    args = parser.parse_args(argv)

    from seqlab import SeqlabError
    from seqlab.store.ghosts import end_dead_runs
    from seqlab.store.local import open_client
    from seqlab.store.server_auth import client_credentials
    from seqlab.sweeps.compare import compare, runs_table, table
    from seqlab.tracking import check_server

    uri = client_credentials(args.tracking_uri)  # a user:password in it is sent, not shown
    try:
        if uri.startswith(("http://", "https://")):
            check_server(uri)  # no server there, or a refused sign-in: one line
        client = open_client(uri)
    except SeqlabError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    end_dead_runs(client)  # runs whose process died without closing them
    if args.diff:
        from seqlab.sweeps.run_diff import diff_runs, format_diff

        try:
            print(format_diff(diff_runs(client, *args.diff)))
        except SeqlabError as error:
            print(f"error: {error}", file=sys.stderr)
            return 1
        return 0
    try:
        report = compare(
            client,
            args.experiment,
            args.out,
            args.sweep,
            args.filter,
            args.target,
            not args.no_log,
            args.rank_by,
        )
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    if not report.rows:
        print("error: no runs matched", file=sys.stderr)
        return 1
    print(table(report.rows, args.rank_by))
    print(f"\n{runs_table(report.rows)}")
    print(f"\n{report.verdict}\n\nwrote {', '.join(p.name for p in report.files)} in {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
