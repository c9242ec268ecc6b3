"""Composition, the typed schema, up-front validation, and a CLI start-up free of heavy imports."""

from __future__ import annotations

import dataclasses
import enum
import typing

import pytest
import yaml
from conftest import CONF_DIR, compose_in
from hydra.errors import ConfigCompositionException
from omegaconf import MISSING

from seqlab.schema import ConfigError, TrainConfig
from seqlab.validation import validate

OPTIONS = sorted(
    f"{path.parent.name}={path.stem}"
    for path in CONF_DIR.glob("*/*.yaml")
    if path.parent.name not in ("hydra", "paths", "logger", "trainer", "model")
)


@pytest.mark.parametrize("option", OPTIONS)
def test_every_option_composes_and_validates(compose_cfg, tmp_path, option):
    extra = []
    if option in ("data=npz", "data=csv", "data=mat", "data=parquet"):
        data_file = tmp_path / f"d.{option[5:]}"
        data_file.write_text("")
        extra.append(f"data.path={data_file}")
    cfg = compose_cfg(option, *extra)
    validate(cfg)
    assert cfg.data.batch_size > 0
    group, _, name = option.partition("=")
    checked = {} if is_preset(CONF_DIR / group / f"{name}.yaml") else unset_defaults(group)
    for key, default in checked.items():
        assert cfg[group][key] == default, (
            option,
            key,
        )  # the schema's value, where no option sets one


def test_defaults_are_the_matlab_network_and_options(compose_cfg):
    cfg = compose_cfg()
    assert (cfg.model.filters, cfg.model.kernel_size, cfg.model.hidden_size, cfg.model.dropout) == (
        2,
        5,
        24,
        0.1,
    )
    assert cfg.optimizer._target_ == "torch.optim.Adam" and cfg.optimizer.lr == 1e-3
    assert (cfg.scheduler.step_size, cfg.scheduler.gamma) == (10, 0.1)  # trainingOptions defaults
    assert cfg.data.source.n_features == 1440 and cfg.data.batch_size == 64
    assert cfg.trainer.accelerator == "auto"
    assert cfg.paths.tracking_uri.startswith("sqlite:///") and cfg.paths.tracking_uri.endswith(
        "mlruns/mlflow.db"
    )


def test_experiment_preset_sets_only_its_differences(compose_cfg):
    base, preset = compose_cfg(), compose_cfg("experiment=daily_profile")
    assert preset.data.source.layout == "profile" and preset.data.name == "daily_profile"
    assert preset.trainer.max_epochs == 10
    assert preset.optimizer == base.optimizer and preset.model == base.model


def test_scheduler_none_leaves_no_scheduler(compose_cfg):
    cfg = compose_cfg("scheduler=none")
    assert not cfg.scheduler or "_target_" not in cfg.scheduler


