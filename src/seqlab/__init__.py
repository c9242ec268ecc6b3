"""seqlab: config-driven CNN-LSTM experiments tracked in MLflow.

Importing the package is cheap on purpose (no torch, Lightning or MLflow): the CLI's start-up
path (`train.py --help`, `--cfg job`) goes through here.
"""

__version__ = "0.1.0"


class SeqlabError(Exception):
    """A problem the user can fix: printed as one line, never as a traceback."""
