"""Training: the LightningModule and the loop it runs.

- `module`:            the LightningModule (`SeqRegressor`): loss, torchmetrics, optimizer and scheduler wiring
- `loop`:              the default training loop (`FusedLoop`): K optimizer steps per Lightning call
- `gradients`:         MATLAB's coupled L2 and gradient thresholds
- `perf`:              the optimizer implementation and steps per call of a perf option
- `cudagraph`:         the training step as a CUDA graph, with eager fallback
- `profiling`:         debug=profile: phase marks, trace and per-phase table
- `devices`:           accelerator resolution, device names, synchronisation
- `lightning_private`: every use of Lightning's private API, behind a version check
"""
