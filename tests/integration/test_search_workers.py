"""Many search workers on one study: the same hparams_search command run twice at once shares the
study without failing the other's trials and stops at n_trials; a worker that died is found by
Optuna's trial heartbeat and its values run again, while another host's live trial is left alone;
one search's trials side by side through the joblib launcher."""

from __future__ import annotations

import threading
import time

import optuna
from conftest import artifact_paths, runs_of, start_cli
from harness.search import TINY, _parent_and_trials, _preset
from harness.search import _study as _the_study

LR = {"type": "float", "low": 1.0e-4, "high": 1.0e-2, "log": True}


def _study(tmp_path, name: str) -> optuna.Study:
    return optuna.load_study(study_name=name, storage=f"sqlite:///{tmp_path}/mlruns/optuna.db")


def test_two_workers_started_together_share_one_study_up_to_n_trials(tmp_path, store):
    # 4 trials: both workers take one at once (started together, each trial trains for seconds).
    preset = _preset(
        tmp_path,
        {
            "n_trials": 4,
            "study_name": "shared",
            "pruner": {"name": "none"},
            "params": {"optimizer": {"lr": LR}},
        },
    )
    workers = [start_cli(tmp_path, "-m", *preset, *TINY) for _ in range(2)]
    outs = []
    for proc in workers:
        out, err = proc.communicate(timeout=400)
        outs.append(out)
        assert proc.returncode == 0, (out + err)[-4000:]
    study = _study(tmp_path, "shared")
    states = [t.state.name for t in study.trials if t.state != optuna.trial.TrialState.WAITING]
    assert states == ["COMPLETE"] * 4  # no trial failed by the other worker, and no fifth
    ran = [
        {
            int(line.split()[1])
            for line in out.splitlines()
            if line.startswith("trial ") and " COMPLETE " in line
        }
        for out in outs
    ]
    assert ran[0] and ran[1] and not ran[0] & ran[1]  # both worked, never on the same trial
    assert ran[0] | ran[1] == {t.number for t in study.trials if t.state.name == "COMPLETE"}
    assert (
        sum("search: study 'shared': 4 complete" in out for out in outs) >= 1
    )  # the last to finish reports
    runs = [r for r in runs_of(store, "seqlab") if "optuna_trial" in r.data.tags]
    assert len(runs) == 4 and {r.info.status for r in runs} == {"FINISHED"}


def test_a_dead_workers_trial_runs_again_and_a_live_one_elsewhere_is_left_alone(run_cli, tmp_path):
    """Issue 23, and issue 34's point 1: a report is written by whichever worker ends the study, and
    where the last one died, by the next command on that study."""
    storage = optuna.storages.RDBStorage(
        f"sqlite:///{tmp_path}/mlruns/optuna.db", heartbeat_interval=1, grace_period=2
    )
    study = optuna.create_study(study_name="shared", storage=storage)
    dead, live = study.ask(), study.ask()
    for trial, host in ((dead, "node7"), (live, "node8")):  # two workers on other hosts
        trial.suggest_float("optimizer.lr", 1.0e-4, 1.0e-2, log=True)
        trial.set_user_attr("seqlab_worker", {"process_host": host, "process_pid": "4242"})
        storage.record_heartbeat(trial._trial_id)
    beating = threading.Event()

    def beat():  # node8's worker: alive, renewing its heartbeat
        while not beating.wait(0.3):
            storage.record_heartbeat(live._trial_id)

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        time.sleep(2.5)  # node7's heartbeat is now older than the grace period
        preset = _preset(
            tmp_path,
            {
                "n_trials": 2,
                "study_name": "shared",
                "pruner": {"name": "none"},
                "heartbeat_interval": 1,
                "grace_period": 2,
                "params": {"optimizer": {"lr": LR}},
            },
        )
        proc = run_cli("-m", *preset, *TINY)
        trials = {t.number: t for t in _study(tmp_path, "shared").trials}
    finally:
        beating.set()
        thread.join()
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert (
        f"trial {dead.number:<3} its worker stopped (no heartbeat): FAIL, and its values run again"
        in proc.stdout
    )
    assert trials[dead.number].state.name == "FAIL" and trials[live.number].state.name == "RUNNING"
    (retry,) = [t for t in trials.values() if t.user_attrs.get("retry_of") == dead.number]
    assert retry.state.name == "COMPLETE" and retry.params == trials[dead.number].params
    assert (
        sum(t.state.name == "COMPLETE" for t in trials.values()) == 1
    )  # with the live one: n_trials=2
    assert f"trial(s) {live.number} still train in other workers on this study" in proc.stdout
    assert "search: study" not in proc.stdout  # node8's worker finishes last and reports

    # node8's worker dies before it reports: the next command on the study fails its trial (stale),
    # runs its values again and, with nothing left elsewhere, writes the report.
    time.sleep(2.5)
    again = run_cli("-m", *preset, *TINY)
    assert again.returncode == 0, (again.stdout + again.stderr)[-4000:]
    assert (
        f"trial {live.number:<3} its worker stopped (no heartbeat): FAIL, and its values run again"
        in again.stdout
    )
    assert "search: study 'shared': 2 complete" in again.stdout


