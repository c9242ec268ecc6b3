"""Past one process: a real MLflow server, parallel sweep jobs on the SQLite store, DDP with two
CPU processes, and the SLURM launcher's config."""

from __future__ import annotations

import math
import os
import signal
from pathlib import Path

import pytest
import torch
from conftest import CONF_DIR, TINY
from harness.inprocess import run_script
from hydra import compose, initialize_config_dir

from seqlab import SeqlabError
from seqlab.data import TensorBatches
from seqlab.ddp.ranks import local_processes
from seqlab.hydra_version import VERSION_BASE
from seqlab.store.server_command import check_backend
from seqlab.sweeps import job as jobs


# -- the tracking server ------------------------------------------------------------------------
def test_a_server_store_must_be_a_database():
    with pytest.raises(SeqlabError, match="needs a database"):
        check_backend("./mlruns")
    proc = run_script("seqlab.store.server", ["--backend-store-uri", "file:./mlruns"])
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: --backend-store-uri file:./mlruns: MLflow 3 needs a database here "
        "(sqlite:///path/mlflow.db or postgresql://user:password@host/db), not a folder"
    ]


def test_the_server_preset_takes_its_address_from_the_environment(compose_cfg, monkeypatch):
    assert compose_cfg("logger=mlflow_server").logger.tracking_uri == "http://127.0.0.1:5000"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://tracking.example:5001")
    assert compose_cfg("logger=mlflow_server").logger.tracking_uri == "http://tracking.example:5001"
    # MLflow's own variable also moves the default logger off the local store.
    assert compose_cfg().logger.tracking_uri == "http://tracking.example:5001"


def test_a_closed_terminal_ends_a_parallel_sweeps_waiting_parent_as_sigterm_does(
    monkeypatch, tmp_path
):
    """SIGHUP (the terminal closed) and SIGTERM reach the parent of a parallel sweep the same way:
    SystemExit with 128 + the signal, marked interrupted, so that atexit ends its run KILLED."""
    from types import SimpleNamespace

    from omegaconf import OmegaConf

    from seqlab.store import server as server_module
    from seqlab.sweeps.callback import LOCAL_PARALLEL_LAUNCHERS, MlflowSweepCallback

    class NoServer:  # the loopback server itself is the test above's
        def __init__(self, *args, **kwargs):
            self.uri = "http://127.0.0.1:9"

        def start(self, wait=True):
            return self

    monkeypatch.setattr(server_module, "LocalServer", NoServer)
    monkeypatch.setenv(
        "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "false"
    )  # _serve sets it; undone after
    callback = MlflowSweepCallback()
    callback.tracker = SimpleNamespace(
        tracking_uri=f"sqlite:///{tmp_path}/mlflow.db", artifact_root=None, connect=lambda: None
    )
    config = OmegaConf.create({"hydra": {"launcher": {"_target_": LOCAL_PARALLEL_LAUNCHERS[0]}}})
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:

        def unhandled(signum, frame):
            raise AssertionError(f"{signal.Signals(signum).name} did not reach the sweep's handler")

        for signum in before:
            signal.signal(signum, unhandled)
        assert callback._serve(config, tmp_path) == "http://127.0.0.1:9"
        for signum in (signal.SIGHUP, signal.SIGTERM):
            callback.interrupted = False
            with pytest.raises(SystemExit) as stopped:
                os.kill(os.getpid(), signum)  # the handler runs before the next line
            assert stopped.value.code == 128 + signum and callback.interrupted
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


def test_a_loopback_server_starts_uvicorn_as_mlflow_server_would():
    """LocalServer starts `mlflow server`'s uvicorn process itself: the environment names it sets
    must be the pinned MLflow's (a rename would leave the server without its store)."""
    import mlflow.server
    from mlflow.server import constants

    from seqlab.store.server_command import ARTIFACTS_ENV, BACKEND_ENV, uvicorn_command, uvicorn_env

    env = uvicorn_env({BACKEND_ENV: "sqlite:///s.db", ARTIFACTS_ENV: "/a"})
    assert (
        env[constants.BACKEND_STORE_URI_ENV_VAR]
        == env[constants.REGISTRY_STORE_URI_ENV_VAR]
        == "sqlite:///s.db"
    )
    assert (
        env[constants.ARTIFACTS_DESTINATION_ENV_VAR] == "/a"
        and env[constants.SERVE_ARTIFACTS_ENV_VAR] == "true"
    )
    assert env[constants.ARTIFACT_ROOT_ENV_VAR] == "mlflow-artifacts:/"
    assert env[mlflow.environment_variables._MLFLOW_SGI_NAME.name] == "uvicorn"
    assert mlflow.environment_variables._MLFLOW_SERVER_BOOT_ID.name in env
    assert uvicorn_command("127.0.0.1", 5123) == mlflow.server._build_uvicorn_command(
        None, "127.0.0.1", 5123, 1, "mlflow.server.fastapi_app:app"
    )


