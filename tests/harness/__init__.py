"""What the tests run on, beside tests/conftest.py's fixtures: a command line in this process
(inprocess) or in a process of its own forked from a warm Python (zygote), a one-node SLURM
cluster (slurm_cluster), an RMSE computed without seqlab (independent), .mat files written by hand
(matfiles), and, a module per topic, the helpers that a topic's unit and integration tests share."""