@pytest.mark.parametrize(
    "override, message",
    [
        ("data.batch_size=0", "data.batch_size must be a positive integer, got 0"),
        ("data.val_fraction=1.5", "data.val_fraction must be in [0, 1), got 1.5"),
        ("data.n_samples=-3", "data.n_samples must be positive"),
        ("optimizer.lr=-0.1", "optimizer.lr must be a positive number, got -0.1"),
        ("optimizer.lr=abc", "optimizer.lr must be a positive number, got abc"),
        ("optimizer=sgdm optimizer.momentum=x", "optimizer.momentum must be a number >= 0, got x"),
        (
            "scheduler.step_size=abc",
            "scheduler.step_size must be a positive whole number of epochs, got abc",
        ),
        ("scheduler.gamma=0", "scheduler.gamma must be a positive number, got 0"),
        ("module.l2_regularization=-1", "module.l2_regularization must be >= 0, got -1.0"),
        ("module.gradient_threshold=0", "module.gradient_threshold must be positive"),
        (
            "trainer.check_val_every_n_epoch=null",
            "trainer.check_val_every_n_epoch=null needs trainer.val_check_interval=N",
        ),
        ("trainer.precision=8", "trainer.precision must be one of"),
        ("trainer.max_epochs=0", "trainer.max_epochs must be positive, got 0"),
        ("model.dropout=1.0", "model.dropout must be in [0, 1), got 1.0"),
        ("data=npz", "data=npz needs a file: add data.path=FILE"),
        ("data=csv data.path=/nonexistent.csv", "data.path=/nonexistent.csv: no such file"),
    ],
)
def test_validate_names_the_key_and_the_fix(compose_cfg, override, message):
    cfg = compose_cfg(*override.split())
    with pytest.raises(ConfigError) as caught:
        validate(cfg)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    "override, message",
    [
        (
            "module.gradient_threshold_method=l1",
            "module.gradient_threshold_method must be one of l2norm, global-l2norm, absolute-value",
        ),
        (
            "module.bn_statistics=running",
            "module.bn_statistics must be one of moving, population; got 'running'",
        ),
        ("module.loss=mae", "module.loss must be one of half_mse, mse; got 'mae'"),
        (
            "trainer.accelerator=tpu",
            "trainer.accelerator must be one of auto, cpu, gpu, cuda, mps; got 'tpu'",
        ),
        ("model.init=xavier", "model.init must be one of pytorch, matlab; got 'xavier'"),
        ("perf.loader=numpy", "perf.loader must be one of tensor, dataloader; got 'numpy'"),
    ],
)
def test_choices_are_enum_fields_checked_at_compose_time(compose_cfg, override, message):
    """The schema's Enum fields: OmegaConf refuses another value while composing; the CLI says so
    first in one line naming the choices (validation.bad_choice, from the same Enum)."""
    from seqlab.validation import bad_choice

    problem = bad_choice([override])
    assert problem is not None and message in problem and "\n" not in problem
    with pytest.raises(ConfigCompositionException) as caught:
        compose_cfg(*override.split())
    assert "expected one of" in str(caught.value.__cause__)
    assert (
        bad_choice([override.split("=")[0] + "=" + message.split(" one of ")[1].split(",")[0]])
        is None
    )


def test_key_check_leaves_configs_from_elsewhere_to_hydra():
    from seqlab.validation import unknown_key

    groups = {"data", "model"}
    assert unknown_key(["site=cluster"], groups).startswith("site is not a config key")
    assert unknown_key(["-cd", "/elsewhere", "site=cluster"], groups) is None
    assert unknown_key(["--config-name=other", "site=cluster"], groups) is None
    assert unknown_key(["hydra.searchpath=[file:///x]", "site=cluster"], groups) is None
    assert (
        unknown_key(["optimizer.betas=[0.9,0.99]", "+data.extra=1", "data.source.n_days=3"], groups)
        is None
    )


def test_the_callbacks_group_hands_each_callback_what_its_constructor_names(compose_cfg):
    """conf/callbacks/: built in order; a callback gets the callbacks above it by the names in its
    signature, config values stay as given, and a callback whose need was switched off is one
    line. (Each works member by member on the module it is given: no run's object is handed in.)"""
    from omegaconf import OmegaConf

    from seqlab import SeqlabError
    from seqlab.callbacks import build
    from seqlab.callbacks.progress import ProgressLine
    from seqlab.callbacks.timing import EpochTimer, TimeToTarget

    built = build(compose_cfg("metrics.target_rmse=0.2", "perf=naive").callbacks)
    assert list(built) == [
        "timer",
        "divergence",
        "best",
        "time_to_target",
        "profiler",
        "progress",
        "epoch_checkpoint",
    ]
    assert isinstance(built["timer"], EpochTimer)
    assert isinstance(built["time_to_target"], TimeToTarget)
    assert built["time_to_target"].timer is built["timer"] and built["time_to_target"].target == 0.2
    assert isinstance(built["progress"], ProgressLine) and built["progress"].timer is built["timer"]
    assert not built["progress"].enabled  # perf=naive: Lightning's bar instead
    assert built["epoch_checkpoint"].every_n_epochs == 1  # perf=naive checkpoints every epoch

    nodes = OmegaConf.create(
        {
            "timer": None,
            "progress": {"_target_": "seqlab.callbacks.progress.ProgressLine", "_partial_": True},
        }
    )
    with pytest.raises(SeqlabError) as caught:
        build(nodes)
    assert str(caught.value) == (
        "callbacks.progress needs 'timer', which no callback above it is named and the run "
        "does not provide: keep callbacks.timer, or switch off callbacks.progress"
    )


