"""The fast path: the same numbers as a plain PyTorch loop, on-device batching, no host
synchronisation in the hot loop, and the benchmark script."""

from __future__ import annotations

import json
import subprocess

import pytest
import torch
from conftest import ROOT, runs_of
from harness.inprocess import run_script
from harness.perf import _eager_capture
from hydra.utils import instantiate

from seqlab.train import train
from seqlab.training.evaluation import half_mse


def _plain_losses(cfg, n_steps: int) -> list[float]:
    """A hand-written loop over the same data in the same order, from the same initial weights."""
    import pytorch_lightning as pl

    pl.seed_everything(cfg.seed, workers=True, verbose=False)
    dm = instantiate(cfg.data)
    dm.setup()
    model = instantiate(cfg.model, n_features=dm.n_features, n_outputs=dm.n_outputs)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.optimizer.lr)
    dm.configure_batching(cfg.perf.loader, on_device=False, batches_per_item=1)
    batches = dm.train_dataloader()  # the same order the perf option trains in
    losses = []
    while len(losses) < n_steps:
        for xb, yb in batches:
            optimizer.zero_grad()
            loss = half_mse(model(xb), yb)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            if len(losses) == n_steps:
                break
    return losses


@pytest.mark.parametrize(
    "perf, extra, steps",
    [
        ("fast", (), 27),  # one call an epoch
        (
            "fast",
            ("perf.steps_per_call=4", "trainer.max_steps=13"),
            13,
        ),  # several calls; a stop inside one
        ("naive", (), 27),
    ],
    ids=["fast", "fast-k4-max_steps", "naive"],
)
def test_the_training_loop_computes_what_a_plain_loop_computes(
    compose_cfg, store, perf, extra, steps
):
    cfg = compose_cfg(
        f"perf={perf}",
        "data.n_samples=700",
        "trainer.max_epochs=3",
        "scheduler=none",
        "perf.checkpoint_every_n_epochs=0",
        *extra,
    )
    train(cfg)
    (run,) = runs_of(store, "seqlab")
    recorded = store.get_metric_history(run.info.run_id, "train_loss")
    # 560 training samples: 9 batches an epoch (the last one partial)
    assert [m.step for m in recorded] == list(range(1, steps + 1))
    expected = _plain_losses(cfg, steps)
    assert [m.value for m in recorded] == pytest.approx(expected, rel=2e-4, abs=1e-6)


def test_matlab_settings_on_the_fast_path_match_a_plain_matlab_loop(compose_cfg, store):
    """L2, the per-tensor threshold and validation every N iterations through the fused loop,
    against a hand-written loop applying the same treatment."""
    import pytorch_lightning as pl

    from seqlab.training.gradients import GradientTreatment

    cfg = compose_cfg(
        "experiment=matlab_seed",
        "data.n_samples=700",
        "data.val_fraction=0.2",
        "trainer.max_epochs=3",
        "trainer.val_check_interval=4",
        "model.dropout=0",
    )
    train(cfg)
    (run,) = runs_of(store, "seqlab")
    recorded = [m.value for m in store.get_metric_history(run.info.run_id, "train_loss")]
    assert len(recorded) == 24  # 560 training samples, last partial batch dropped: 8 an epoch
    assert [m.step for m in store.get_metric_history(run.info.run_id, "val_rmse")] == list(
        range(4, 25, 4)
    )

    pl.seed_everything(cfg.seed, workers=True, verbose=False)
    dm = instantiate(cfg.data)
    dm.setup()
    model = instantiate(cfg.model, n_features=dm.n_features, n_outputs=dm.n_outputs)
    treat = GradientTreatment(model, 1e-4, 1.0, "l2norm")
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    expected, batches = [], dm.train_dataloader()  # one loader: a new permutation each epoch
    for _ in range(3):
        for xb, yb in batches:
            optimizer.zero_grad()
            loss = half_mse(model(xb), yb)
            loss.backward()
            treat()
            optimizer.step()
            expected.append(loss.item())
    assert recorded == pytest.approx(expected, rel=1e-3, abs=1e-6)


# -- no host synchronisation in the hot loop ---------------------------------------------------


