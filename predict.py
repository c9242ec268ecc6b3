"""Predict with a trained network: `python predict.py run=RUN_ID data=npz data.path=new.npz`
(or model=models:/NAME/VERSION; any data group). The logic is in seqlab.predict.

Only Hydra and the config schema load here; torch and MLflow load inside the task."""

import os
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

import seqlab.schema
import seqlab.validation
from seqlab.hydra_version import VERSION_BASE, trusted_targets

os.environ.setdefault("SEQLAB_ROOT", str(Path(__file__).resolve().parent))


@hydra.main(config_path="conf", config_name="predict", **VERSION_BASE)
def main(cfg: DictConfig) -> None:
    from seqlab.predict import main as task

    task(cfg)


def cli() -> None:
    """The command line: sys.argv as `python predict.py ...` got it (tests call this in-process)."""
    # model=URI is the short form of model_uri=URI: conf/model/ is train.py's model group, and
    # Hydra would take model= as a choice in it.
    sys.argv = [
        f"model_uri={a[len('model=') :]}" if a.startswith("model=") else a for a in sys.argv
    ]
    # A misspelled key gets one line with the nearest keys, as in train.py.
    problem = seqlab.validation.unknown_key(
        sys.argv[1:], {"data", "paths", "hydra"}, seqlab.schema.PredictConfig
    )
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        sys.exit(1)
    with trusted_targets():
        main()


if __name__ == "__main__":
    cli()
