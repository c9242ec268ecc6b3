"""seqlab's Optuna 5 sweeper for Hydra (`hydra/sweeper=seqlab_optuna`, used by `hparams_search=optuna`).

Hydra imports every module under `hydra_plugins` at start-up, `train.py --help` included, so nothing
here imports Optuna, torch or MLflow at module level: the search itself lives in `seqlab.sweeps.search`."""