def test_the_fused_loop_never_reads_back_from_the_device(compose_cfg, monkeypatch):
    """Every way a tensor's value reaches the host is counted while the fused loop runs (its
    batches gathered on the way included); per-step metrics are read back only when flushed,
    outside the loop here."""
    from seqlab.training.loop import FusedLoop

    inside = {"loop": False, "reads": [], "calls": 0}
    for name in ("item", "tolist", "__float__", "__int__", "__bool__", "numpy", "cpu"):
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _original=original, _name=name, **kwargs):
            if inside["loop"] and self.numel() and self.device.type != "meta":
                inside["reads"].append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    run = FusedLoop.run_batches

    def watched(self, *args, **kwargs):
        inside["loop"] = True
        inside["calls"] += 1
        try:
            return run(self, *args, **kwargs)
        finally:
            inside["loop"] = False

    monkeypatch.setattr(FusedLoop, "run_batches", watched)
    result = train(
        compose_cfg("data.n_samples=700", "trainer.max_epochs=2", "perf.steps_per_call=3")
    )
    assert result.status == "FINISHED"
    assert inside["calls"] == 6  # 9 steps an epoch in items of 3: the watch did watch the loop
    assert inside["reads"] == []


def test_graph_replays_train_exactly_like_eager_steps_and_count_as_steps(
    compose_cfg, store, monkeypatch
):
    """The module's graph path (static buffers, step counting for Lightning, recording) with
    replays standing in for CUDA: the same losses, the same step count as the eager path."""
    from seqlab.training.cudagraph import GraphedStep
    from seqlab.training.loop import FusedLoop

    overrides = ("data.n_samples=700", "trainer.max_epochs=2", "scheduler=none")
    train(compose_cfg(*overrides, "logger.experiment_name=eager"))
    graphs, replays = [], []

    def cpu_graph(self, cuda_graph):
        graphs.append(
            GraphedStep(
                self.step,
                self.batch_size,
                capture=lambda step, inputs: _eager_capture(step, inputs, replays),
                warm_up=lambda s, i: s(*i),
                batch_dim=1,
            )
        )
        return graphs[-1]

    monkeypatch.setattr(FusedLoop, "_graphed_step", cpu_graph)
    train(compose_cfg(*overrides, "logger.experiment_name=graphed"))
    assert len(graphs) == 1 and graphs[0].graph is not None  # captured
    # 560 training samples: 8 full batches an epoch and a partial one (eager); of the 16 full
    # batches, 3 warm up and the other 13 are replays of the captured step.
    assert len(replays) == 13
    (eager,), (graphed,) = runs_of(store, "eager"), runs_of(store, "graphed")
    history = lambda run: store.get_metric_history(run.info.run_id, "train_loss")  # noqa: E731
    assert (
        [m.step for m in history(graphed)] == [m.step for m in history(eager)] == list(range(1, 19))
    )
    assert [m.value for m in history(graphed)] == pytest.approx(
        [m.value for m in history(eager)], rel=1e-5
    )


def test_cuda_graph_on_without_cuda_says_so_and_trains(compose_cfg, caplog):
    with caplog.at_level("WARNING", logger="seqlab"):
        result = train(
            compose_cfg("data.n_samples=300", "trainer.max_epochs=1", "perf.cuda_graph=on")
        )
    assert result.status == "FINISHED"
    if not torch.cuda.is_available():
        assert "perf.cuda_graph=on needs one CUDA device" in caplog.text


# -- the benchmark -------------------------------------------------------------------------------


