"""module.output_network (MATLAB's OutputNetwork) and module.validation_patience
(ValidationPatience): which network a run ends with, and when it stops."""

from __future__ import annotations

import pytest
from conftest import runs_of

from seqlab.train import train


def test_a_real_run_stops_where_its_validation_history_says_and_reports_the_best(
    compose_cfg, store, caplog
):
    caplog.set_level("INFO", logger="seqlab")
    patience = 2
    cfg = compose_cfg(
        "data.n_samples=256",
        "trainer.max_epochs=12",
        "scheduler=none",
        "optimizer.lr=0.03",
        "module.output_network=best",
        f"module.validation_patience={patience}",
    )
    result = train(cfg)
    (run,) = runs_of(store, "seqlab")
    history = [m.value for m in store.get_metric_history(run.info.run_id, "val_rmse")]
    # MATLAB's rule over the run's own history: the first validation that makes `patience` in a
    # row without a new best is the last one
    best, since, expected = float("inf"), 0, len(history)
    for i, value in enumerate(history):
        best, since = (value, 0) if value < best else (best, since + 1)
        if since >= patience:
            expected = i + 1
            break
    assert len(history) == expected < 12  # this configuration does stop early
    tags, metrics = run.data.tags, run.data.metrics
    assert tags["output_network"] == "best"
    assert tags["stopped_early"].endswith(f"(epoch {expected})")
    assert tags["output_network_step"] == str(int(metrics["best_val_rmse_step"]))
    # the final metrics are of the network kept: the best validation's
    assert metrics["final_val_rmse"] == pytest.approx(min(history), rel=1e-4)
    assert result.val_rmse == pytest.approx(min(history), rel=1e-4)
    assert result.output_network == f"best (step {tags['output_network_step']})"
    assert f"(the best network (step {tags['output_network_step']}), as saved)" in caplog.text
    assert (
        f"(epoch {expected}): val_rmse has not improved on {min(history):.4g} for {patience} validation(s)"
        in caplog.text
    )
