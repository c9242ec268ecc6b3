"""Bringing your own data: the example-data script, then training on its files through the CLI."""

from __future__ import annotations

import numpy as np
from harness.inprocess import run_script
from harness.own_data import SCRIPT, _daily_load


def _xy(data):
    return data.x, data.y


def test_csv_round_trip_keeps_the_values(tmp_path):
    from seqlab.data import load_csv, synthetic_daily_load

    out = tmp_path / "d.csv"
    assert run_script(SCRIPT, [str(out), "--n-samples", "5"]).returncode == 0
    x, y = _xy(load_csv(str(out), n_samples=None, seed=0))
    x0, y0 = _xy(synthetic_daily_load(5, 0))
    np.testing.assert_allclose(x, x0, rtol=1e-5)
    np.testing.assert_allclose(y, y0, rtol=1e-5)


def test_unknown_suffix_is_refused():
    proc = run_script(SCRIPT, ["out.txt"])
    assert proc.returncode == 2 and "must end in .npz or .csv" in proc.stderr


def test_the_values_arrive_as_written_and_the_target_is_named(tmp_path):
    from seqlab.data import load_csv, load_parquet

    frame = _daily_load(6)
    frame.insert(0, "load_first", frame.pop("load"))  # the target anywhere: named
    frame.to_csv(tmp_path / "d.csv")
    frame.to_parquet(tmp_path / "d.parquet")
    for data in (
        load_csv(str(tmp_path / "d.csv"), None, 0, target="load_first"),
        load_parquet(str(tmp_path / "d.parquet"), None, 0, target="load_first"),
    ):
        np.testing.assert_allclose(
            data.x[:, 0, :], frame.drop(columns=["load_first"]).to_numpy(), rtol=1e-6
        )
        np.testing.assert_allclose(data.y[:, 0], frame["load_first"].to_numpy(), rtol=1e-6)
        assert data.columns.endswith("target 'load_first'")
    # an index named on purpose, and no index at all
    plain = frame.reset_index()  # the dates as a plain column
    plain.to_csv(tmp_path / "plain.csv", index=False)
    assert load_csv(str(tmp_path / "plain.csv"), None, 0, target="load_first").x.shape == (
        6,
        1,
        1440,
    )
    numbered = frame.reset_index(drop=True)
    numbered.insert(0, "day", range(6))
    numbered.to_csv(tmp_path / "numbered.csv", index=False)
    taken = load_csv(str(tmp_path / "numbered.csv"), None, 0, target="load_first", index_col="day")
    assert (
        taken.x.shape == (6, 1, 1440)
        and taken.columns == "index 'day' (dropped), target 'load_first'"
    )
    kept = load_csv(
        str(tmp_path / "numbered.csv"), None, 0, target="load_first"
    )  # a numeric first column is data
    assert kept.x.shape == (6, 1, 1441) and kept.columns == "target 'load_first'"