def test_benchmark_smoke_writes_valid_json(tmp_path):
    """Every loop, the product's packs among them (K = 1 and 3, one-step and 1440-step data), in one smoke run."""
    out = tmp_path / "bench.json"
    proc = run_script(
        ROOT / "scripts" / "benchmark.py",
        [
            "--smoke",
            "--batch-sizes",
            "32",
            "--loops",
            "plain,bare,naive,default,packed",
            "--pack",
            "1,3",
            "--out",
            str(out),
        ],
        env={"SEQLAB_ROOT": str(tmp_path)},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(out.read_text())
    rows = data["rows"]
    loops = [("plain", 1), ("bare", 1), ("naive", 1), ("default", 1), ("packed", 1), ("packed", 3)]
    assert sorted((r["shape"], r["batch_size"], r["loop"], r["members"]) for r in rows) == sorted(
        (s, 32, loop, k) for s in ("seed", "profile") for loop, k in loops
    )
    assert all(r["it_per_s"] > 0 and r["steps_per_epoch"] > 0 and len(r["runs"]) == 1 for r in rows)
    assert all(r["model_steps_per_s"] == pytest.approx(r["it_per_s"] * r["members"]) for r in rows)
    assert all(
        r["samples_per_s"] == pytest.approx(r["model_steps_per_s"] * r["batch_size"]) for r in rows
    )
    assert all(r["ratio_to_plain"] == 1.0 for r in rows if r["loop"] == "plain")
    assert all(r["ratio_to_bare"] == 1.0 for r in rows if r["loop"] == "bare")
    for r in rows:  # each ratio is that row's model-steps/s over its own shape and batch's bare rate (K bare loops)
        bare = next(
            b
            for b in rows
            if (b["shape"], b["batch_size"], b["loop"]) == (r["shape"], r["batch_size"], "bare")
        )
        assert r["ratio_to_bare"] == pytest.approx(r["model_steps_per_s"] / bare["it_per_s"])
    assert data["machine"]["cpu"]
    assert "vs plain" in proc.stdout and "vs bare" in proc.stdout
    assert "packed3" in proc.stdout and "model-steps/s" in proc.stdout


def test_benchmark_overhead_smoke_reads_every_phase_of_a_packs_members(tmp_path):
    """--overhead: a command in a process of its own, its runs' costs.json read back (issue 35)."""
    out = tmp_path / "overhead.json"
    proc = run_script(
        ROOT / "scripts" / "benchmark.py",
        ["--overhead", "--smoke", "--cases", "pack", "--out", str(out)],
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(out.read_text())
    (command,) = data["commands"]
    assert command["case"] == "pack" and len(command["runs"]) == 2  # seed=0,1 pack=2
    totals = data["summary"]["pack"]["command"]
    assert totals["imports"] > 0 and totals["member configs"] > 0 and totals["models"] > 0
    assert (
        totals["wall"] == command["wall_s"] and totals["other"] > 0
    )  # every phase within the wall
    assert "pack command" in proc.stdout and "\nmodels " in proc.stdout
    # The yardstick is timed beside each repeat of a real measure (tests/unit/benchmark), not here.
    assert data["imports_s"] == [] and "not timed (--smoke)" in proc.stdout
    bad = run_script(ROOT / "scripts" / "benchmark.py", ["--overhead", "--cases", "pakc"])
    assert bad.returncode == 2
    assert bad.stderr.strip() == (
        "error: --cases must be among single,pack,one-by-one and --repeats positive (got pakc)"
    )


# -- profiling -----------------------------------------------------------------------------------


def test_debug_profile_stores_a_trace_and_a_per_phase_table(compose_cfg, store):
    from conftest import artifact_paths

    train(compose_cfg("debug=profile", "data.n_samples=640", "perf.profile_steps=12"))
    (run,) = runs_of(store, "seqlab-profile")
    files = artifact_paths(store, run.info.run_id)
    assert {
        "profile/profile_trace.json",
        "profile/profile_phases.txt",
        "profile/profile_ops.txt",
    } <= files
    local = store.download_artifacts(run.info.run_id, "profile")
    table = open(f"{local}/profile_phases.txt").read()
    profiled = int(table.split()[1])  # whole fused-loop calls: at least the steps asked for
    assert table.startswith("profiled ") and 12 <= profiled <= 16
    rows = {line.split()[0]: float(line.split()[1]) for line in table.splitlines()[2:]}
    assert set(rows) == {"data", "host_to_device", "forward", "backward", "optimizer", "logging"}
    assert rows["forward"] > 0 and rows["backward"] > 0 and rows["optimizer"] > 0
    json.loads(open(f"{local}/profile_trace.json").read())  # a valid Chrome trace


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="on a GPU machine the script runs every check"
)
def test_gpu_check_says_in_one_line_that_there_is_no_gpu(tmp_path):
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_check.sh"), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stdout.strip().splitlines()[-1].startswith("no CUDA GPU visible to ")
    assert "torch" in (tmp_path / "out" / "machine.txt").read_text()  # what it found is kept
