"""What the tests in `integration/test_own_data.py` and `unit/data/test_tables.py` share (under
tests/)."""

from __future__ import annotations

from conftest import ROOT

SCRIPT = ROOT / "scripts" / "make_example_data.py"


# -- tables as pandas writes them (issue 25) ----------------------------------------------------------
def _daily_load(days: int = 40):
    """Daily load data in its usual shape: a row a day (dates as the index), 1440 minute readings
    and the day's target."""
    import pandas as pd

    from seqlab.data import synthetic_daily_load

    data = synthetic_daily_load(days, 0)
    frame = pd.DataFrame(
        data.x[:, 0, :],
        columns=[f"m{i:04d}" for i in range(1440)],
        index=pd.date_range("2024-01-01", periods=days, freq="D", name="date"),
    )
    frame["load"] = data.y[:, 0]
    return frame
