"""Every use of PyTorch Lightning's private API, in one place. Each one is something the public API
does not offer (advancing the step counters of a loop that steps the optimizer itself, stopping at
the next step boundary from a signal handler, reading the position in an epoch, starting DDP's
other processes as this job and watching them). A Lightning upgrade can break them, so each call checks first that
the installed Lightning is one these were tested with, and says so in one line if not."""

from __future__ import annotations

import functools
from typing import Any, Callable

import pytorch_lightning
from pytorch_lightning.strategies.launchers import subprocess_script
from torch.amp.grad_scaler import OptState

from seqlab import require_tested

# The Lightning releases these uses were read against and tested with (pyproject.toml holds
# pytorch-lightning below the next one).
TESTED = ("2.6.",)


@functools.cache
def check_version() -> None:

    require_tested("pytorch-lightning", pytorch_lightning.__version__, TESTED, "Lightning")


def set_ddp_process_observer(start: Callable[[list], None]) -> None:
    """What watches the DDP processes Lightning's launcher starts: `start(procs)` is called with
    their Popen handles, in rank order, instead of Lightning's observer (which kills rank 0 too)."""
    check_version()

    subprocess_script._launch_process_observer = start


def count_optimizer_steps(optimizer: Any, n: int) -> None:
    """The fused loop stepped the raw optimizer n times: Lightning's step counters (global_step,
    max_steps, step-based checkpoints and validation) advance as its optimizer wrapper
    (`LightningOptimizer`) would have advanced them."""
    check_version()
    for _ in range(n):
        optimizer._on_before_step()
        optimizer._on_after_step()


def request_stop(trainer: Any, stop: bool = True) -> None:
    """Lightning's graceful stop, as on SIGTERM: the loop ends at the next step boundary
    (`stop=False` withdraws a request not yet acted on)."""
    check_version()
    trainer._signal_connector.received_sigterm = stop


def batches_done_in_epoch(trainer: Any) -> int:
    """How many of the running epoch's training items (Lightning calls) are complete."""
    check_version()
    return trainer.fit_loop.epoch_loop.batch_progress.current.completed


def set_ddp_process_command(command: Callable[[int], tuple[list[str], str]]) -> None:
    """How Lightning's DDP launcher starts local rank N (1..devices-1) under Hydra: `command(N)`
    returns the command line and its working directory."""
    check_version()

    subprocess_script._hydra_subprocess_cmd = command


def unscale_for_treatment(trainer: Any, optimizer: Any) -> None:
    """trainer.precision=16-mixed: the gradients the gradient treatment sees (MATLAB's L2 and
    threshold, clipping) unscaled, as clipping must see them. Lightning's precision plugin unscales
    before on_before_optimizer_step, except for an optimizer that unscales inside its own step
    (fused Adam: torch's `_step_supports_amp_scaling`), which is unscaled here, once; the scaler's
    step then hands it the gradients as they are."""
    check_version()
    scaler = getattr(trainer.precision_plugin, "scaler", None)
    if scaler is None or not getattr(optimizer, "_step_supports_amp_scaling", False):
        return

    if scaler._per_optimizer_states[id(optimizer)]["stage"] is OptState.READY:
        scaler.unscale_(optimizer)
