"""Typed config schema: Hydra merges conf/ into these dataclasses, so a misspelled key or a value
of the wrong type fails at compose time; `validate` then checks ranges and choices before any data
is loaded. Light imports only: this runs on the CLI's start-up path."""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Dict, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig

from seqlab import SeqlabError, resolvers


def _choices(name: str, *values: str) -> type[StrEnum]:
    """A config key's choices as an Enum field, which OmegaConf checks at compose time. Members are
    named by their values (OmegaConf looks them up by name) and compare equal to plain strings."""
    return StrEnum(name, [(v, v) for v in values], module=__name__)


Accelerator = _choices("Accelerator", "auto", "cpu", "gpu", "cuda", "mps")
Init = _choices("Init", "pytorch", "matlab")
Loss = _choices("Loss", "half_mse", "mse")
ThresholdMethod = _choices("ThresholdMethod", "l2norm", "global-l2norm", "absolute-value")
BnStatistics = _choices("BnStatistics", "moving", "population")
OutputNetworkChoice = _choices("OutputNetworkChoice", "last", "best")
Loader = _choices("Loader", "tensor", "dataloader")
OptimizerImpl = _choices("OptimizerImpl", "fused", "foreach", "default")
Progress = _choices("Progress", "line", "bar")
StepWriterKind = _choices("StepWriterKind", "process", "inline")
# "auto" with devices > 1 is Lightning's choice, also DDP. Spawn-based strategies are not supported:
# the MLflow run is owned by the process that started the job.
Strategy = _choices("Strategy", "auto", "ddp")
ResumeData = _choices("ResumeData", "same", "changed")
RerunCode = _choices("RerunCode", "recorded", "current")
# Not Enums: YAML reads a bare 32 as a number and a bare off/on as a bool, which an Enum field refuses.
PRECISIONS = ("32-true", "32", "16-mixed", "bf16-mixed", "64-true", "64")
CUDA_GRAPH = ("auto", "on", "off")


class ConfigError(SeqlabError):
    """A config value out of range or not one of its choices."""


def choice(enum: type[StrEnum], value: Any, key: str) -> StrEnum:
    """`value` as one of `enum`'s members, or one line naming the key and its choices."""
    try:
        return enum[str(value)]
    except KeyError:
        raise ConfigError(f"{key} must be one of {', '.join(enum.__members__)}; got {str(value)!r}") from None


@dataclass
class DataConfig:
    _target_: str = "seqlab.data.SeqDataModule"
    name: str = MISSING
    source: Any = MISSING  # a _partial_ callable that returns (X, y) arrays
    path: Optional[str] = None
    n_samples: Optional[int] = None  # null: use every sample; a number: the first n
    batch_size: int = 64
    val_fraction: float = 0.2  # the share of samples held out for validation (a file's own X_val/y_val: none)
    seed: int = 0
    shuffle: bool = True  # reshuffle every epoch, as MATLAB's Shuffle='every-epoch'
    drop_last: bool = False
    x_key: Optional[str] = None  # the input / response variable in a file (npz, mat)
    y_key: Optional[str] = None
    drop_nonfinite: bool = False  # NaN/Inf in a sample: false refuses the data (one line), true drops those samples


@dataclass
class ModelConfig:
    _target_: str = "seqlab.model.CNNLSTM"
    filters: int = 2  # the convolution's output channels
    kernel_size: int = 5
    hidden_size: int = 24  # the LSTM's units
    dropout: float = 0.1
    init: Init = Init.pytorch  # pytorch: PyTorch's; matlab: He-normal conv/LSTM, unit forget-gate bias, Glorot FC


@dataclass
class ModuleConfig:
    """How the LightningModule trains: the settings MATLAB's trainNetwork fixes and PyTorch leaves
    to the user (see docs/matlab.md)."""

    _target_: str = "seqlab.training.module.SeqRegressor"
    _partial_: bool = True
    # half_mse: 0.5 * mean over the batch of the sum over responses (MATLAB's regressionLayer); mse: torch's mse_loss
    loss: Loss = Loss.half_mse
    # MATLAB's L2Regularization: coupled (gradient += l2 * w), weights and BatchNorm scale/offset, no biases
    l2_regularization: float = 0.0
    gradient_threshold: Optional[float] = None  # MATLAB's GradientThreshold; null: no clipping
    gradient_threshold_method: ThresholdMethod = ThresholdMethod.l2norm  # l2norm (a tensor's) | global-l2norm | absolute-value
    bn_statistics: BnStatistics = BnStatistics.moving  # moving: running averages; population: one pass after training
    output_network: OutputNetworkChoice = OutputNetworkChoice.last  # MATLAB's OutputNetwork: last | best (val_rmse)
    validation_patience: Optional[int] = None  # MATLAB's ValidationPatience: validations without a new best; null: Inf


