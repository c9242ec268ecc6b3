"""A pack's members' models logged by a process beside the training one (logger.model_worker,
tracking.model_worker): each member's run has the very models, linked metrics, tags and log lines
that logging them in the training process gives; a worker that dies leaves them to that process."""

from __future__ import annotations

import json
import os

from conftest import runs_of

from seqlab.tracking import model_worker
from seqlab.tracking.model_logging import Kept
from seqlab.tracking.model_worker import ModelsToLog, RunModels

PACK_OF_2 = [
    "-m",
    "seed=0,1",
    "pack=2",
    "data.n_samples=256",
    "data.source.n_features=8",
    "data.batch_size=32",
    "trainer.max_epochs=3",
    "logger.system_metrics=false",
]


def _models_of(store, run):
    """A run's models as its Models tab lists them: name, and the metrics each links (key, step),
    each of which is the run's own value at that step."""
    found = [
        m
        for m in store.search_logged_models(experiment_ids=[run.info.experiment_id])
        if m.source_run_id == run.info.run_id
    ]
    for m in found:
        for x in m.metrics or []:
            history = {h.step: h.value for h in store.get_metric_history(run.info.run_id, x.key)}
            assert history[x.step] == x.value, (m.name, x.key, x.step)
    return sorted((m.name, sorted((x.key, x.step) for x in m.metrics or [])) for m in found)


def test_a_packs_models_logged_beside_it_are_the_models_logged_in_it(run_cli, store, tmp_path):
    seen = {}
    for where in ("on", "off"):
        proc = run_cli(
            *PACK_OF_2,
            f"logger.model_worker={where}",
            f"logger.experiment_name={where}",
            f"logger.register_as=net-{where}",
            f"hydra.sweep.dir={tmp_path}/sweep-{where}",
        )
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, out[-3000:]
        # What logging them said (the ONNX export's line), in the job's output wherever it ran.
        assert out.count("model-onnx") >= 2, out[-3000:]
        members = {
            r.data.params["seed"]: r for r in runs_of(store, where) if "pack_id" in r.data.tags
        }
        assert set(members) == {"0", "1"}
        for seed, run in members.items():
            assert run.info.status == "FINISHED"
            # The tag the worker's registration set reached the run (through its own tracker).
            assert run.data.tags["registered_model"].startswith(f"models:/net-{where}/")
            seen[where, seed] = _models_of(store, run)
        spent = [
            json.loads(p.read_text()) for p in (tmp_path / f"sweep-{where}").glob("**/costs.json")
        ]
        assert len(spent) == 2
        # The worker's own seconds, beside this process's phases: only where it logged them.
        assert all((s["beside"].get("models", 0) > 0) == (where == "on") for s in spent), spent
    for seed in ("0", "1"):
        assert seen["on", seed] == seen["off", seed]
        assert {"model", "model-onnx"} <= {name for name, _ in seen["on", seed]}
        assert all(metrics for _, metrics in seen["on", seed])  # each links its run's metrics


class _DiesWhenUnpickled:
    """A network whose arrival ends the process it arrives in (a worker killed, out of memory)."""

    def __reduce__(self):
        return (os._exit, (3,))


def _models(network) -> ModelsToLog:
    run = RunModels("sqlite:///x.db", "1", "r1", [], "best", None, False, 0.0, os.getcwd())
    return ModelsToLog(run, network, None, Kept("last", 5), None, None, [])


def test_a_worker_that_died_leaves_the_runs_models_to_this_process(monkeypatch, caplog):
    logged_here = []

    def log_networks(run, network, *rest):
        logged_here.append(run.run_id)
        run.set_tags({"registered_model": "models:/m/1"})
        return None

    monkeypatch.setattr(model_worker, "log_networks", log_networks)
    monkeypatch.setattr(model_worker, "_WORKER", None)
    # Its start without MLflow's model flavours' imports (seconds): this worker logs nothing.
    monkeypatch.setattr(model_worker, "_start_worker", model_worker._ready)
    worker = model_worker.beside("on", 2)
    assert worker is not None and model_worker.beside("on", 2) is worker  # one a process
    done = model_worker.submit(worker, _models(_DiesWhenUnpickled())).result()
    assert logged_here == ["r1"]  # here, once the worker was gone
    assert done.tags == {"registered_model": "models:/m/1"}
    assert "the models' process ended; this run's models are logged here" in caplog.text
    # Its pool is broken: a later run's models are logged here too, and the next pack starts anew.
    assert worker.submit(_models(None)).result().tags == {"registered_model": "models:/m/1"}
    assert logged_here == ["r1", "r1"]
    fresh = model_worker.beside("on", 2)
    assert fresh is not None and fresh is not worker
    fresh.close()
    monkeypatch.setattr(model_worker, "_WORKER", None)
