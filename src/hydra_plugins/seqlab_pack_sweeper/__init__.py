"""seqlab's packing sweeper for Hydra: the basic sweeper, with a multirun's jobs that differ only in
packable keys launched as packs (`pack=N`; seqlab.packing). It takes the place of Hydra's own
`hydra/sweeper=basic` (the default of every multirun; see sweeper.py), so that a preset that picks
another sweeper (hparams_search=optuna) replaces it as it would Hydra's. Hydra imports every module
under `hydra_plugins` at start-up, `train.py --help` included: nothing here imports torch,
Lightning or MLflow."""
