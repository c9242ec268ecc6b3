"""seqlab's packing sweeper for Hydra: the basic sweeper, with a multirun's jobs that differ only in
packable keys launched as packs (`pack=N`; seqlab.packing). conf/hydra/default.yaml makes it the
sweeper of every multirun but a search. Hydra imports every module under `hydra_plugins` at
start-up, `train.py --help` included: nothing here imports torch, Lightning or MLflow."""
