"""What tests/unit/store/test_sync.py and tests/integration/test_sync.py share."""

from __future__ import annotations

from conftest import ROOT

SYNC = ROOT / "scripts" / "sync.py"
