"""What the tests in `integration/test_pack_plan.py` and `unit/sweeps/test_packs.py` share (under
tests/)."""

from __future__ import annotations

import itertools


def _jobs(**swept):
    keys = list(swept)
    return [
        [f"{k}={v}" for k, v in zip(keys, values)] for values in itertools.product(*swept.values())
    ]
