"""What a finished search leaves on the sweep's parent run: the best trial's config
(`search/best_config.yaml`) and its override line, Optuna's plots as PNG, every trial in
`search/trials.csv`, and the verdict (best trial, and how much it beat the starting config)."""

from __future__ import annotations

import os
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import optuna
from omegaconf import DictConfig, OmegaConf

from seqlab import one_line
from seqlab.secrets import mask_text, mask_uris, masked_copy
from seqlab.sweeps.study import INTERRUPTED, SEARCH_DIR, STARTING, VERDICT_FILE, overrides_for

PLOTS = {
    "optimization_history.png": "plot_optimization_history",
    "param_importances.png": "plot_param_importances",
    "parallel_coordinate.png": "plot_parallel_coordinate",
}


@dataclass
class SearchRan:
    """What the report needs of the search that ran (seqlab.sweeps.search hands it over)."""

    objective: str
    storage_url: str
    arguments: list[str]  # the command line, without the trials' values
    sweep_dir: Path
    seconds: float  # how long this invocation ran
    compose: Callable[[list[str]], DictConfig]  # a job's config from a trial's overrides


def _duration(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes} min {secs} s" if minutes else f"{secs} s"


def plots(study: optuna.Study, out: Path) -> tuple[list[Path], list[str]]:
    import matplotlib  # the plots only, at a search's end

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # after matplotlib.use: no display here
    from optuna.visualization import matplotlib as optuna_plots  # needs matplotlib's backend first

    made, skipped = [], []
    for name, function in PLOTS.items():
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # Optuna marks its matplotlib plots experimental
                axes = getattr(optuna_plots, function)(study)
            figure = (axes.flat[0] if hasattr(axes, "flat") else axes).figure
            figure.savefig(out / name, dpi=110, bbox_inches="tight")
            plt.close(figure)
            made.append(out / name)
        except Exception as error:  # e.g. importances need two finished trials
            skipped.append(f"{name} ({one_line(error)[:120]})")
    return made, skipped


def report(search: SearchRan, study: optuna.Study, tracking: Optional[Any]) -> None:
    states = optuna.trial.TrialState
    trials = study.get_trials(deepcopy=False)
    counts = {
        s: sum(t.state == s for t in trials) for s in (states.COMPLETE, states.PRUNED, states.FAIL)
    }
    interrupted = sum(
        t.state == states.FAIL and bool(t.user_attrs.get(INTERRUPTED)) for t in trials
    )
    out = search.sweep_dir / SEARCH_DIR
    out.mkdir(parents=True, exist_ok=True)
    head = (
        f"search: study '{study.study_name}': {counts[states.COMPLETE]} complete, {counts[states.PRUNED]} pruned, "
        f"{counts[states.FAIL] - interrupted} failed"
        + (f", {interrupted} interrupted (not counted)" if interrupted else "")
        + f" trial(s); this run took {_duration(search.seconds)}"
    )
    lines = [head]
    files: list[Path] = []
    tags: dict[str, Any] = {
        "optuna_study": study.study_name,
        "optuna_storage": mask_uris(search.storage_url),
    }
    if not counts[states.COMPLETE]:
        lines.append(f"no trial completed: no best config ({search.objective} was never recorded)")
    else:
        best = study.best_trial
        run_id = best.user_attrs.get("mlflow_run_id")
        fixed = [a for a in search.arguments if not a.startswith("hparams_search=")]
        command = mask_text(
            " ".join(["python train.py", *fixed, *overrides_for(best.params)])
        )  # as typed, secrets masked
        (out / "best_overrides.txt").write_text(command + "\n")
        files.append(out / "best_overrides.txt")
        config = _best_config(search, best, run_id, tracking, out / "best_config.yaml")
        if config:
            files.append(config)
        lines += [_best_line(search.objective, best, trials, run_id), f"  {command}"]
        if config:
            lines.append(
                f"  its whole config: {config}"
                + (" (also search/best_config.yaml on the parent run)" if tracking else "")
            )
        tags.update(
            best_trial=best.number,
            best_value=f"{best.value:.6g}",
            best_overrides=" ".join(overrides_for(best.params)),
        )
    made, skipped = plots(study, out)
    files += made
    if skipped:
        lines.append("plots skipped: " + "; ".join(skipped))
    frame = study.trials_dataframe()
    frame.to_csv(out / "trials.csv", index=False)
    files.append(out / "trials.csv")
    verdict = "\n".join(lines)
    (search.sweep_dir / VERDICT_FILE).write_text(verdict + "\n")
    if tracking is None or not tracking.parent_run_id:
        print(f"\n{verdict}", flush=True)
        return
    client, parent = tracking.parent_client, tracking.parent_run_id
    for path in files:
        with masked_copy(path) as masked:  # best_config.yaml holds the resolved config
            client.log_artifact(parent, str(masked), SEARCH_DIR)
    tags["search_verdict"] = mask_text(verdict)[:5000]
    for key, value in tags.items():
        client.set_tag(parent, key, str(value))
    if counts[states.COMPLETE]:
        client.log_metric(parent, "best_objective", study.best_value)


def _best_line(
    objective: str, best: optuna.trial.FrozenTrial, trials: list, run_id: Optional[str]
) -> str:
    """The best trial, and what it gained over the starting config's trial (trial 0, the config's
    own values) where there is one to compare with."""
    starts = [t for t in trials if t.user_attrs.get(STARTING)]
    start = next((t for t in starts if t.state == optuna.trial.TrialState.COMPLETE), None)
    line = (
        f"best: trial {best.number}"
        + (f" (run trial-{best.number})" if run_id else "")
        + f", {objective} {best.value:.4g}"
    )
    if not starts:
        return (
            line
            + "; the starting config is not among the trials (it lies outside the search space): no comparison"
        )
    if start is None:
        return (
            line
            + f"; the starting config's trial ({starts[-1].number}) did not complete: no comparison"
        )
    if start.number == best.number:
        return line + ": the starting config itself; no trial beat it"
    gain = start.value - best.value
    return line + (
        f", {gain:.4g} lower than the starting config's {start.value:.4g} (trial {start.number}), "
        f"{100 * gain / start.value:.1f}% better"
    )


def _best_config(
    search: SearchRan, best: Any, run_id: Optional[str], tracking: Optional[Any], dst: Path
) -> Optional[Path]:
    """The config the best trial trained with, as its run saved it (resolved); composed again
    from the command and its values when the run is out of reach."""
    if tracking is not None and run_id:
        os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] = (
            "false"  # one small file: no progress bar
        )
        try:
            local = tracking.client.download_artifacts(
                run_id, "config.yaml", str(dst.parent / "_download")
            )
            shutil.move(local, dst)
            shutil.rmtree(dst.parent / "_download", ignore_errors=True)
            return dst
        except Exception:  # noqa: BLE001 - composed below instead
            pass
    try:
        cfg = search.compose(overrides_for(best.params))
        task = OmegaConf.masked_copy(cfg, [k for k in cfg.keys() if k != "hydra"])
        dst.write_text(mask_text(OmegaConf.to_yaml(task)))
        return dst
    except Exception:  # noqa: BLE001 - the override line still says it all
        return None