def test_a_trial_lives_while_its_job_trains_after_its_sweeper_is_gone(tmp_path, store):
    """Issue 34, point 1: the heartbeat comes from the process that trains the trial. The sweeper that
    asked for it is gone (it beat once, then nothing: an SSH hang-up); its job trains on for longer
    than the grace period, another worker's stale check leaves the trial alone, and every epoch's
    report reaches it."""
    import os

    from seqlab.store.ghosts import identity
    from seqlab.sweeps import workers

    storage = optuna.storages.RDBStorage(
        f"sqlite:///{tmp_path}/mlruns/optuna.db", heartbeat_interval=1, grace_period=2
    )
    study = optuna.create_study(study_name="lost", storage=storage)
    study.set_user_attr("seqlab_pruner", {"name": "none"})
    study.set_user_attr("seqlab_heartbeat_s", 1)  # as the search sets it
    trial = study.ask()
    lr = trial.suggest_float("optimizer.lr", 1.0e-4, 1.0e-2, log=True)
    trial.set_user_attr(
        "seqlab_worker", {**identity(), "process_pid": "999999"}
    )  # the sweeper: gone
    storage.record_heartbeat(trial._trial_id)
    env = {
        "SEQLAB_OPTUNA_STORAGE": str(storage.url),
        "SEQLAB_OPTUNA_STUDY": "lost",
        "SEQLAB_OPTUNA_TRIAL": str(trial.number),
    }
    job = start_cli(
        tmp_path,
        f"optimizer.lr={lr}",
        "data.n_samples=2000",
        "trainer.max_epochs=400",
        "trainer.max_time=00:00:00:06",
        "logger.system_metrics=false",
        env={**os.environ, **env},
    )
    try:
        deadline = time.monotonic() + 60
        while not _trial(storage, trial).intermediate_values and time.monotonic() < deadline:
            time.sleep(0.3)  # training has begun: the job reported its first epoch
        time.sleep(3)  # longer than the grace period since the sweeper's last beat
        optuna.storages.fail_stale_trials(study)  # another worker's check
        assert _trial(storage, trial).state.name == "RUNNING"
        assert not workers.worker_gone(
            _trial(storage, trial)
        )  # its sweeper is gone, its trainer is not
        out, err = job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == 0, (out + err)[-3000:]
    reports = _trial(storage, trial).intermediate_values
    (run,) = runs_of(store, "seqlab")
    assert run.info.status == "FINISHED"
    epochs = int(
        next(line for line in out.splitlines() if line.startswith("done "))
        .split(": ")[1]
        .split()[0]
    )
    assert (
        sorted(reports) == list(range(1, epochs + 1)) and epochs > 20
    )  # every epoch's report, well past the grace period
    assert "ended by its study" not in out + err


def _trial(storage, trial) -> optuna.trial.FrozenTrial:
    return storage.get_trial(trial._trial_id)


def test_trials_run_side_by_side_with_the_joblib_launcher(run_process, store, tmp_path):
    proc = run_process(
        "-m",
        "hparams_search=optuna",
        "hydra.sweeper.n_trials=2",
        "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=2",
        *TINY,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "2 trials at a time" in out and "parallel jobs log through http://127.0.0.1:" in out
    (parent,), trials = _parent_and_trials(store)
    assert [t.data.tags["optuna_trial"] for t in trials] == ["0", "1"]
    assert all(t.data.tags["mlflow.parentRunId"] == parent.info.run_id for t in trials)
    assert {t.data.tags["trial_state"] for t in trials} <= {"COMPLETE", "PRUNED"}
    from seqlab.sweeps.job import cpu_count

    share = str(max(1, cpu_count() // 2))  # each job takes its share of the cores
    assert all(t.data.tags["torch_threads"] == share for t in trials)
    assert [t.state.name for t in _the_study(tmp_path).trials] == [
        t.data.tags["trial_state"] for t in trials
    ]
    assert "search/best_config.yaml" in artifact_paths(store, parent.info.run_id)
