"""tracking/describe.py: a run's params and config.yaml from its config resolved once."""

from __future__ import annotations

from omegaconf import OmegaConf

from seqlab.tracking.describe import resolved, run_params
from seqlab.tracking.omegaconf_private import config_yaml
from seqlab.tracking.run import flatten


def test_the_config_resolved_once_gives_what_omegaconf_writes_and_the_params_of_every_key(
    compose_cfg,
):
    # The study's config (interpolations, resolvers, choices as enums, a callback's folder).
    cfg = compose_cfg("sweep=device_batch", "seed=3", "optimizer.lr=1e-3", "+tags.note='1e3'")
    config = resolved(cfg)
    assert config_yaml(config) == OmegaConf.to_yaml(cfg, resolve=True)
    assert "note: '1e3'" in config_yaml(config)  # a string OmegaConf would read as a float: quoted
    params = run_params(cfg, config)
    every = flatten(cfg)
    assert params["seed"] == "3" and params["trainer.accelerator"] == every["trainer.accelerator"]
    # Every key but a callback's folder (made from the job's folder), as each value resolves.
    left_out = set(every) - set(params)
    assert left_out and all(k.startswith("callbacks.") for k in left_out)
    assert all(every[k] == v for k, v in params.items() if "***" not in v)
