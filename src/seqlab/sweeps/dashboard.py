"""`make dashboard`: Optuna's own dashboard (optuna-dashboard) over a search's study storage, on
loopback: the studies, their trials' values and parameters, live while a search runs. The storage
is `STORAGE=` (make's variable, handed over in the environment), else `OPTUNA_STORAGE` (as the
search's `paths.optuna_storage` reads it), else this project's `mlruns/optuna.db`. It reaches
optuna-dashboard inside this process, never on a command line, where `ps` would show a database
password to everyone on the machine.

    python -m seqlab.sweeps.dashboard [--host 127.0.0.1] [--port 8080]"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Mapping, Optional, Sequence

import optuna_dashboard

from seqlab.secrets import mask_uris
from seqlab.sweeps.study import JOURNAL, storage_for

ROOT = Path(__file__).resolve().parents[3]
STORAGE_VARIABLE = "SEQLAB_DASHBOARD_STORAGE"  # make dashboard STORAGE=... exports it as this


def storage_url(env: Mapping[str, str], root: Path) -> str:
    return (
        env.get(STORAGE_VARIABLE)
        or env.get("OPTUNA_STORAGE")
        or f"sqlite:///{root}/mlruns/optuna.db"
    )


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument(
        "--root",
        type=Path,
        default=Path(os.environ.get("SEQLAB_ROOT", ROOT)),
        help="the project whose mlruns/optuna.db is the default storage",
    )
    args = parser.parse_args(argv)
    url = storage_url(os.environ, args.root)
    for prefix in ("sqlite:///", JOURNAL):
        if url.startswith(prefix) and not Path("/" + url[len(prefix) :].lstrip("/")).exists():
            print(
                f"error: no study storage at {url}: a search makes it (python train.py -m hparams_search=optuna ...); "
                "or say which: make dashboard STORAGE=<url>",
                file=sys.stderr,
            )
            return 1

    try:
        storage = storage_for(url)
    except Exception as error:  # noqa: BLE001 - a database that refuses: one line, its password masked
        print(
            f"error: the study storage {mask_uris(url)} cannot be opened: {mask_uris(str(error)).splitlines()[0]}",
            file=sys.stderr,
        )
        return 1
    print(
        f"optuna-dashboard on http://{args.host}:{args.port}/dashboard over {mask_uris(url)} (Ctrl-C stops it)",
        flush=True,
    )
    optuna_dashboard.run_server(storage, host=args.host, port=args.port)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
