"""Stopping cleanly and continuing, and checkpoints that survive what ends a process.

- `interrupt`:   Ctrl-C/SIGTERM stop at a step boundary with a checkpoint; resume=RUN_ID and ckpt_path=FILE checked
- `checkpoints`: the time-based checkpoint (checkpoint.interval_s); a checkpoint written whole
- `points`:      a run's resume point: the checkpoint artifact and the tag that says it is there (light to import)
"""
