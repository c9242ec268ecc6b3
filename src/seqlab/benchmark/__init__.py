"""Measures, run by scripts/benchmark.py:

- `throughput`: steps per second of the same model and data through a plain loop, a bare loop of
                the default's own math, perf=naive, the default and a pack (the loop's cost)
- `overhead`:   what a command spends outside training, phase by phase (`--overhead`: the run's
                bookkeeping cost, read from each run's costs.json)
"""
