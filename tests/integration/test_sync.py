"""Compute nodes without the server: runs tracked into a local store, copied into the tracking
server by scripts/sync.py, whole and once."""

from __future__ import annotations

import mlflow
from conftest import TINY, artifact_paths, runs_of
from harness.inprocess import run_script
from harness.sync import SYNC


def _by_name(client, experiment: str) -> dict:
    return {r.info.run_name: r for r in runs_of(client, experiment)}


def test_sync_copies_a_local_stores_runs_into_a_server_once(
    run_cli, store, tmp_path, mlflow_server
):
    experiment = "synced-sweep"
    proc = run_cli(
        "-m", "seed=0", *TINY, "logger.system_metrics=false", f"logger.experiment_name={experiment}"
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    local = _by_name(store, experiment)
    assert len(local) == 2  # the sweep's parent and its job
    # A job still training when the sync runs: it waits for the next one.
    still = store.create_run(
        store.get_experiment_by_name(experiment).experiment_id, run_name="still-training"
    )
    src = f"sqlite:///{tmp_path}/mlruns/mlflow.db"

    first = run_script(SYNC, ["--from", src, "--to", mlflow_server.uri, "--experiment", experiment])
    assert first.returncode == 0, first.stdout + first.stderr
    assert (
        f"sync      2 run(s) copied from {src} to {mlflow_server.uri}; 0 copied before"
        in first.stdout
    )
    assert (
        f"1 run(s) still RUNNING in the source are left for the next sync: {still.info.run_id}"
        in first.stdout
    )

    server = mlflow.MlflowClient(mlflow_server.uri)
    copied = _by_name(server, experiment)
    assert copied.keys() == local.keys()
    parent = next(r for r in copied.values() if r.data.tags.get("sweep_role") == "parent")
    for name, run in local.items():
        copy = copied[name]
        assert copy.data.tags["seqlab_synced_from"] == run.info.run_id
        assert (copy.info.status, copy.info.start_time, copy.info.end_time) == (
            run.info.status,
            run.info.start_time,
            run.info.end_time,
        )
        assert copy.data.params == run.data.params and copy.data.metrics == run.data.metrics

        def history(client, r):
            return [
                (m.step, m.value, m.timestamp)
                for m in client.get_metric_history(r.info.run_id, "train_loss")
            ]

        assert history(server, copy) == history(store, run)
        assert artifact_paths(server, copy.info.run_id) == artifact_paths(store, run.info.run_id)
        if run.data.tags.get("sweep_role") != "parent":
            assert (
                copy.data.tags["mlflow.parentRunId"] == parent.info.run_id
            )  # the parent's copy, not the source's
            # the run's network, a logged model of the copy that loads and predicts
            models = {
                m.name: m
                for m in server.search_logged_models(
                    [copy.info.experiment_id], filter_string=f"source_run_id = '{copy.info.run_id}'"
                )
            }
            assert set(models) == {"model", "model-onnx"}  # its ONNX copy too
            model = models["model"]
            files = mlflow.artifacts.download_artifacts(
                artifact_uri=model.artifact_location,
                tracking_uri=mlflow_server.uri,
                dst_path=str(tmp_path / "model" / name),
            )
            network = mlflow.pytorch.load_model(files)
            assert sum(p.numel() for p in network.parameters()) > 0

    store.set_terminated(still.info.run_id, "FINISHED")
    again = run_script(SYNC, ["--from", src, "--to", mlflow_server.uri, "--experiment", experiment])
    assert again.returncode == 0, again.stdout + again.stderr
    assert "sync      1 run(s) copied" in again.stdout and "2 copied before" in again.stdout
    assert len(runs_of(server, experiment)) == 3  # nothing twice

    # Issue 34, point 6. A run KILLED when it was synced, resumed and finished since: its copy follows
    # it (before: "present" for ever, a truncated copy). A job copied while its sweep's parent still
    # ran: linked to the parent's copy once the parent arrives (before: never).
    experiment_id = store.get_experiment_by_name(experiment).experiment_id
    from mlflow.entities import Metric

    resumed = store.create_run(experiment_id, run_name="resumed-later").info.run_id
    store.log_batch(
        resumed,
        metrics=[Metric("train_loss", 1.0 / s, 1_700_000_000_000 + s, s) for s in range(1, 4)],
    )
    store.set_terminated(resumed, "KILLED")
    sweep_parent = store.create_run(
        experiment_id, run_name="sweep-still-running", tags={"sweep_role": "parent"}
    ).info.run_id
    job = store.create_run(
        experiment_id, run_name="job-of-that-sweep", tags={"mlflow.parentRunId": sweep_parent}
    ).info.run_id
    store.set_terminated(job, "FINISHED")
    third = run_script(SYNC, ["--from", src, "--to", mlflow_server.uri, "--experiment", experiment])
    assert third.returncode == 0 and "2 run(s) copied" in third.stdout, third.stdout + third.stderr
    assert "mlflow.parentRunId" not in _by_name(server, experiment)["job-of-that-sweep"].data.tags

    store.update_run(resumed, "RUNNING")  # resume=: the same run continues
    store.log_batch(
        resumed,
        metrics=[Metric("train_loss", 1.0 / s, 1_700_000_000_100 + s, s) for s in range(4, 7)],
    )
    store.set_tag(resumed, "output_network", "last")
    store.set_terminated(resumed, "FINISHED")
    store.set_terminated(sweep_parent, "FINISHED")
    fourth = run_script(
        SYNC, ["--from", src, "--to", mlflow_server.uri, "--experiment", experiment]
    )
    assert fourth.returncode == 0, fourth.stdout + fourth.stderr
    assert (
        "1 run(s) copied" in fourth.stdout
        and "1 brought up to date (resumed since)" in fourth.stdout
    )
    assert "1 linked to their sweep's parent" in fourth.stdout, fourth.stdout
    copies = _by_name(server, experiment)
    follow = copies["resumed-later"]
    source = store.get_run(resumed)
    assert (follow.info.status, follow.info.end_time) == ("FINISHED", source.info.end_time)
    assert [m.step for m in server.get_metric_history(follow.info.run_id, "train_loss")] == [
        1,
        2,
        3,
        4,
        5,
        6,
    ]
    assert follow.data.tags["output_network"] == "last"
    assert (
        copies["job-of-that-sweep"].data.tags["mlflow.parentRunId"]
        == copies["sweep-still-running"].info.run_id
    )
    assert len(runs_of(server, experiment)) == 6  # each once
