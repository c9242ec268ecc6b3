"""Copy runs from a local store into a tracking server, once (logic in src/seqlab/store/sync.py).
For compute nodes that cannot reach the server: their jobs track into a local store (the default
logger, on the node or a shared disk), and this copies the runs, with every metric, artifact and
model, into the server afterwards. Running it again copies only what is new.

    python scripts/sync.py --from sqlite:///scratch/me/mlruns/mlflow.db --to http://tracking-host:5000
    python scripts/sync.py --from sqlite:///scratch/me/mlruns/mlflow.db --to http://tracking-host:5000 --experiment seqlab
    make sync FROM=sqlite:///scratch/me/mlruns/mlflow.db TO=http://tracking-host:5000
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
    parser.add_argument(
        "--from",
        dest="source",
        default=f"sqlite:///{root}/mlruns/mlflow.db",
        help="the store the runs are in (default: this project's)",
    )
    parser.add_argument(
        "--to",
        dest="target",
        default=os.environ.get("MLFLOW_TRACKING_URI"),
        help="the tracking server (default: MLFLOW_TRACKING_URI)",
    )
    parser.add_argument(
        "--experiment", action="append", help="only this experiment (again for more); default: all"
    )
    args = parser.parse_args(argv)
    if not args.target:
        print(
            "error: say where the runs go: --to http://host:5000 (or set MLFLOW_TRACKING_URI)",
            file=sys.stderr,
        )
        return 1

    from seqlab import SeqlabError, one_line
    from seqlab.secrets import mask_text, mask_uris
    from seqlab.store.ghosts import end_dead_runs
    from seqlab.store.server_auth import client_credentials
    from seqlab.store.sync import sync
    from seqlab.tracking.connect import client_for

    target = client_credentials(args.target)  # a user:password in it is sent, not shown
    try:
        if (
            args.source.startswith("sqlite:///")
            and not Path(args.source[len("sqlite:///") :]).is_file()
        ):
            raise SeqlabError(f"--from {mask_uris(args.source)}: no such store")
        source = client_for(args.source)
        destination = client_for(
            target
        )  # a server that does not answer, or refuses the sign-in: one line
    except SeqlabError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    end_dead_runs(source)  # runs whose process died are ended KILLED, and copied as such
    try:
        done = sync(source, destination, args.experiment)
    except Exception as error:  # noqa: BLE001 - MLflow's errors: one line, what was copied stays copied
        print(
            f"error: the sync stopped: {mask_text(one_line(error))[:300]}; run it again to go on "
            "(what was copied is not copied twice)",
            file=sys.stderr,
        )
        return 1
    print(
        f"sync      {len(done.copied)} run(s) copied from {mask_uris(args.source)} to {mask_uris(target)}; "
        f"{done.present} copied before"
        + (f"; {done.redone} unfinished copies made again" if done.redone else "")
        + (f"; {done.followed} brought up to date (resumed since)" if done.followed else "")
        + (f"; {done.linked} linked to their sweep's parent" if done.linked else "")
    )
    if done.running:
        print(
            f"          {len(done.running)} run(s) still RUNNING in the source are left for the next sync: "
            + ", ".join(done.running[:5])
            + ("..." if len(done.running) > 5 else "")
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
