"""The checks a config gets before anything trains: a command line's unknown key or bad choice in one
line (`unknown_key`, `bad_choice`: the entry points call them before Hydra, whose own refusals take
several lines), then ranges and what depends on several keys (`validate`, `validate_predict`). The
keys and their defaults are in seqlab.schema. Light imports only: this runs on the CLI's start-up path."""

from __future__ import annotations

import dataclasses
import difflib
from enum import StrEnum
from pathlib import Path
from typing import Any, Optional

from omegaconf import DictConfig

from seqlab import schema as schema_module
from seqlab.schema import CUDA_GRAPH, PRECISIONS, ConfigError, TrainConfig, choice


def unknown_key(overrides: list[str], groups: set[str], schema: Any = None) -> Optional[str]:
    """The first `key=value` on the command line whose key the schema does not have, as one line with
    the nearest keys (Hydra's refusal has none); None if all are known. Keys under untyped nodes
    (optimizer.*, data.source.*, trainer.extra.*), `+`/`~` overrides and hydra.* are left to Hydra, and so
    is every key when the command line names another config or folder; `groups`: conf/'s groups."""
    other_sources = (
        "-cd",
        "--config-dir",
        "-cp",
        "--config-path",
        "-cn",
        "--config-name",
        "hydra.searchpath",
    )
    if any(
        arg.split("=", 1)[0] in other_sources or arg.startswith("+hydra.searchpath")
        for arg in overrides
    ):
        return None  # configs from elsewhere may add groups and keys: Hydra checks them
    for override in overrides:
        key = override.partition("=")[0]
        if "=" not in override or override.startswith(("-", "+", "~")) or "/" in key or "@" in key:
            continue
        parts = key.split(".")
        if parts[0] == "hydra" or (len(parts) == 1 and parts[0] in groups):
            continue
        node: Any = schema or TrainConfig  # predict.py passes PredictConfig
        for depth, part in enumerate(parts):
            fields = {f.name: f for f in dataclasses.fields(node)}
            if part not in fields:
                known = sorted(fields) + (sorted(groups - set(fields)) if depth == 0 else [])
                prefix = ".".join(parts[:depth])
                near = difflib.get_close_matches(part, known, n=1)
                where = f"{prefix} has" if prefix else "the keys are"
                hint = f"; did you mean {'.'.join([*parts[:depth], near[0]])}?" if near else ""
                return f"{key} is not a config key{hint} ({where}: {', '.join(known)})"
            field_type = (
                fields[part].default_factory
                if fields[part].default_factory is not dataclasses.MISSING
                else None
            )
            if not (isinstance(field_type, type) and dataclasses.is_dataclass(field_type)):
                break  # a value, or an untyped node whose keys Hydra checks
            node = field_type
    return None


def bad_choice(overrides: list[str]) -> Optional[str]:
    """The first `key=value` on the command line whose key has choices (an Enum field) and whose
    value is not one of them, as one line naming the choices; None if all are fine. Hydra would
    refuse it too, in a message of several lines. Sweep lists (a,b) are checked value by value."""

    for override in overrides:
        key, _, value = override.partition("=")
        if (
            not value
            or override.startswith(("-", "+", "~"))
            or "/" in key
            or "@" in key
            or value[:1] in "[{$"
        ):
            continue
        node: Any = TrainConfig
        for part in key.split("."):
            fields = (
                {f.name: f for f in dataclasses.fields(node)}
                if dataclasses.is_dataclass(node)
                else {}
            )
            if part not in fields:
                node = None
                break
            f = fields[part]
            node = f.default_factory if f.default_factory is not dataclasses.MISSING else f.type
        enum = (
            vars(schema_module).get(node) if isinstance(node, str) else node
        )  # annotations are strings here
        if isinstance(enum, type) and issubclass(enum, StrEnum):
            for one in value.split(","):
                try:
                    choice(enum, one.strip(), key)
                except ConfigError as error:
                    return str(error)
    return None


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def validate(cfg: DictConfig) -> None:
    """Check ranges and what depends on several keys (an Enum field's choices were checked at
    compose time); raise ConfigError with one line naming the key and the fix."""
    _check_start(cfg)
    _check_data(cfg.data)
    _check_model(cfg)
    _check_perf(cfg.perf)
    _check_trainer(cfg.trainer)
    _check_optimizer(cfg)
    _check_metrics_and_logger(cfg)


def _check_start(cfg: DictConfig) -> None:
    _require(
        cfg.replicas >= 1,
        f"replicas must be a positive integer (1: one network a job), got {cfg.replicas}",
    )
    _require(
        cfg.checkpoint.interval_s >= 0,
        f"checkpoint.interval_s must be >= 0 seconds (0: off), got {cfg.checkpoint.interval_s}",
    )
    _require(
        not (cfg.resume and cfg.ckpt_path),
        "resume=RUN_ID and ckpt_path=FILE are two ways to say where to continue from: give one",
    )
    if cfg.ckpt_path:
        _require(Path(cfg.ckpt_path).is_file(), f"ckpt_path={cfg.ckpt_path}: no such file")


def _check_data(d: DictConfig) -> None:
    _require(d.batch_size > 0, f"data.batch_size must be a positive integer, got {d.batch_size}")
    _require(
        d.n_samples is None or d.n_samples > 0,
        f"data.n_samples must be positive (or null for all), got {d.n_samples}",
    )
    _require(
        0.0 <= d.val_fraction < 1.0, f"data.val_fraction must be in [0, 1), got {d.val_fraction}"
    )
    if "path" in d.source:
        path = d.path
        _require(path not in (None, "???"), f"data={d.name} needs a file: add data.path=FILE")
        _require(Path(path).is_file(), f"data.path={path}: no such file")


