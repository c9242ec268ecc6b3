"""What the tests in `integration/test_sync.py` and `unit/store/test_sync.py` share (under tests/)."""

from __future__ import annotations

from conftest import ROOT

SYNC = ROOT / "scripts" / "sync.py"
