"""What tests/unit/sweeps/test_packs.py and tests/integration/test_pack_plan.py share."""

from __future__ import annotations

import itertools


def _jobs(**swept):
    keys = list(swept)
    return [
        [f"{k}={v}" for k, v in zip(keys, values)] for values in itertools.product(*swept.values())
    ]