def test_the_sweep_callback_travels_to_launcher_workers_without_its_server():
    import pickle

    from seqlab.sweeps.callback import MlflowSweepCallback

    callback = MlflowSweepCallback()
    callback.server = object()  # stands for a process handle, which does not pickle
    callback.tracker = object()
    copy = pickle.loads(pickle.dumps(callback))
    assert copy.server is None and copy.tracker is None and copy.serve_local_store == "auto"


# -- DDP -------------------------------------------------------------------------------------------
def test_ddp_shards_cover_each_sample_at_most_once_per_epoch():
    x = torch.arange(103, dtype=torch.float32).reshape(103, 1, 1)
    y = x.clone()
    shards = [TensorBatches(x, y, 8, True, False, seed=3, rank=r, world_size=2) for r in (0, 1)]
    for _ in range(2):  # two epochs, each reshuffled
        seen = [torch.cat([b[0].flatten() for b in shard]) for shard in shards]
        assert len(seen[0]) == len(seen[1]) == 51  # equal shares keep the processes in step
        assert len(shards[0]) == len(shards[1]) == math.ceil(51 / 8)
        both = torch.cat(seen)
        assert len(set(both.tolist())) == 102  # disjoint: one sample left for a later shuffle
    in_order = [TensorBatches(x, y, 8, False, False, seed=3, rank=r, world_size=2) for r in (0, 1)]
    assert torch.cat([b[0].flatten() for b in in_order[1]]).tolist() == list(range(51, 102))


# A DDP job of two CPU processes in a sweep, one run for the job: tests/integration/test_rank_failure.py
# (test_a_ddp_jobs_overrides_reach_its_ranks_through_the_environment_not_their_command_lines), whose
# sweep of one DDP job is checked for both.


def test_multi_process_training_needs_the_cli(compose_cfg):
    from seqlab.train import train

    cfg = compose_cfg(*TINY, "trainer.accelerator=cpu", "trainer.devices=2", "trainer.strategy=ddp")
    with pytest.raises(SeqlabError, match="starts through the CLI"):
        train(cfg)


def test_a_jobs_processes_share_the_cores(compose_cfg, monkeypatch):
    monkeypatch.setattr(jobs, "cpu_count", lambda: 16)
    ddp = compose_cfg("trainer.devices=4", "trainer.strategy=ddp").trainer
    listed = compose_cfg("trainer.devices=[0,1]", "trainer.strategy=ddp").trainer
    assert [local_processes(t) for t in (compose_cfg().trainer, ddp, listed)] == [1, 4, 2]
    alone, beside = jobs.Job(Path(".")), jobs.Job(Path("."), concurrent_jobs=2)
    assert alone.cpu_share(compose_cfg().trainer) is None  # torch's default: every core
    assert alone.cpu_share(ddp) == 4  # 4 DDP processes on 16 cores, as Lightning gives them
    assert beside.cpu_share(compose_cfg().trainer) == 8  # two parallel jobs
    assert beside.cpu_share(listed) == 4  # two jobs of two processes each


def test_an_unknown_strategy_is_refused_up_front(run_cli):
    proc = run_cli(*TINY, "trainer.strategy=ddp_spawn")
    assert proc.returncode == 1
    assert "trainer.strategy must be one of auto, ddp; got 'ddp_spawn'" in proc.stdout + proc.stderr


