"""Bringing your own data: the example-data script, then training on its files through the CLI."""

from __future__ import annotations

import pytest
from conftest import runs_of
from harness.inprocess import run_script
from harness.own_data import SCRIPT, _daily_load


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
