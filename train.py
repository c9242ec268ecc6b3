"""Train the CNN-LSTM: `python train.py [key=value ...]`, or a sweep with `python train.py -m ...`.

Only Hydra, the config schema and the light task (seqlab.task) load here; torch, Lightning and
MLflow load once a job trains, so `--help` and `--cfg job` answer at once."""

import os
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

import seqlab.schema  # noqa: F401  registers the typed config schema
import seqlab.validation
from seqlab.ddp.ranks import rank_overrides
from seqlab.hydra_version import VERSION_BASE, trusted_targets
from seqlab.task import (
    main as task,
)  # light: torch, Lightning and MLflow load only for a job that trains

os.environ.setdefault("SEQLAB_ROOT", str(Path(__file__).resolve().parent))
os.environ["SEQLAB_ENTRY"] = str(Path(__file__).resolve())  # how DDP's other processes start


@hydra.main(config_path="conf", config_name="train", **VERSION_BASE)
def main(cfg: DictConfig) -> object:
    return task(cfg)


def cli() -> None:
    """The command line: sys.argv as `python train.py ...` got it (tests call this in-process)."""
    # A misspelled key gets one line with the nearest keys, a value that is not one of its key's
    # choices one line with the choices (Hydra's own messages take several lines).
    sys.argv += (
        rank_overrides()
    )  # a DDP rank: the job's overrides came in the environment, not on its command line
    groups = {p.name for p in (Path(__file__).resolve().parent / "conf").iterdir() if p.is_dir()}
    problem = seqlab.validation.unknown_key(sys.argv[1:], groups) or seqlab.validation.bad_choice(
        sys.argv[1:]
    )
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        sys.exit(1)
    with trusted_targets():
        main()


if __name__ == "__main__":
    cli()