# -- SLURM -------------------------------------------------------------------------------------
def test_the_slurm_launcher_config_composes():
    with initialize_config_dir(str(CONF_DIR), **VERSION_BASE):
        cfg = compose(
            "train",
            overrides=["hydra/launcher=slurm", "trainer.devices=4", "hydra.launcher.partition=gpu"],
            return_hydra_config=True,
        )
    launcher = cfg.hydra.launcher
    assert (
        launcher._target_ == "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"
    )
    assert launcher.partition == "gpu" and launcher.timeout_min == 60
    assert launcher.tasks_per_node == launcher.gpus_per_node == 4 and launcher.nodes == 1
    assert launcher.submitit_folder.endswith("/.submitit/%j")


# A run logged to a server on PostgreSQL: test_make_server_keeps_the_databases_password_off_every_command_line
# trains one on the server it starts.


def test_only_launchers_on_this_machine_get_the_loopback_server(tmp_path):
    from types import SimpleNamespace

    from omegaconf import OmegaConf

    from seqlab.sweeps.callback import MlflowSweepCallback

    callback = MlflowSweepCallback()
    callback.tracker = SimpleNamespace(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    for target in (
        "hydra._internal.core_plugins.basic_launcher.BasicLauncher",  # one job at a time
        "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher",
    ):  # other hosts
        config = OmegaConf.create({"hydra": {"launcher": {"_target_": target}}})
        assert callback._serve(config, tmp_path) is None and callback.server is None


def test_ranks_other_than_the_first_process_are_never_zero(monkeypatch):
    from seqlab.ddp.ranks import process_rank

    for key in ("RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK", "NODE_RANK"):
        monkeypatch.delenv(key, raising=False)
    assert process_rank() == 0
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert process_rank() == 1
    monkeypatch.setenv("NODE_RANK", "1")  # the second machine of a multi-node job
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert process_rank() != 0
    monkeypatch.setenv("RANK", "0")  # a global rank wins
    assert process_rank() == 0


def test_ddp_hands_lightning_a_plain_dataloader_to_shard_and_refuses_too_small_shares():
    from types import SimpleNamespace

    from torch.utils.data import DataLoader

    from seqlab.data import SeqDataModule, synthetic_daily_load

    dm = SeqDataModule(
        lambda n_samples, seed: synthetic_daily_load(n_samples, seed), n_samples=200, batch_size=16
    )
    dm.setup()
    dm.configure_batching("dataloader", on_device=False, batches_per_item=1)
    dm.trainer = SimpleNamespace(global_rank=1, world_size=2)
    assert isinstance(
        dm.train_dataloader(), DataLoader
    )  # Lightning swaps in its DistributedSampler
    dm.batch_size = 128  # 160 training samples: 80 a process
    with pytest.raises(
        SeqlabError,
        match="give each of the 2 processes 80, fewer than one batch of data.batch_size=128",
    ):
        dm.train_dataloader()


def test_under_ddp_train_loss_is_the_mean_over_the_processes(monkeypatch):
    """docs/scaling.md: under DDP, train_loss is averaged over the processes. The recorder's flush with a
    process group of two, the other process's losses known: the logged values are the means."""
    from types import SimpleNamespace

    import torch.distributed as dist

    from seqlab.packing.members import Member
    from seqlab.tracking import StepMetricsRecorder

    other = torch.tensor([[0.5], [1.5], [2.5]])  # process 1's losses at steps 1-3 (one member)

    def all_reduce(tensor):
        tensor += other  # SUM over the group, in place, as torch.distributed does

    monkeypatch.setattr(dist, "is_available", lambda: True)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda: 2)
    monkeypatch.setattr(dist, "all_reduce", all_reduce)
    logged = {}
    tracker = SimpleNamespace(
        log_series=lambda series, steps, times: logged.update(series, steps=steps)
    )
    member = Member(0, None, None, tracker=tracker)  # its config and job are not read here
    recorder = StepMetricsRecorder(
        [member], every_n_steps=3, loss_to_mse=lambda loss: 2.0 * loss, every_s=0.0
    )
    for step, loss in enumerate([1.5, 0.5, 4.5], start=1):  # this process's (rank 0's) losses
        recorder.steps.add(torch.tensor([loss]), step, 0.01)
    recorder.flush()
    assert logged["steps"] == [1, 2, 3]
    assert logged["train_loss"] == pytest.approx([1.0, 1.0, 3.5])
    assert logged["train_rmse"] == pytest.approx([math.sqrt(2.0), math.sqrt(2.0), math.sqrt(7.0)])
