"""A job's K >= 1 members trained as one step (issues 22 and 32), each member its own MLflow run: a
run alone is a pack of one, a pack of a multirun K of its jobs, and both train here, the same way.

- `model`:       the network with a member dimension (`pack_of`): one network as a pack of one
                 (`OneMember`), K CNN-LSTMs as one packed module (`PackedCNNLSTM`: parameters with a
                 leading member dimension, member k in and out as a plain CNNLSTM state dict,
                 per-member BatchNorm and dropout; one-step data by the exact shortcut, more steps
                 with each member's own LSTM)
- `optim`:       how the members are updated (`build_update`): the configured optimizer, or its
                 packed form with a learning rate per member (`packed_optimizer`: Adam, AdamW, SGDM,
                 RMSProp), MATLAB's L2 and gradient threshold and clipping per member
- `data`:        the members' samples on the device, each distinct set once (`PackData`)
- `members`:     one member as the run it is: its config, job, run and what the callbacks record of
                 it (`Member`)
- `module`:      the LightningModule of every job (`SeqRegressor`), driven by the Trainer
- `member_runs`: each member's MLflow run, opened and ended as its job alone's
- `task`:        a pack's members, from the sweep's plan
- `continuing`:  which runs a resumed or requeued pack continues
"""
