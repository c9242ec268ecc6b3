"""Bringing your own data: the example-data script, then training on its files through the CLI."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import ROOT, runs_of
from inprocess import run_script

SCRIPT = ROOT / "scripts" / "make_example_data.py"


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
