"""Hyperparameter search with Optuna, run by the seqlab_optuna Hydra sweeper (`hparams_search=optuna`).

The sweeper process owns the study: it checks its settings and the search space (against the
config it samples: seqlab.sweeps.search_space), asks the study for trials, launches them through
Hydra's launcher (one job per trial, batches of n_jobs side by side), reads each trial's objective
from its MLflow run and tells the study (seqlab.sweeps.search_outcomes). Each job reports its epochs to its trial
and asks the pruner itself (seqlab.sweeps.trial). The study lives in a database (paths.optuna_storage), so
the same command run again continues it; at the end the sweep's parent run gets the best config,
a ready override line, Optuna's plots and the verdict."""

from __future__ import annotations

import hashlib
import json
import signal
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import optuna
from omegaconf import DictConfig, OmegaConf

from seqlab import SeqlabError, one_line
from seqlab.secrets import mask_text, mask_uris
from seqlab.sweeps import optuna_private, workers
from seqlab.sweeps.job import SweepInfo, cpu_count
from seqlab.sweeps.packs import PackPlan, key_of, pack_launches, pack_size, why_unpackable
from seqlab.sweeps.refill import check_refill, refill_settings, refilled_trials, refilled_under
from seqlab.sweeps.search_outcomes import tell, tell_interrupted
from seqlab.sweeps.search_report import SearchRan, report
from seqlab.sweeps.search_runs import Tracking
from seqlab.sweeps.search_space import check_against_config, starting_point
from seqlab.sweeps.space import flatten_space, parse_space, split_arguments
from seqlab.sweeps.study import (
    STARTING,
    SearchError,
    make_pruner,
    make_sampler,
    overrides_for,
    storage_for,
)
from seqlab.sweeps.trial import ENV_TRIAL, study_environment

OBJECTIVES = ("best_val_rmse", "final_val_rmse")
SAMPLERS = ("tpe", "random")
PRUNERS = ("median", "hyperband", "none")


