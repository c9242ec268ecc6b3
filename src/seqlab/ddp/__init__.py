"""Several processes training one model (DDP).

- `ranks`:      which process this is, whether a config starts several, their process group, how they start
- `gradients`:  the fused loop's gradients averaged over the processes (in place of DDP's reducer)
- `rank_watch`: a rank that dies ends the run FAILED with one line naming it
"""
