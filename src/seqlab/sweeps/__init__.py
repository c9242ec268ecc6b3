"""Many jobs of one command (multirun) and what they answer together. Light to import: Hydra
builds the sweep callback in every multirun, and every job asks whether it is a search's trial.

- `callback`:      the Hydra callback: a parent run per sweep, the summary, a parallel sweep's server, resume=latest
- `job`:           what a job knows of its sweep (`sweep.json` as `SweepInfo`) and what it leaves (`JobResult`)
- `summary`:       the end-of-sweep table and CSV from the jobs' result files
- `runs`, `verdict`, `compare`: runs read back; repeats grouped with intervals and the verdict; table and plots
- `stats`:         n, mean, sd, 95% Student-t interval; Welch's t-test: ahead, or tied within noise
- `search`, `search_report`: hparams_search: the study's trials launched and told; the best config and verdict
- `study`:         what the search and its trials share: the space, sampler, pruner, storage, attribute names
- `trial`, `pruning`: a trial as its job sees it; the callback that reports epochs and stops a pruned one
- `optuna_private`: every use of Optuna's private API, behind a version check
"""
