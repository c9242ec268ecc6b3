"""Bringing your own data: the example-data script, then training on its files through the CLI."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import ROOT, runs_of
from inprocess import run_script

SCRIPT = ROOT / "scripts" / "make_example_data.py"


@pytest.mark.slow
@pytest.mark.parametrize("suffix, seq_len", [("npz", 2), ("csv", 2)])
def test_example_file_trains_through_the_cli(run_cli, store, tmp_path, suffix, seq_len):
    data = tmp_path / f"example.{suffix}"
    made = run_script(SCRIPT, [str(data), "--n-samples", "120", "--seq-len", str(seq_len)])
    assert made.returncode == 0, made.stderr
    assert f"data={suffix} data.path={data}" in made.stdout

    args = [f"data={suffix}", f"data.path={data}", "trainer.max_epochs=1"]
    if suffix == "csv":
        args.append(f"data.source.seq_len={seq_len}")
    proc = run_cli(*args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"{suffix}: 96 train / 24 val samples, 2 step(s) x 1440 feature(s)" in proc.stdout
    (run,) = runs_of(store, "seqlab")
    assert run.info.status == "FINISHED"
    assert run.data.params["data.path"] == str(data)


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


@pytest.mark.parametrize(
    "write, data_line",
    [
        (
            lambda f, p: f.to_csv(p),
            "csv: 32 train / 8 val samples, 1 step(s) x 1440 feature(s), 1 response(s); "
            "index 'date' (dropped), target 'load'",
        ),
        (
            lambda f, p: f.reset_index(drop=True).to_csv(p),
            "csv: 32 train / 8 val samples, 1 step(s) x 1440 feature(s), "
            "1 response(s); index (unnamed) (dropped), target 'load'",
        ),
        (
            lambda f, p: f.to_parquet(p),
            "parquet: 32 train / 8 val samples, 1 step(s) x 1440 feature(s), 1 response(s); "
            "index 'date' (pandas' index: not a feature), target 'load'",
        ),
    ],
    ids=["csv-date-index", "csv-default-index", "parquet"],
)
@pytest.mark.slow
def test_a_frame_as_pandas_writes_it_trains_with_its_1440_readings(
    run_cli, store, tmp_path, write, data_line
):
    kind = "parquet" if "parquet" in data_line else "csv"
    path = tmp_path / f"load.{kind}"
    frame = _daily_load()
    write(frame, path)
    proc = run_cli(
        f"data={kind}", f"data.path={path}", "trainer.max_epochs=1", "data.batch_size=16"
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert data_line in proc.stdout
    (run,) = runs_of(store, "seqlab")
    assert run.info.status == "FINISHED" and run.data.params["data.name"] == kind


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


@pytest.mark.parametrize(
    "change, message",
    [
        (
            lambda f: f.assign(weekday=f.index.day_name()),
            "not a number: 'Monday' in column 'weekday', which is not numeric: drop it, make it the index (data.source.index_col=...), or encode it as numbers",
        ),
        (None, "data.source.target='price' is not a column (columns: m0000, m0001,"),
    ],
    ids=["text-column", "missing-target"],
)
@pytest.mark.slow
def test_a_table_that_does_not_fit_is_one_line(run_cli, tmp_path, change, message):
    frame = _daily_load(8)
    if change is not None:
        frame = change(frame)
    frame.to_csv(tmp_path / "d.csv")
    args = ["data=csv", f"data.path={tmp_path / 'd.csv'}", "trainer.max_epochs=1"]
    proc = run_cli(*args, *([] if change is not None else ["data.source.target=price"]))
    assert proc.returncode == 1
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], lines[-5:]
