"""A run knows how it was made and can be made again (issue 36, point 2): its code (commit, dirty
flag, the uncommitted diff, untracked files by name) and environment as tags and artifacts;
`python train.py rerun=<run id>` trains it again from its recorded overrides, with its code only
(rerun_code=current to go on); `scripts/compare.py --diff A B` prints only what differs."""

from __future__ import annotations

import json
import subprocess

import mlflow
import pytest
import torch
from conftest import ROOT, TINY
from harness.inprocess import run_script

from seqlab.train import train


def _git(root, *args) -> str:
    return subprocess.run(
        ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
        check=True,
        capture_output=True,
        text=True,
    ).stdout


def _repository(root) -> str:
    """The project root as a git repository of its own: one tracked file, the outputs ignored."""
    _git(root, "init", "-q")
    (root / ".gitignore").write_text("mlruns/\nout/\nlogs/\nmultirun/\n")
    (root / "model_notes.py").write_text("WIDTH = 1\n")
    _git(root, "add", ".")
    _git(root, "commit", "-q", "-m", "first")
    return _git(root, "rev-parse", "HEAD").strip()


def _artifact(store, run_id: str, path: str, tmp_path) -> str:
    local = mlflow.artifacts.download_artifacts(
        run_id=run_id,
        artifact_path=path,
        tracking_uri=store.tracking_uri,
        dst_path=str(tmp_path / "downloaded" / run_id),
    )
    with open(local) as f:
        return f.read()


def _run_id(done) -> str:
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    return next(
        line.split()[2] for line in done.stdout.splitlines() if line.startswith("mlflow    run")
    )


def test_a_run_records_its_code_diff_untracked_names_and_environment(compose_cfg, store, tmp_path):
    head = _repository(tmp_path)
    (tmp_path / "model_notes.py").write_text("WIDTH = 2\n")  # uncommitted
    (tmp_path / "scratch.txt").write_text("UNTRACKED-CONTENTS\n")  # untracked: named, never read
    result = train(compose_cfg(*TINY))
    tags = store.get_run(result.run_id).data.tags
    assert (tags["git_commit"], tags["git_dirty"]) == (head, "true") and len(
        tags["code_digest"]
    ) == 16
    diff = _artifact(store, result.run_id, "code/diff.patch", tmp_path)
    assert "-WIDTH = 1" in diff and "+WIDTH = 2" in diff and "UNTRACKED" not in diff
    assert _artifact(store, result.run_id, "code/untracked.txt", tmp_path) == "scratch.txt\n"
    requirements = _artifact(store, result.run_id, "env/requirements.txt", tmp_path).splitlines()
    assert (
        f"torch=={torch.__version__}" in requirements
        and f"mlflow=={mlflow.__version__}" in requirements
    )
    system = json.loads(_artifact(store, result.run_id, "env/system.json", tmp_path))
    assert (
        system["torch"] == torch.__version__ and system["python"].startswith("3.") and system["cpu"]
    )


def test_rerun_trains_the_run_again_and_refuses_other_code(run_cli, store, tmp_path):
    _repository(tmp_path)
    first = _run_id(run_cli(*TINY, "optimizer.lr=0.003"))
    again = _run_id(run_cli(f"rerun={first}"))
    runs = {r: store.get_run(r) for r in (first, again)}
    assert runs[again].data.tags["rerun_of"] == first
    # Its recorded overrides, composed again: the same params (where it was stored aside), the same losses.
    assert runs[again].data.params["optimizer.lr"] == "0.003"
    assert runs[again].data.tags["hydra_overrides"] == runs[first].data.tags["hydra_overrides"]
    losses = {r: [m.value for m in store.get_metric_history(r, "train_loss")] for r in runs}
    assert len(losses[first]) == 8 and losses[again] == pytest.approx(losses[first], rel=1e-5)

    (tmp_path / "model_notes.py").write_text("WIDTH = 3\n")  # the code changed since
    refused = run_cli(f"rerun={first}")
    assert refused.returncode == 1
    (line,) = [
        x
        for x in refused.stdout.splitlines() + refused.stderr.splitlines()
        if x.startswith("error:")
    ]
    assert f"rerun={first}: the code is not the run's" in line and "rerun_code=current" in line
    assert len(store.search_runs([runs[first].info.experiment_id])) == 2  # no run opened
    anyway = _run_id(run_cli(f"rerun={first}", "rerun_code=current", "trainer.max_epochs=1"))
    tags = store.get_run(anyway).data.tags
    assert (tags["rerun_of"], tags["rerun_code"], tags["git_dirty"]) == (first, "current", "true")
    assert (
        len(store.get_metric_history(anyway, "train_loss")) == 4
    )  # this command line's key over the run's


def test_compare_diff_prints_only_what_differs(compose_cfg, store, tmp_path):
    a = train(compose_cfg(*TINY, "optimizer.lr=0.001")).run_id
    b = train(
        compose_cfg(*TINY, "optimizer.lr=0.01", "paths.output_dir=" + str(tmp_path / "out2"))
    ).run_id
    uri = f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    done = run_script(ROOT / "scripts" / "compare.py", ["--tracking-uri", uri, "--diff", a, b])
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    keys = [
        line.split()[0]
        for line in lines[lines.index(next(x for x in lines if x.startswith("key"))) + 2 :]
        if line.strip()
    ]
    keys = keys[: keys.index("metrics")]
    assert keys == ["optimizer.lr", "paths.output_dir"]  # and nothing else of the config
    row = next(x.split() for x in lines if x.startswith("final_val_rmse "))
    ra, rb = (store.get_run(r).data.metrics["final_val_rmse"] for r in (a, b))
    assert [float(v) for v in row[1:]] == pytest.approx([ra, rb, rb - ra], rel=1e-3)

    missing = run_script(
        ROOT / "scripts" / "compare.py", ["--tracking-uri", uri, "--diff", a, "0" * 32]
    )
    assert (
        missing.returncode == 1
        and missing.stderr.strip()
        == f"error: --diff: no run {'0' * 32} in the store "
        "(train.py prints a run's id: mlflow run ...)"
    )