@dataclass
class TrainerConfig:
    _target_: str = "pytorch_lightning.Trainer"
    accelerator: Accelerator = Accelerator.auto  # auto | cpu | gpu | mps
    devices: Any = 1  # N > 1: one process per device, e.g. trainer.devices=2 trainer.strategy=ddp
    strategy: Strategy = Strategy.auto  # auto | ddp (gloo on CPU, NCCL on GPUs); one MLflow run a job, by rank 0
    num_nodes: int = 1  # machines in a multi-node DDP job (SLURM: one task per device)
    max_epochs: int = 30
    max_steps: int = -1  # -1: no step limit
    max_time: Optional[str] = None  # a budget of wall time, "DD:HH:MM:SS" (sweep=device_batch uses one)
    precision: str = "32-true"  # 32-true | 16-mixed | bf16-mixed | 64-true
    gradient_clip_val: Optional[float] = None
    # null with val_check_interval=N: validate every N iterations across epochs (MATLAB's
    # ValidationFrequency); otherwise every this many epochs.
    check_val_every_n_epoch: Optional[int] = 1
    val_check_interval: Any = None
    num_sanity_val_steps: int = 0
    # Any other lightning.Trainer argument, e.g. trainer.extra={limit_train_batches:0.5}.
    extra: Dict[str, Any] = field(default_factory=dict)


@dataclass
class LoggerConfig:
    _target_: str = "seqlab.tracking.MlflowTracker"
    tracking_uri: str = MISSING
    artifact_root: Optional[str] = None
    experiment_name: str = "seqlab"
    run_name: Optional[str] = None  # null: named for what differs, e.g. cpu-bs64
    # Per-step metrics are sent in batches of at least this many steps, at most this often (seconds):
    # each send costs the training loop a little (the rest at the end; under DDP by steps only).
    flush_every_n_steps: int = 50
    flush_every_s: float = 1.0
    log_checkpoint: bool = True  # the run's last.ckpt file as an artifact (checkpoints/), for resume= from elsewhere
    # Networks as MLflow logged models (the run's Models tab; predict.py model=models:/m-<id>) besides
    # the network kept (`model`): best (the lowest val_rmse's, if it is not the one kept), all (also one
    # at each new best, logged as training goes), none.
    log_checkpoints: str = "best"
    synchronous: bool = False  # false: MLflow writes in the background (flushed before the run ends)
    system_metrics: bool = True  # system/cpu_utilization_percentage, memory; GPU utilisation, memory, power
    system_metrics_interval_s: float = 2.0
    outage_wait_s: float = 60.0  # a server away at the end of a run: wait this long, then copy the run
    fallback_uri: Optional[str] = None  # where that copy goes (a local store)
    # A local store's per-step metrics: by a helper process (process: MLflow's per-row cost off the
    # training process, tracking/step_writer.py) or MLflow's own thread (inline); not for a server.
    step_writer: StepWriterKind = StepWriterKind.process
    register_as: Optional[str] = None  # also register the logged model as a new version: models:/NAME/VERSION
    log_onnx: bool = True  # the network kept also as ONNX (`model-onnx`: MATLAB's importNetworkFromONNX, onnxruntime)


@dataclass
class MetricsConfig:
    # Time to quality: training time (synchronised, validation excluded) to val_rmse <= this; null: not tracked.
    target_rmse: Optional[float] = None


@dataclass
class PerfConfig:
    """How the training loop runs (conf/perf/): the same math either way, at different speeds."""

    name: str = "fast"
    loader: Loader = Loader.tensor
    data_on_device: bool = True
    steps_per_call: int = 50
    exact_shortcuts: bool = True
    optimizer_impl: OptimizerImpl = OptimizerImpl.fused
    cuda_graph: str = "auto"
    progress: Progress = Progress.line
    checkpoint_every_n_epochs: int = 0
    profile_steps: int = 0  # > 0: profile this many training steps (debug=profile)


@dataclass
class CheckpointConfig:
    # A checkpoint every this many seconds of training, taken at a step boundary, so that a run ended
    # by kill -9 (the OOM killer, a lost node) continues with resume=RUN_ID from at most this long ago
    # (seqlab.resume.checkpoints, docs/troubleshooting.md); 0: off. perf.checkpoint_every_n_epochs still applies.
    interval_s: float = 600.0


