"""Library messages a user of this project need not see: each filter says why."""

from __future__ import annotations

import logging
import warnings


def quiet_libraries(loader: str) -> None:
    """Silence what libraries print that says nothing to a user of this project."""
    # Lightning's INFO lines (device tables, checkpoint notes) repeat what the report says.
    logging.getLogger("pytorch_lightning").setLevel(logging.WARNING)
    # Its warnings repeat what the delivery process says once when a tracking server goes away.
    logging.getLogger("mlflow.system_metrics").setLevel(logging.ERROR)
    # Noise that says nothing to a user of this project: an internal deprecation in Lightning,
    # and a hint about step-level self.log calls, which this module does not make.
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)")
    warnings.filterwarnings("ignore", message=r".*smaller than the logging interval")
    # On a SLURM login node (srun installed) every run outside a job would hint at srun.
    warnings.filterwarnings(
        "ignore", message=r".*The `srun` command is available on your system but is not used"
    )
    # The module marks host-to-device copies for the profiler and defers to Lightning for the rest.
    warnings.filterwarnings(
        "ignore", message=r".*overridden `transfer_batch_to_device` in `LightningModule`"
    )
    # Under DDP: the epoch metrics are torchmetrics states, which synchronise across processes
    # themselves, and every process validates on the whole validation set.
    warnings.filterwarnings(
        "ignore", message=r".*when logging on epoch level in distributed setting"
    )
    if loader == "tensor":
        # The data module saves and restores the position in the epoch's order (data.module),
        # which Lightning does not see on the loader itself. (A DataLoader's is not saved: there
        # the warning stands.)
        warnings.filterwarnings("ignore", message=r".*your dataloader is not resumable")
