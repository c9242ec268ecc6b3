"""Many networks, one step (issues 22 and 32): K members of the network trained as one packed step,
each member its own MLflow run, as its job alone would be.

- `model`:      the packed CNN-LSTM (`PackedCNNLSTM`): parameters with a leading member dimension,
                member k in and out as a plain CNNLSTM state dict, per-member BatchNorm and dropout;
                one-step data by the exact shortcut, more steps with each member's own LSTM
- `optim`:      per-member settings: the configured optimizer (Adam, AdamW, SGDM, RMSProp) with a
                learning rate per member (`packed_optimizer`), MATLAB's L2 and gradient threshold and
                clipping per member (`PackedGradientTreatment`)
- `data`:       the members' samples on the device, each distinct set once (`PackData`)
- `members`:    one member as the run it is: its config, job, run and its callbacks' bookkeeping (`Member`)
- `module`:     the pack's LightningModule (`PackModule`), driven by the Trainer every job gets
- `task`:       the pack job: its members built, their runs opened, trained, ended
- `continuing`: which runs a resumed or requeued pack continues
"""
