"""hparams_search=optuna through the real CLI: every trial a child run of the sweep's parent, the
best config and Optuna's plots on the parent, pruning, a stopped search continued by the same
command, and bad search-space entries refused in one line before anything trains."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest
from conftest import artifact_paths, cli_env, runs_of, start_cli
from harness.inprocess import run_in_process
from harness.search import TINY, _parent_and_trials, _preset, _study
from omegaconf import OmegaConf
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution


def test_a_search_records_every_trial_under_the_parent_with_the_best_config_and_plots(
    run_cli, store, tmp_path
):
    """Also issue 25's command: Hydra's sweep grammar on the command line replaces the preset's entries
    for those keys; the study holds their distributions and every trial's run records a value in them.
    (One search checked both ways: the preset's own entries for these keys are sampled by the joblib
    and PostgreSQL searches below.)"""
    proc = run_cli(
        "-m",
        "hparams_search=optuna",
        "optimizer.lr=tag(log, interval(1e-4, 1e-2))",
        "data.batch_size=choice(32,64)",
        "hydra.sweeper.n_trials=6",
        "hydra.sweeper.pruner.name=none",
        *TINY,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "Traceback" not in out
    study = _study(tmp_path)
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 6
    assert study.metric_names == [
        "best_val_rmse"
    ]  # what optuna-dashboard names its axis (make dashboard)
    for trial in study.trials:
        assert trial.distributions["optimizer.lr"] == FloatDistribution(1e-4, 1e-2, log=True)
        assert trial.distributions["data.batch_size"] == CategoricalDistribution([32, 64])
        assert trial.distributions["model.hidden_size"] == IntDistribution(
            8, 64, step=8
        )  # the preset's others stay

    (parent,), trials = _parent_and_trials(store)
    assert [t.data.tags["optuna_trial"] for t in trials] == [str(n) for n in range(6)]
    assert all(t.data.tags["mlflow.parentRunId"] == parent.info.run_id for t in trials)
    assert all(
        t.info.status == "FINISHED" and t.data.tags["trial_state"] == "COMPLETE" for t in trials
    )
    assert [t.info.run_name for t in trials] == [f"trial-{n}" for n in range(6)]
    # trial 0 is the config's own values
    first = trials[0].data.params
    assert (
        first["optimizer.lr"],
        first["data.batch_size"],
        first["model.hidden_size"],
        first["model.dropout"],
    ) == ("0.001", "64", "24", "0.1")
    for run in trials:  # in the command line's distributions
        assert 1e-4 <= float(run.data.params["optimizer.lr"]) <= 1e-2
        assert run.data.params["data.batch_size"] in ("32", "64")
    assert len({run.data.params["optimizer.lr"] for run in trials}) == 6  # sampled, not one value
    # Hydra's job records hold the sampled values, not the grammar.
    assert all("interval" not in run.data.tags["hydra_overrides"] for run in trials)

    # every run records its best validation RMSE and when it was reached
    for t in trials:
        history = store.get_metric_history(t.info.run_id, "val_rmse")
        best = min(history, key=lambda m: m.value)
        assert t.data.metrics["best_val_rmse"] == pytest.approx(best.value)
        assert t.data.metrics["best_val_rmse_step"] == best.step

    scores = {int(t.data.tags["optuna_trial"]): t.data.metrics["best_val_rmse"] for t in trials}
    best_trial = min(scores, key=scores.get)
    assert parent.data.tags["best_trial"] == str(best_trial)
    assert parent.data.metrics["best_objective"] == pytest.approx(min(scores.values()))
    assert _study(tmp_path).best_trial.number == best_trial

    files = artifact_paths(store, parent.info.run_id)
    assert {
        "search/best_config.yaml",
        "search/best_overrides.txt",
        "search/trials.csv",
        "search/optimization_history.png",
        "search/param_importances.png",
        "search/parallel_coordinate.png",
    } <= files
    local = Path(store.download_artifacts(parent.info.run_id, "search", str(tmp_path / "dl")))
    from matplotlib.image import imread

    for name in ("optimization_history.png", "param_importances.png", "parallel_coordinate.png"):
        assert imread(local / name).shape[0] > 100
    best_config = OmegaConf.load(local / "best_config.yaml")
    best_run = trials[best_trial]
    assert str(best_config.optimizer.lr) == best_run.data.params["optimizer.lr"]
    assert str(best_config.model.hidden_size) == best_run.data.params["model.hidden_size"]
    line = parent.data.tags["best_overrides"]
    assert f"model.hidden_size={best_run.data.params['model.hidden_size']}" in line.split()

    # the verdict names the best trial and compares it with the starting config
    verdict = out[out.index("search: study") :]
    assert (
        f"best: trial {best_trial} (run trial-{best_trial}), best_val_rmse {scores[best_trial]:.4g}"
        in verdict
    )
    if best_trial == 0:
        assert "the starting config itself" in verdict
    else:
        assert f"lower than the starting config's {scores[0]:.4g} (trial 0)" in verdict
    assert "python train.py" in verdict


def test_an_aggressive_pruner_stops_a_hopeless_trial_at_its_first_epoch(run_cli, store, tmp_path):
    # Trial 0 trains at the config's learning rate (0.01); a trial at 1e-7 barely moves from its
    # initial weights, so after one epoch it is worse than trial 0 was, and the median pruner
    # (after one finished trial, no warm-up) stops it there. Trials at 0.01 again equal trial 0
    # (same seed, same data) and are not pruned.
    preset = _preset(
        tmp_path,
        {
            "n_trials": 5,
            "sampler": {"name": "random", "seed": 3},
            "pruner": {"name": "median", "n_startup_trials": 1, "n_warmup_steps": 0},
            "params": {"optimizer": {"lr": {"type": "categorical", "choices": [0.01, 1.0e-7]}}},
        },
    )
    proc = run_cli(
        "-m",
        *preset,
        "optimizer.lr=0.01",
        "data.n_samples=512",
        "trainer.max_epochs=3",
        "logger.system_metrics=false",
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "Traceback" not in out

    _, trials = _parent_and_trials(store)
    pruned = [t for t in trials if t.data.tags["trial_state"] == "PRUNED"]
    assert pruned, [(t.data.params["optimizer.lr"], t.data.tags["trial_state"]) for t in trials]
    for t in pruned:
        assert t.data.params["optimizer.lr"] == "1e-07"
        assert t.info.status == "FINISHED"  # stopped on purpose, and its records are whole
        assert t.data.metrics["pruned_at_epoch"] == 1 and t.data.tags["pruned_at_epoch"] == "1"
        assert (
            len(store.get_metric_history(t.info.run_id, "val_rmse")) == 1
        )  # no epoch after the pruned one
        assert f"trial {t.data.tags['optuna_trial']} pruned at epoch 1" in out
    assert all(
        t.data.tags["trial_state"] == "COMPLETE"
        for t in trials
        if t.data.params["optimizer.lr"] == "0.01"
    )
    states = {t.number: t.state.name for t in _study(tmp_path).trials}
    assert {int(t.data.tags["optuna_trial"]) for t in pruned} == {
        n for n, s in states.items() if s == "PRUNED"
    }


def test_a_packed_search_trains_its_trials_as_packs_and_prunes_a_member_while_the_others_go_on(
    run_cli, store, tmp_path
):
    # pack=3: the search asks three trials at a time; they differ only in the learning rate, a
    # packable key, so each batch trains as one pack job. The sampler's seed draws 0.01, 1e-7,
    # 0.01 (trial 0 is the config's own) and then 1e-7, 1e-7, 0.01. Batch one has no finished
    # trial to be compared with; in batch two the median pruner stops the 1e-7 members after
    # their first epoch (worse than trials 0 and 2 were), while their pack trains its 0.01 member
    # to the end.
    preset = _preset(
        tmp_path,
        {
            "n_trials": 6,
            "sampler": {"name": "random", "seed": 0},
            "pruner": {"name": "median", "n_startup_trials": 1, "n_warmup_steps": 0},
            "params": {"optimizer": {"lr": {"type": "categorical", "choices": [0.01, 1.0e-7]}}},
        },
    )
    proc = run_cli(
        "-m",
        *preset,
        "pack=3",
        "optimizer.lr=0.01",
        "data.n_samples=512",
        "trainer.max_epochs=3",
        "logger.system_metrics=false",
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "Traceback" not in out
    assert "trials that share shapes packed 3 to a job" in out
    assert "pack      trials 0, 1, 2 train as one pack (pack 0)" in out
    assert "pack      trials 3, 4, 5 train as one pack (pack 1)" in out

    (parent,), trials = _parent_and_trials(store)
    assert [t.data.tags["optuna_trial"] for t in trials] == [str(n) for n in range(6)]
    assert all(t.data.tags["mlflow.parentRunId"] == parent.info.run_id for t in trials)
    assert all(t.info.status == "FINISHED" for t in trials)
    packs = [t.data.tags["pack_id"] for t in trials]
    assert packs[0] == packs[1] == packs[2] != packs[3] == packs[4] == packs[5]
    assert [t.data.tags["pack_member"] for t in trials] == ["0", "1", "2"] * 2
    assert [t.info.run_name for t in trials] == [f"trial-{n}" for n in range(6)]
    lrs = [t.data.params["optimizer.lr"] for t in trials]
    states = {t.number: t.state.name for t in _study(tmp_path).trials}
    assert [t.data.tags["trial_state"] for t in trials] == [states[n] for n in range(6)]

    def epochs(t):
        return len(store.get_metric_history(t.info.run_id, "val_rmse"))

    def last_step(t):
        return max(m.step for m in store.get_metric_history(t.info.run_id, "train_loss"))

    pruned = [t for t in trials if t.data.tags["trial_state"] == "PRUNED"]
    went_on = [t for t in trials[3:] if t.data.params["optimizer.lr"] == "0.01"]
    assert pruned and went_on, list(zip(lrs, states.values()))
    for t in pruned:
        assert t.data.params["optimizer.lr"] == "1e-07" and int(t.data.tags["optuna_trial"]) >= 3
        assert t.data.metrics["pruned_at_epoch"] == 1 and t.data.tags["pruned_at_epoch"] == "1"
        assert epochs(t) == 1 and last_step(t) < last_step(
            went_on[0]
        )  # its updates stopped at the pruned epoch
        # Issue 32, point 2: its run ended at its stop, as a pruned trial's alone does, while the pack trained on.
        last_loss = max(
            m.timestamp for m in store.get_metric_history(went_on[0].info.run_id, "train_loss")
        )
        assert t.info.end_time < last_loss and t.outputs.model_outputs
        assert (
            f"pruned    trial {t.data.tags['optuna_trial']} (member {t.data.tags['pack_member']}) at epoch 1 of 3"
            in out
        )
    for t in went_on:
        assert t.data.tags["trial_state"] == "COMPLETE" and epochs(t) == 3
    assert all(
        states[n] == "COMPLETE" for n in range(3)
    )  # batch one had no finished trial to be compared with
    assert "search/best_config.yaml" in artifact_paths(store, parent.info.run_id)


def test_a_search_stopped_mid_trial_continues_to_n_trials_when_run_again(tmp_path, store):
    preset = _preset(
        tmp_path,
        {
            "n_trials": 4,
            "sampler": {"name": "tpe", "seed": 0},
            "pruner": {"name": "none"},
            "params": {
                "optimizer": {"lr": {"type": "float", "low": 1.0e-4, "high": 1.0e-2, "log": True}}
            },
        },
    )
    args = [
        "-m",
        *preset,
        "data.n_samples=512",
        "trainer.max_epochs=4",
        "logger.system_metrics=false",
    ]
    proc = start_cli(tmp_path, *args, stderr=subprocess.STDOUT)
    seen = []
    try:
        for line in proc.stdout:
            seen.append(line)
            # Printed as trial 3's run opens, before it trains: from there until the run is
            # ended, a SIGTERM ends it KILLED (during training, at a step boundary).
            if line.startswith("mlflow    run") and "(trial-3)" in line:
                proc.send_signal(signal.SIGTERM)
                break
        rest, _ = proc.communicate(timeout=300)
    finally:
        proc.kill()
    out = "".join(seen) + rest
    assert proc.returncode == 143, out[-4000:]
    assert (
        "ended KILLED" in out
        and "trial 3   INTERRUPTED: not counted; the same command runs it again" in out
    )

    _, trials = _parent_and_trials(store)
    assert [(t.data.tags["optuna_trial"], t.info.status) for t in trials] == [
        ("0", "FINISHED"),
        ("1", "FINISHED"),
        ("2", "FINISHED"),
        ("3", "KILLED"),
    ]
    assert trials[3].data.tags["trial_state"] == "FAIL"
    study = _study(tmp_path)
    assert [t.state.name for t in study.trials] == ["COMPLETE", "COMPLETE", "COMPLETE", "FAIL"]

    again = run_in_process(
        [*args, f"paths.root_dir={tmp_path}"], tmp_path, cli_env()
    )  # the same command line, in this process
    assert again.returncode == 0, (again.stdout + again.stderr)[-4000:]
    assert "3 of 4 trials finished, continuing" in again.stdout
    assert "4 complete, 0 pruned, 0 failed, 1 interrupted (not counted) trial(s)" in again.stdout
    study = _study(tmp_path)
    assert [t.number for t in study.trials] == [0, 1, 2, 3, 4]
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 3 + ["FAIL", "COMPLETE"]
    assert (
        study.trials[4].params == study.trials[3].params
    )  # the interrupted trial's values, tried again
    parents, trials = _parent_and_trials(store)
    assert len(parents) == 2
    assert [t.info.status for t in trials] == ["FINISHED"] * 3 + ["KILLED", "FINISHED"]
    assert [t.data.tags["trial_state"] for t in trials] == ["COMPLETE"] * 3 + ["FAIL", "COMPLETE"]


@pytest.mark.parametrize(
    "override, expected",
    [
        (
            "+hydra.sweeper.params.model.hiden_size={type: int, low: 8, high: 16}",
            "error: hydra.sweeper.params.model.hiden_size: model.hiden_size is not a config key (model has: ",
        ),
        (
            "hydra.sweeper.params.optimizer.lr.low=0.1",
            "error: hydra.sweeper.params.optimizer.lr: empty range: low=0.1 must be below high=0.01",
        ),
        (
            "hydra.sweeper.params.optimizer.lr.low=0",
            "error: hydra.sweeper.params.optimizer.lr: a log range must stay above 0, got low=0",
        ),
        (
            "hydra.sweeper.params.model.dropout.type=beta",
            "error: hydra.sweeper.params.model.dropout: unknown distribution 'beta'; use type: float, int or categorical",
        ),
        (
            "hydra.sweeper.params.model.dropout.high=1.5",
            "error: hydra.sweeper.params.model.dropout: model.dropout=1.5 (high) does not make a valid config: "
            "model.dropout must be in [0, 1), got 1.5",
        ),
        (
            "optimizer.lr=tag(log, interval(0, 1e-2))",  # Hydra's grammar on the command line: named as typed
            "error: optimizer.lr: a log range must stay above 0, got low=0.0; raise low, or drop log: true",
        ),
        (
            "model.dropout=interval(0.0, 1.5)",
            "error: model.dropout: model.dropout=1.5 (high) does not make a valid config: model.dropout must be in [0, 1), got 1.5",
        ),
    ],
    ids=[
        "unknown-key",
        "empty-range",
        "log-through-zero",
        "unknown-distribution",
        "out-of-schema",
        "grammar-log-through-zero",
        "grammar-out-of-schema",
    ],
)
def test_a_bad_search_space_entry_gets_one_line_before_anything_trains(
    run_cli, store, override, expected
):
    proc = run_cli("-m", "hparams_search=optuna", override, *TINY)
    assert proc.returncode == 1
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(expected), lines
    _, trials = _parent_and_trials(store)
    assert trials == []


def test_an_unreachable_study_database_is_one_line_with_its_password_masked(run_cli, store):
    # Issue 24, point 8: a PostgreSQL study whose server is down (nothing listens on the port).
    from seqlab.store.server import free_port

    url = f"postgresql+psycopg://bob:pg-pass-4711@127.0.0.1:{free_port()}/optuna"
    proc = run_cli("-m", "hparams_search=optuna", f"paths.optuna_storage={url}", *TINY)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    assert "Traceback" not in out and "pg-pass-4711" not in out
    (line,) = [line for line in out.splitlines() if line.startswith("error: ")]
    assert line.startswith(
        "error: hydra.sweeper.storage=postgresql+psycopg://bob:***@127.0.0.1:"
    ), line
    assert "Connection refused" in line and "check that its server is up" in line, line
    assert [r.info.status for r in runs_of(store, "seqlab") if r.info.status == "RUNNING"] == []


def test_a_search_on_a_postgresql_study_that_wants_a_password_shows_and_records_none(
    postgres, run_cli, store, tmp_path
):
    # Issue 24, point 6: the study's URL was printed and stored as the optuna_storage tag, and
    # went to every trial's command line; the password must appear nowhere.
    from conftest import POSTGRES_PASSWORD

    url = postgres.replace("postgresql://", "postgresql+psycopg://").replace("/mlflow", "/optuna")
    proc = run_cli(
        "-m",
        "hparams_search=optuna",
        f"paths.optuna_storage={url}",
        "hydra.sweeper.n_trials=2",
        "hydra.sweeper.pruner.name=none",
        *TINY,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert POSTGRES_PASSWORD not in out
    assert "in postgresql+psycopg://seqlab:***@127.0.0.1:" in out
    (parent,), trials = _parent_and_trials(store)
    assert len(trials) == 2 and parent.data.tags["optuna_storage"].startswith(
        "postgresql+psycopg://seqlab:***@"
    )
    for run in [parent, *trials]:
        assert [
            k for k, v in {**run.data.params, **run.data.tags}.items() if POSTGRES_PASSWORD in v
        ] == []
        downloaded = Path(
            store.download_artifacts(run.info.run_id, "", str(tmp_path / "dl" / run.info.run_id))
        )
        files = [p for p in downloaded.rglob("*") if p.is_file()]
        assert (
            files and [p.name for p in files if POSTGRES_PASSWORD.encode() in p.read_bytes()] == []
        )
    # The trials reached the study through the environment, not their command lines.
    overrides = list((tmp_path / "logs").rglob("overrides.yaml"))
    assert overrides and [p for p in overrides if "SEQLAB_OPTUNA_STORAGE" in p.read_text()] == []