class Search:
    """One invocation of the search: continues the study up to n_trials finished trials."""

    def __init__(
        self,
        sweeper: Any,
        arguments: Sequence[str],
        *,
        objective: str,
        n_trials: int,
        n_jobs: Optional[int],
        study_name: Optional[str],
        storage: Optional[str],
        sampler: DictConfig,
        pruner: DictConfig,
        params: DictConfig,
        heartbeat: tuple[int, int] = (30, 120),
        refill: bool = False,
    ) -> None:
        self.sweeper = sweeper
        self.config: DictConfig = sweeper.config
        self.objective = objective
        self.n_trials = n_trials
        self.n_jobs = n_jobs
        self.study_name = study_name
        self.storage_url = storage
        self.heartbeat = heartbeat  # (interval s, grace period s) of the trials this worker runs (seqlab.sweeps.workers)
        self.sampler_spec = OmegaConf.to_container(sampler, resolve=True)
        self.pruner_spec = OmegaConf.to_container(pruner, resolve=True)
        self.arguments = list(arguments)
        self.params = flatten_space(
            OmegaConf.to_container(params, resolve=True) if params is not None else {}
        )
        self.swept_here: set[str] = set()
        self.sweep_dir = Path(self.config.hydra.sweep.dir)
        self.job_idx = 0
        self.in_flight: list[optuna.trial.Trial] = []
        self.pack: Optional[int] = (
            None  # pack=N: trials that share shapes train N to a job (seqlab.packing)
        )
        self.packs: list[list[list[str]]] = []  # every pack launched so far: the sweep's packs.json
        self.refill = refill  # a pack's freed slots go to the next trials (seqlab.sweeps.refill)
        self.stop_signal: Optional[int] = None
        self.started = time.monotonic()

    # -- checks, before anything trains ----------------------------------------------------
    def check(self) -> dict[str, optuna.distributions.BaseDistribution]:
        # The command line's sweeps (`optimizer.lr=tag(log, interval(1e-4, 1e-2))`, `data.batch_size=32,64`)
        # join the space, over hydra.sweeper.params' entry for the same key; every trial takes the rest.
        self.arguments, swept = split_arguments(self.arguments)
        self.params.update(swept)
        self.swept_here = set(swept)  # named as the command line's, not the preset's, in an error
        if self.objective not in OBJECTIVES:
            raise SearchError(
                f"hydra.sweeper.objective must be one of {', '.join(OBJECTIVES)}; got {self.objective!r}"
            )
        if not isinstance(self.n_trials, int) or self.n_trials < 1:
            raise SearchError(
                f"hydra.sweeper.n_trials must be a positive integer, got {self.n_trials}"
            )
        if self.sampler_spec.get("name") not in SAMPLERS:
            raise SearchError(
                f"hydra.sweeper.sampler.name must be one of {', '.join(SAMPLERS)}; got {self.sampler_spec.get('name')!r}"
            )
        if self.pruner_spec.get("name") not in PRUNERS:
            raise SearchError(
                f"hydra.sweeper.pruner.name must be one of {', '.join(PRUNERS)}; got {self.pruner_spec.get('name')!r}"
            )
        if self.config.get("replicas", 1) != 1:
            raise SearchError(
                "replicas= repeats a multirun's jobs; a search packs its trials with pack=N"
            )
        try:
            self.pack = pack_size(self.config.get("pack"))
        except SeqlabError as error:
            raise SearchError(str(error)) from None
        if not self.storage_url:
            raise SearchError(
                "hydra.sweeper.storage is null: give the study a database URL (the preset's is "
                "paths.optuna_storage, an SQLite file next to the MLflow store)"
            )
        space = parse_space(self.params, self.swept_here)
        check_against_config(space, self.config, self.compose, self.swept_here)
        if self.refill is not False:
            check_refill(self.refill, self.pack, space, self.compose([]))
        return space

    def compose(self, overrides: Sequence[str]) -> DictConfig:
        """A job's config: this command's arguments and `overrides`, composed as the launcher composes it."""
        return self.sweeper.hydra_context.config_loader.load_sweep_config(
            self.config, [*self.arguments, *overrides]
        )

    # -- the study ---------------------------------------------------------------------------
    def _name(self) -> str:
        """Runs of the same command share a study; another search space or other fixed overrides
        get their own (the number of trials, the launcher, hydra.* settings and pack= do not count)."""
        if self.study_name:
            return self.study_name
        fixed = sorted(
            a for a in self.arguments if not a.startswith("paths.") and key_of(a) != "pack"
        )
        digest = hashlib.sha1(
            json.dumps([self.objective, self.params, fixed], sort_keys=True, default=str).encode()
        )
        return f"{self.config.logger.experiment_name}-{digest.hexdigest()[:8]}"

    def _batch_size(self) -> int:
        if self.n_jobs:
            return max(1, int(self.n_jobs))
        launcher = self.config.hydra.launcher
        target = launcher.get("_target_", "")
        if "joblib" in target:
            n = int(launcher.get("n_jobs") or 1)
            return n if n > 0 else max(1, cpu_count() + 1 + n)
        if "submitit" in target:
            return max(1, int(launcher.get("array_parallelism") or 1))
        return 1

    def _open(self, space: Mapping[str, Any], batch: int) -> optuna.Study:
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        # Heartbeats with ask/tell: this process renews them itself (seqlab.sweeps.workers), which
        # Optuna's warnings (meant for study.optimize, and "experimental" since 2.9) do not know.
        warnings.filterwarnings(
            "ignore", message=r".*Heartbeat of storage is supposed to be used with Study.optimize"
        )
        warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
        storage = storage_for(self.storage_url, (*self.heartbeat, workers.retry_stale))
        name = self._name()
        found = [
            s
            for s in optuna.get_all_study_summaries(storage, include_best_trial=False)
            if s.study_name == name
        ]
        existing = found[0].n_trials if found else 0
        seed = self.sampler_spec.get("seed")
        # A resumed study draws on from where it stopped, not the same values again.
        seed = None if seed is None else int(seed) + existing
        study = optuna.create_study(
            study_name=name,
            storage=storage,
            direction="minimize",
            load_if_exists=True,
            sampler=make_sampler(self.sampler_spec, seed, batch > 1),
            pruner=make_pruner(self.pruner_spec),
        )
        study.set_user_attr(
            "seqlab_pruner", self.pruner_spec
        )  # each job builds the pruner from these
        study.set_user_attr("seqlab_objective", self.objective)
        with warnings.catch_warnings():  # "experimental" since Optuna 3.2, unchanged since
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names(
                [self.objective]
            )  # optuna-dashboard's axis: best_val_rmse, not "Objective 0"
        if getattr(
            storage, "heartbeat_interval", None
        ):  # the trials' trainers beat at the search's interval
            study.set_user_attr(workers.HEARTBEAT, self.heartbeat[0])
        return study

    def _finished(self, study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
        """Trials that ended and count toward n_trials (not one interrupted, nor one whose worker died)."""
        trials = study.get_trials(deepcopy=False)
        again = workers.retried(trials)
        return [t for t in trials if t.state.is_finished() and workers.holds_slot(t, again)]

    def _prepare(self, study: optuna.Study, space: Mapping[str, Any]) -> None:
        """Trial 0 is the config's own values; trials a stop interrupted, or whose worker died, run
        again with theirs. Other workers' live trials are left alone (seqlab.sweeps.workers)."""
        workers.retry_interrupted(study, set(space))
        start, outside = starting_point(space, self.config)
        if outside:
            print(
                f"search    the starting config's {', '.join(outside)} lies outside the search space: trial 0 samples "
                "that part, and the verdict makes no comparison with the starting config",
                flush=True,
            )
        if start:
            study.enqueue_trial(start, user_attrs={STARTING: not outside}, skip_if_exists=True)

    # -- running trials ----------------------------------------------------------------------
    def _on_sigterm(self, signum: int, frame: Any) -> None:
        # While a job trains in this process, Lightning's handler runs first and stops it at a
        # step boundary, then calls this one (it keeps handlers it finds): only note it then.
        if signal.getsignal(signal.SIGTERM) is not self._sigterm_handler:
            self.stop_signal = signum
            return
        raise SystemExit(128 + signum)

    def run(self) -> list:
        try:
            space = self.check()
        except SearchError as error:
            print(f"error: {error}", flush=True)
            raise SystemExit(1) from None
        batch = self._batch_size()
        try:
            study = self._open(space, batch * (self.pack or 1))  # trials asked together
            self._prepare(study, space)
        except Exception as error:  # noqa: BLE001 - SQLAlchemy's and the driver's errors: one line, the password masked
            print(
                f"error: hydra.sweeper.storage={mask_uris(self.storage_url)}: the study's database cannot be used: "
                f"{mask_text(one_line(error))[:300]}; check that its server is up and the URL, user and database are right",
                flush=True,
            )
            raise SystemExit(1) from None
        # The jobs reach the study through this process's environment, which every launcher passes
        # on (in-process, joblib's workers, SLURM's --export=ALL): not on their command lines,
        # which Hydra prints and stores (.hydra/overrides.yaml), as a URL with a password would be.
        restore_environment = study_environment(
            self.storage_url,
            study.study_name,
            # a pack job asks the study for the trials that take its freed slots
            refill_settings(self.n_trials, space, self.sampler_spec) if self.refill else None,
        )
        tracking = self._tracking()
        self._say_start(study, batch)
        self._sigterm_handler = self._on_sigterm
        previous = None
        if threading.current_thread() is threading.main_thread():
            previous = signal.signal(signal.SIGTERM, self._sigterm_handler)
        returns = []
        beats = workers.Heartbeats(optuna_private.storage_of(study))
        try:
            while True:
                batch_returns = self._one_batch(study, space, batch, tracking, beats)
                if batch_returns is None:
                    break
                returns.append(batch_returns)
                self.in_flight = []
                beats.watch([])
                if self.stop_signal is not None:
                    raise SystemExit(128 + self.stop_signal)
                optuna.storages.fail_stale_trials(
                    study
                )  # a worker that died meanwhile: its trial runs again
        except BaseException as error:
            # With the trials this batch's pack jobs took into freed slots (hydra.sweeper.refill).
            refilled = refilled_under(self.sweep_dir, study) if self.refill else []
            tell_interrupted(study, self.in_flight + refilled, tracking)
            self.in_flight = []
            if isinstance(error, KeyboardInterrupt):
                raise SystemExit(130) from None
            raise
        finally:
            beats.stop()
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
            restore_environment()
        elsewhere = workers.running_elsewhere(study)
        if elsewhere:  # the worker that finishes last writes the report, with every trial in it
            print(
                f"search    trial(s) {', '.join(map(str, elsewhere))} still train in other workers on this study: "
                "the last of them to finish writes the report",
                flush=True,
            )
            return returns

        ran = SearchRan(
            self.objective,
            self.storage_url,
            self.arguments,
            self.sweep_dir,
            time.monotonic() - self.started,
            self.compose,
        )
        report(ran, study, tracking)
        return returns

    def _say_start(self, study: optuna.Study, batch: int) -> None:
        """The line that says what this run of the search does."""
        done = len(self._finished(study))
        progress = (
            f"{done} of {self.n_trials} trials finished{', continuing' if done else ''}"
            if done < self.n_trials
            else f"{done} trials finished, n_trials={self.n_trials}: nothing to run (raise hydra.sweeper.n_trials for more)"
        )
        print(
            f"search    study '{study.study_name}' in {mask_uris(self.storage_url)}: {progress}; objective {self.objective} (minimised), sampler "
            f"{self.sampler_spec.get('name')} (seed {self.sampler_spec.get('seed')}), pruner {self.pruner_spec.get('name')}"
            + (f", {batch} trials at a time" if batch > 1 else "")
            + (f", trials that share shapes packed {self.pack} to a job" if self.pack else "")
            + (", a pack's freed slots refilled" if self.refill else ""),
            flush=True,
        )

    def _one_batch(
        self,
        study: optuna.Study,
        space: Mapping[str, Any],
        batch: int,
        tracking: Optional["Tracking"],
        beats: workers.Heartbeats,
    ) -> Optional[list]:
        """Ask for the trials of one batch (as many as are free, up to the batch), launch them and
        tell the study how each ended; the launcher's returns, or None when no slot is left."""
        free = workers.free_slots(study, self.n_trials)  # other workers' running trials hold theirs
        if free <= 0:
            return None
        trials = [study.ask(space) for _ in range(min(batch * (self.pack or 1), free))]
        for t in trials:
            workers.taken(t)
        beats.watch(trials)
        trials = workers.settle(
            study, trials, self.n_trials
        )  # a duplicate retry, or past n_trials: not run here
        if not trials:
            return None
        self.in_flight = trials
        overrides = [self._trial_overrides(study, t) for t in trials]
        for t in trials:
            shown = {
                k: float(f"{v:.4g}") if isinstance(v, float) else v for k, v in t.params.items()
            }
            print(f"trial {t.number:<3} {' '.join(overrides_for(shown))}", flush=True)
        launches = self._launches(overrides, trials)
        batch_returns = self.sweeper.launcher.launch(
            [args for args, _ in launches], initial_job_idx=self.job_idx
        )
        self.job_idx += len(batch_returns)
        told = [
            (trials[i], ret, k if len(which) > 1 else None)
            for (_, which), ret in zip(launches, batch_returns)
            for k, i in enumerate(which)
        ] + refilled_trials(study, batch_returns)  # those its pack jobs took into freed slots
        for t, ret, member in sorted(told, key=lambda told: told[0].number):
            outcome = tell(study, t, ret, tracking, self.objective, member)
            # A pruned trial's value is its last reported val_rmse, not the objective.
            measure = "val_rmse" if outcome.state == "PRUNED" else self.objective
            print(
                f"trial {outcome.number:<3} {outcome.state:<8} {measure} "
                f"{'-' if outcome.value is None else f'{outcome.value:.4g}'}  run {outcome.run_name or '-'}"
                + (f"  ({outcome.note})" if outcome.note else ""),
                flush=True,
            )
        return batch_returns

    def _launches(
        self, overrides: list[list[str]], trials: list[optuna.trial.Trial]
    ) -> list[tuple[list[str], list[int]]]:
        """What the launcher runs for this batch of trials: each launch's overrides and the trials
        (places in `overrides`) it trains. With pack=N, trials whose overrides differ only in
        packable keys train as packs of at most N (seqlab.sweeps.packs, as a multirun's jobs do),
        each pack one job whose members report to their own trials; the others one a job."""
        if self.pack is None:
            return [(args, [i]) for i, args in enumerate(overrides)]
        loader = self.sweeper.hydra_context.config_loader
        first = len(self.packs)
        launches, notes = pack_launches(
            overrides,
            self.pack,
            lambda args: why_unpackable(loader.load_sweep_config(self.config, args)),
            self.packs,
        )
        packed = [which for _, which in launches if len(which) > 1]
        for n, which in enumerate(packed, first):
            notes.append(
                f"pack      trials {', '.join(str(trials[i].number) for i in which)} train as one pack (pack {n})"
            )
        if notes:
            print("\n".join(notes), flush=True)
        if self.packs:
            PackPlan(self.packs).write(
                self.sweep_dir
            )  # before the launch: each pack job reads its members there
        return launches

    def _trial_overrides(self, study: optuna.Study, trial: optuna.trial.Trial) -> list[str]:
        return [
            *self.arguments,
            *overrides_for(trial.params),
            f"logger.run_name=trial-{trial.number}",
            f"++hydra.job.env_set.{ENV_TRIAL}={trial.number}",  # the study: this process's environment (run)
        ]

    def _tracking(self) -> Optional["Tracking"]:
        sweep = SweepInfo.read(self.sweep_dir)
        if sweep.tracking_uri is None:  # the sweep callback is not configured: no MLflow parent run
            return None
        return Tracking(sweep)