@dataclass
class PathsConfig:
    root_dir: str = MISSING
    data_dir: str = MISSING
    log_dir: str = MISSING
    mlruns_dir: str = MISSING
    tracking_uri: str = MISSING
    artifact_root: str = MISSING
    optuna_storage: str = MISSING
    output_dir: str = MISSING


@dataclass
class TrainConfig:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    module: ModuleConfig = field(default_factory=ModuleConfig)
    # Optimizer and scheduler keys differ per class (betas, momentum...): untyped; `validate` checks what all share.
    optimizer: Any = MISSING
    scheduler: Any = None
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    perf: PerfConfig = field(default_factory=PerfConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    # Lightning callbacks by name (conf/callbacks/); untyped: each has its own constructor.
    callbacks: Any = None
    paths: PathsConfig = field(default_factory=PathsConfig)
    seed: int = 0
    deterministic: bool = False
    notes: str = ""
    # An MLflow run id: continue that interrupted run; in a multirun, `latest` or a sweep id (seqlab.sweeps.job).
    resume: Optional[str] = None
    resume_data: ResumeData = ResumeData.same  # a resumed run's data changed since its stop: refused unless `changed`
    ckpt_path: Optional[str] = None  # a checkpoint file: start from its weights and training state
    rerun: Optional[str] = None  # an MLflow run id: train it again from its recorded overrides (seqlab.rerun)
    rerun_code: RerunCode = RerunCode.recorded  # recorded: only with the run's code (commit and diff); current: as it is
    pack: Any = "off"  # a multirun's jobs as packs of at most N members (seqlab.packing); pack_job: set by its sweeper
    pack_job: Optional[int] = None
    replicas: int = 1  # a multirun's job as N networks of its config in one pack (seeds seed*N .. seed*N+N-1)


def register() -> None:
    ConfigStore.instance().store(name="train_schema", node=TrainConfig)
    resolvers.register()


register()


def unknown_key(overrides: list[str], groups: set[str], schema: Any = None) -> Optional[str]:
    """The first `key=value` on the command line whose key the schema does not have, as one line with
    the nearest keys (Hydra's refusal has none); None if all are known. Keys under untyped nodes
    (optimizer.*, data.source.*, trainer.extra.*), `+`/`~` overrides and hydra.* are left to Hydra, and so
    is every key when the command line names another config or folder; `groups`: conf/'s groups."""
    other_sources = ("-cd", "--config-dir", "-cp", "--config-path", "-cn", "--config-name", "hydra.searchpath")
    if any(arg.split("=", 1)[0] in other_sources or arg.startswith("+hydra.searchpath") for arg in overrides):
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
            field_type = fields[part].default_factory if fields[part].default_factory is not dataclasses.MISSING else None
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
        if not value or override.startswith(("-", "+", "~")) or "/" in key or "@" in key or value[:1] in "[{$":
            continue
        node: Any = TrainConfig
        for part in key.split("."):
            fields = {f.name: f for f in dataclasses.fields(node)} if dataclasses.is_dataclass(node) else {}
            if part not in fields:
                node = None
                break
            f = fields[part]
            node = f.default_factory if f.default_factory is not dataclasses.MISSING else f.type
        enum = globals().get(node) if isinstance(node, str) else node  # annotations are strings here
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
    _require(cfg.replicas >= 1, f"replicas must be a positive integer (1: one network a job), got {cfg.replicas}")
    _require(cfg.checkpoint.interval_s >= 0,
             f"checkpoint.interval_s must be >= 0 seconds (0: off), got {cfg.checkpoint.interval_s}")
    _require(not (cfg.resume and cfg.ckpt_path), "resume=RUN_ID and ckpt_path=FILE are two ways to say where to continue from: give one")
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
    m, u, t = cfg.model, cfg.module, cfg.trainer
    for key in ("filters", "kernel_size", "hidden_size"):
        _require(m[key] > 0, f"model.{key} must be a positive integer, got {m[key]}")
    _require(0.0 <= m.dropout < 1.0, f"model.dropout must be in [0, 1), got {m.dropout}")
    _require(u.l2_regularization >= 0, f"module.l2_regularization must be >= 0, got {u.l2_regularization}")
    _require(
        u.gradient_threshold is None or u.gradient_threshold > 0,
        f"module.gradient_threshold must be positive (or null for none), got {u.gradient_threshold}",
    )
    _require(
        u.validation_patience is None or u.validation_patience > 0,
        f"module.validation_patience must be a positive integer (or null: never stop early), got {u.validation_patience}",
    )
    _require(
        not (str(t.precision) == "16-mixed" and (u.l2_regularization or u.gradient_threshold or t.gradient_clip_val)),
        "trainer.precision=16-mixed scales the loss, and the gradient treatment (module.l2_regularization, "
        "module.gradient_threshold, trainer.gradient_clip_val) would act on scaled gradients; use bf16-mixed or 32-true",
    )


def _check_perf(p: DictConfig) -> None:
    _require(str(p.cuda_graph).lower() in CUDA_GRAPH,  # YAML reads a bare off/on as a bool
             f"perf.cuda_graph must be one of {', '.join(CUDA_GRAPH)}; got {p.cuda_graph!r}")
    _require(p.steps_per_call > 0, f"perf.steps_per_call must be a positive integer, got {p.steps_per_call}")
    _require(
        p.checkpoint_every_n_epochs >= 0,
        f"perf.checkpoint_every_n_epochs must be >= 0 (0: only at the end), got {p.checkpoint_every_n_epochs}",
    )
    _require(p.profile_steps >= 0, f"perf.profile_steps must be >= 0, got {p.profile_steps}")


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
            _require(_number(value) and value >= 0, f"optimizer.{key} must be a number >= 0, got {value}")
    if cfg.scheduler and "_target_" in cfg.scheduler:
        step_size, gamma = cfg.scheduler.get("step_size"), cfg.scheduler.get("gamma")
        _require(
            isinstance(step_size, int) and not isinstance(step_size, bool) and step_size > 0,
            f"scheduler.step_size must be a positive whole number of epochs, got {step_size}",
        )
        _require(_number(gamma) and gamma > 0, f"scheduler.gamma must be a positive number, got {gamma}")



def _check_metrics_and_logger(cfg: DictConfig) -> None:
    target = cfg.metrics.target_rmse
    _require(target is None or target > 0, f"metrics.target_rmse must be positive (or null), got {target}")
    _require(
        cfg.logger.system_metrics_interval_s > 0,
        f"logger.system_metrics_interval_s must be positive, got {cfg.logger.system_metrics_interval_s}",
    )
    name = cfg.logger.register_as
    _require(name is None or (str(name).strip() != "" and "/" not in str(name)),
             f"logger.register_as must be a model name without '/' (or null: do not register), got {name!r}")
    _require(cfg.logger.outage_wait_s >= 0, f"logger.outage_wait_s must be >= 0, got {cfg.logger.outage_wait_s}")
    _require(
        cfg.logger.flush_every_n_steps > 0,
        f"logger.flush_every_n_steps must be positive, got {cfg.logger.flush_every_n_steps}",
    )
    _require(cfg.logger.flush_every_s >= 0, f"logger.flush_every_s must be >= 0, got {cfg.logger.flush_every_s}")
    _require(cfg.logger.log_checkpoints in ("best", "all", "none"),
             f"logger.log_checkpoints must be one of best, all, none; got {cfg.logger.log_checkpoints!r}")


# -- predict.py (conf/predict.yaml): a trained network's predictions on data from any data group --
@dataclass
class PredictConfig:
    data: DataConfig = field(default_factory=DataConfig)
    paths: PathsConfig = field(default_factory=PathsConfig)
    run: Optional[str] = None  # a training run's id: its model, runs:/<id>/model
    # or any MLflow model URI: models:/NAME/VERSION, runs:/<id>/model (`model=` on predict.py's
    # command line: conf/model/ is train.py's model group, so Hydra would read model= as that group)
    model_uri: Optional[str] = None
    tracking_uri: str = MISSING
    experiment_name: str = "seqlab"  # the evaluation run's experiment when the model has no training run
    seed: int = 0
    evaluate: bool = True  # data with targets: RMSE, MAE, R2 and a plot, recorded as an MLflow evaluation run


ConfigStore.instance().store(name="predict_schema", node=PredictConfig)


def validate_predict(cfg: DictConfig) -> None:
    """predict.py's one-line checks, before any model or data is loaded."""
    _require((cfg.run is None) != (cfg.model_uri is None),
             "say which model: run=RUN_ID (a training run's) or model=models:/NAME/VERSION, one of them")
    if "path" in cfg.data.source:
        _require(cfg.data.path not in (None, "???"), f"data={cfg.data.name} needs a file: add data.path=FILE")
        _require(Path(cfg.data.path).is_file(), f"data.path={cfg.data.path}: no such file")
    _require(cfg.data.n_samples is None or cfg.data.n_samples > 0,
             f"data.n_samples must be positive (or null for all), got {cfg.data.n_samples}")