def test_runs_started_in_the_same_second_get_output_folders_of_their_own(tmp_path, monkeypatch):
    # Issue 23: two train.py runs started together by a shell loop shared logs/runs/<second>/ (the
    # batch-64 run's overrides.yaml said batch 32, and they shared checkpoints/). Hydra's clock
    # frozen at one second here, as for two processes started in it.
    import datetime

    import hydra.core.utils
    from hydra import compose, initialize_config_dir

    from seqlab.hydra_version import VERSION_BASE

    class Frozen(datetime.datetime):
        @classmethod
        def now(cls, tz=None):
            return cls(2026, 12, 1, 10, 0, 0)

    monkeypatch.setattr(hydra.core.utils, "datetime", Frozen)
    folders = []
    for batch in (32, 64):
        with initialize_config_dir(str(CONF_DIR), **VERSION_BASE):
            cfg = compose(
                "train",
                overrides=[f"paths.root_dir={tmp_path}", f"data.batch_size={batch}"],
                return_hydra_config=True,
            )
        assert cfg.hydra.run.dir == cfg.hydra.run.dir  # one value per composed config
        folders += [cfg.hydra.run.dir, cfg.hydra.sweep.dir]
    run_a, sweep_a, run_b, sweep_b = folders
    assert run_a != run_b and sweep_a != sweep_b
    assert (
        run_a.startswith(f"{tmp_path}/logs/runs/2026-12-01_10-00-00-")
        and len(run_a.rsplit("-", 1)[1]) == 6
    )


def schema_defaults(kind) -> dict:
    """A schema dataclass's defaults by key, an Enum's as its value (keys without one left out)."""
    return {
        f.name: f.default.value if isinstance(f.default, enum.Enum) else f.default
        for f in dataclasses.fields(kind)
        if f.default is not dataclasses.MISSING and f.default is not MISSING
    }


def group_schema(name: str):
    """The schema dataclass of the config group `name` (TrainConfig's field, Optional or not)."""
    kind = typing.get_type_hints(TrainConfig)[name]
    return typing.get_args(kind)[0] if typing.get_origin(kind) is typing.Union else kind


def is_preset(option) -> bool:
    """perf's options are presets over several groups (# @package _global_)."""
    return "@package _global_" in option.read_text()


def unset_defaults(group: str) -> dict:
    """The schema's defaults of `group` that none of its options sets (an option may take another's
    through a defaults list): every option of the group composes with these values."""
    if group not in typing.get_type_hints(TrainConfig) or not dataclasses.is_dataclass(
        group_schema(group)
    ):
        return {}  # a preset group (experiment, sweep): no schema of its own
    options = [o for o in sorted((CONF_DIR / group).glob("*.yaml")) if not is_preset(o)]
    set_by_some = set().union(*[yaml.safe_load(o.read_text()) or {} for o in options])
    return {
        key: default
        for key, default in schema_defaults(group_schema(group)).items()
        if key not in set_by_some and not key.startswith("_")
    }


def repeats(where: str, body: dict, defaults: dict) -> list[str]:
    """The keys of a YAML body that set their schema default again, as `where: key: value`."""
    return [
        f"{where}: {key}: {value!r}"
        for key, value in body.items()
        if key not in ("_target_", "_partial_") and key in defaults and value == defaults[key]
    ]


def test_each_key_has_its_default_in_one_place(tmp_path):
    """Issue 37, point 4: a group option's YAML sets only what differs from the schema's default (the
    one place a default lives: src/seqlab/schema.py, which constructors read too); a _target_ names
    what the option builds. perf's options are presets over several groups: each group they set is
    held to its own schema defaults. That each option composes with the schema's values is
    test_every_option_composes_and_validates's; the groups it leaves out are composed here."""
    repeated, groups = [], set()
    for field in dataclasses.fields(TrainConfig):
        kind, folder = group_schema(field.name), CONF_DIR / field.name
        if not dataclasses.is_dataclass(kind) or not folder.is_dir():
            continue
        groups.add(field.name)
        for option in sorted(folder.glob("*.yaml")):
            body = yaml.safe_load(option.read_text()) or {}
            where = f"conf/{field.name}/{option.name}"
            if is_preset(option):
                for group, part in body.items():
                    repeated += repeats(
                        f"{where}: {group}", part, schema_defaults(group_schema(group))
                    )
                continue
            repeated += repeats(where, body, schema_defaults(kind))
            if f"{field.name}={option.stem}" not in OPTIONS:
                cfg = compose_in(tmp_path, f"{field.name}={option.stem}")
                for key, default in unset_defaults(field.name).items():
                    assert cfg[field.name][key] == default, (option, key)
    assert repeated == []
    assert groups >= {"checkpoint", "data", "logger", "model", "module", "trainer"}, groups
