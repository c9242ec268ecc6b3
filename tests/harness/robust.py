"""What the tests in `integration/test_robust.py` and `unit/test_robust.py` share (under tests/)."""

from __future__ import annotations


class _Planted:
    """What a planted pickle would run when loaded: it leaves a file (issue 33's reproduction ran os.system)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))