def _check_model(cfg: DictConfig) -> None:
    m, u = cfg.model, cfg.module
    for key in ("filters", "kernel_size", "hidden_size"):
        _require(m[key] > 0, f"model.{key} must be a positive integer, got {m[key]}")
    _require(0.0 <= m.dropout < 1.0, f"model.dropout must be in [0, 1), got {m.dropout}")
    _require(
        u.l2_regularization >= 0,
        f"module.l2_regularization must be >= 0, got {u.l2_regularization}",
    )
    _require(
        u.gradient_threshold is None or u.gradient_threshold > 0,
        f"module.gradient_threshold must be positive (or null for none), got {u.gradient_threshold}",
    )
    _require(
        u.validation_patience is None or u.validation_patience > 0,
        f"module.validation_patience must be a positive integer (or null: never stop early), got {u.validation_patience}",
    )


def _check_perf(p: DictConfig) -> None:
    _require(
        str(p.cuda_graph).lower() in CUDA_GRAPH,  # YAML reads a bare off/on as a bool
        f"perf.cuda_graph must be one of {', '.join(CUDA_GRAPH)}; got {p.cuda_graph!r}",
    )
    _require(
        p.steps_per_call > 0,
        f"perf.steps_per_call must be a positive integer, got {p.steps_per_call}",
    )
    _require(
        p.checkpoint_every_n_epochs >= 0,
        f"perf.checkpoint_every_n_epochs must be >= 0 (0: only at the end), got {p.checkpoint_every_n_epochs}",
    )
    _require(p.profile_steps >= 0, f"perf.profile_steps must be >= 0, got {p.profile_steps}")
    _require(
        p.threads is None or p.threads > 0,
        f"perf.threads must be a positive integer (or null: one per core), got {p.threads}",
    )


def _check_trainer(t: DictConfig) -> None:
    _require(t.num_nodes > 0, f"trainer.num_nodes must be positive, got {t.num_nodes}")
    _require(
        str(t.precision) in PRECISIONS,
        f"trainer.precision must be one of {', '.join(PRECISIONS)}; got {t.precision!r}",
    )
    _require(
        t.max_epochs > 0 or t.max_steps > 0,
        f"trainer.max_epochs must be positive, got {t.max_epochs}",
    )
    _require(
        t.check_val_every_n_epoch is not None or t.val_check_interval is not None,
        "trainer.check_val_every_n_epoch=null needs trainer.val_check_interval=N (iterations)",
    )
    _require(
        t.max_steps == -1 or t.max_steps > 0,
        f"trainer.max_steps must be positive or -1 (no limit), got {t.max_steps}",
    )


def _check_optimizer(cfg: DictConfig) -> None:
    lr = cfg.optimizer.get("lr") if cfg.optimizer else None
    _require(_number(lr) and lr > 0, f"optimizer.lr must be a positive number, got {lr}")
    for key, value in (cfg.optimizer or {}).items():
        if key in ("momentum", "eps", "alpha", "weight_decay"):
            _require(
                _number(value) and value >= 0, f"optimizer.{key} must be a number >= 0, got {value}"
            )
    if cfg.scheduler and "_target_" in cfg.scheduler:
        step_size, gamma = cfg.scheduler.get("step_size"), cfg.scheduler.get("gamma")
        _require(
            isinstance(step_size, int) and not isinstance(step_size, bool) and step_size > 0,
            f"scheduler.step_size must be a positive whole number of epochs, got {step_size}",
        )
        _require(
            _number(gamma) and gamma > 0, f"scheduler.gamma must be a positive number, got {gamma}"
        )


def _check_metrics_and_logger(cfg: DictConfig) -> None:
    target = cfg.metrics.target_rmse
    _require(
        target is None or target > 0,
        f"metrics.target_rmse must be positive (or null), got {target}",
    )
    _require(
        cfg.logger.system_metrics_interval_s > 0,
        f"logger.system_metrics_interval_s must be positive, got {cfg.logger.system_metrics_interval_s}",
    )
    name = cfg.logger.register_as
    _require(
        name is None or (str(name).strip() != "" and "/" not in str(name)),
        f"logger.register_as must be a model name without '/' (or null: do not register), got {name!r}",
    )
    _require(
        cfg.logger.outage_wait_s >= 0,
        f"logger.outage_wait_s must be >= 0, got {cfg.logger.outage_wait_s}",
    )
    _require(
        cfg.logger.flush_every_n_steps > 0,
        f"logger.flush_every_n_steps must be positive, got {cfg.logger.flush_every_n_steps}",
    )
    _require(
        cfg.logger.flush_every_s >= 0,
        f"logger.flush_every_s must be >= 0, got {cfg.logger.flush_every_s}",
    )
    _require(
        cfg.logger.log_checkpoints in ("best", "all", "none"),
        f"logger.log_checkpoints must be one of best, all, none; got {cfg.logger.log_checkpoints!r}",
    )


def validate_predict(cfg: DictConfig) -> None:
    """predict.py's one-line checks, before any model or data is loaded."""
    _require(
        (cfg.run is None) != (cfg.model_uri is None),
        "say which model: run=RUN_ID (a training run's) or model=models:/NAME/VERSION, one of them",
    )
    if "path" in cfg.data.source:
        _require(
            cfg.data.path not in (None, "???"),
            f"data={cfg.data.name} needs a file: add data.path=FILE",
        )
        _require(Path(cfg.data.path).is_file(), f"data.path={cfg.data.path}: no such file")
    _require(
        cfg.data.n_samples is None or cfg.data.n_samples > 0,
        f"data.n_samples must be positive (or null for all), got {cfg.data.n_samples}",
    )
