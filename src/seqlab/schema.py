"""Typed config schema: Hydra merges conf/ into these dataclasses, so a misspelled key or a value
of the wrong type fails at compose time; each key's default lives here. seqlab.validation then
checks ranges and choices before any data is loaded. Light imports only: this runs on the CLI's
start-up path."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Dict, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

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
        raise ConfigError(
            f"{key} must be one of {', '.join(enum.__members__)}; got {str(value)!r}"
        ) from None


@dataclass
class DataConfig:
    _target_: str = "seqlab.data.SeqDataModule"
    name: str = MISSING
    source: Any = MISSING  # a _partial_ callable that returns (X, y) arrays
    path: Optional[str] = None
    n_samples: Optional[int] = None  # null: use every sample; a number: the first n
    batch_size: int = 64
    val_fraction: float = (
        0.2  # the share of samples held out for validation (a file's own X_val/y_val: none)
    )
    seed: int = 0
    shuffle: bool = True  # reshuffle every epoch, as MATLAB's Shuffle='every-epoch'
    drop_last: bool = False
    x_key: Optional[str] = None  # the input / response variable in a file (npz, mat)
    y_key: Optional[str] = None
    drop_nonfinite: bool = (
        False  # NaN/Inf in a sample: false refuses the data (one line), true drops those samples
    )


@dataclass
class ModelConfig:
    _target_: str = "seqlab.model.CNNLSTM"
    filters: int = 2  # the convolution's output channels
    kernel_size: int = 5
    hidden_size: int = 24  # the LSTM's units
    dropout: float = 0.1
    init: Init = (
        Init.pytorch
    )  # pytorch: PyTorch's; matlab: He-normal conv/LSTM, unit forget-gate bias, Glorot FC


@dataclass
class ModuleConfig:
    """How the LightningModule (every job's: seqlab.packing.module) trains: the settings MATLAB's
    trainNetwork fixes and PyTorch leaves to the user (see docs/matlab.md)."""

    _target_: str = "seqlab.packing.module.SeqRegressor"
    _partial_: bool = True
    # half_mse: 0.5 * mean over the batch of the sum over responses (MATLAB's regressionLayer); mse: torch's mse_loss
    loss: Loss = Loss.half_mse
    # MATLAB's L2Regularization: coupled (gradient += l2 * w), weights and BatchNorm scale/offset, no biases
    l2_regularization: float = 0.0
    gradient_threshold: Optional[float] = None  # MATLAB's GradientThreshold; null: no clipping
    gradient_threshold_method: ThresholdMethod = (
        ThresholdMethod.l2norm
    )  # l2norm (a tensor's) | global-l2norm | absolute-value
    bn_statistics: BnStatistics = (
        BnStatistics.moving
    )  # moving: running averages; population: one pass after training
    output_network: OutputNetworkChoice = (
        OutputNetworkChoice.last
    )  # MATLAB's OutputNetwork: last | best (val_rmse)
    validation_patience: Optional[int] = (
        None  # MATLAB's ValidationPatience: validations without a new best; null: Inf
    )


@dataclass
class TrainerConfig:
    _target_: str = "pytorch_lightning.Trainer"
    accelerator: Accelerator = Accelerator.auto  # auto | cpu | gpu | mps
    devices: Any = 1  # N > 1: one process per device, e.g. trainer.devices=2 trainer.strategy=ddp
    strategy: Strategy = (
        Strategy.auto
    )  # auto | ddp (gloo on CPU, NCCL on GPUs); one MLflow run a job, by rank 0
    num_nodes: int = 1  # machines in a multi-node DDP job (SLURM: one task per device)
    max_epochs: int = 30
    max_steps: int = -1  # -1: no step limit
    max_time: Optional[str] = (
        None  # a budget of wall time, "DD:HH:MM:SS" (sweep=device_batch uses one)
    )
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
    log_checkpoint: bool = (
        True  # the run's last.ckpt file as an artifact (checkpoints/), for resume= from elsewhere
    )
    # Networks as MLflow logged models (the run's Models tab; predict.py model=models:/m-<id>) besides
    # the network kept (`model`): best (the lowest val_rmse's, if it is not the one kept), all (also one
    # at each new best, logged as training goes), none.
    log_checkpoints: str = "best"
    # Metrics go into the run's journal and from there, by the delivery process, into the store
    # (seqlab.delivery); true: training waits for the store to hold each write (perf=naive's baseline).
    synchronous: bool = False
    system_metrics: bool = (
        True  # system/cpu_utilization_percentage, memory; GPU utilisation, memory, power
    )
    system_metrics_interval_s: float = 2.0
    # A store that takes nothing for this long at a run's end: the run's journal stays in its job's
    # folder, and the next command that opens the store delivers it and ends the run.
    outage_wait_s: float = 60.0
    register_as: Optional[str] = (
        None  # also register the logged model as a new version: models:/NAME/VERSION
    )
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
    # CPU threads for torch's operations; null: torch's default (one per core), or the process's
    # share beside a parallel launcher's other jobs and its job's other DDP processes. Two commands
    # at once on one machine each take every core and wait on each other's: give each its share
    # (docs/performance.md, "Two runs at once").
    threads: Optional[int] = None


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
    resume_data: ResumeData = (
        ResumeData.same
    )  # a resumed run's data changed since its stop: refused unless `changed`
    ckpt_path: Optional[str] = None  # a checkpoint file: start from its weights and training state
    rerun: Optional[str] = (
        None  # an MLflow run id: train it again from its recorded overrides (seqlab.rerun)
    )
    rerun_code: RerunCode = (
        RerunCode.recorded
    )  # recorded: only with the run's code (commit and diff); current: as it is
    pack: Any = "off"  # a multirun's jobs as packs of at most N members (seqlab.packing); pack_job: set by its sweeper
    pack_job: Optional[int] = None
    replicas: int = (
        1  # a multirun's job as N networks of its config in one pack (seeds seed*N .. seed*N+N-1)
    )


def register() -> None:
    ConfigStore.instance().store(name="train_schema", node=TrainConfig)
    resolvers.register()


register()


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
    experiment_name: str = (
        "seqlab"  # the evaluation run's experiment when the model has no training run
    )
    seed: int = 0
    evaluate: bool = (
        True  # data with targets: RMSE, MAE, R2 and a plot, recorded as an MLflow evaluation run
    )


ConfigStore.instance().store(name="predict_schema", node=PredictConfig)
