"""Many models, one step (issue 22): K members of the network trained as one packed step.

- `model`: the packed CNN-LSTM (`PackedCNNLSTM`): parameters with a leading member dimension,
           member k in and out as a plain CNNLSTM state dict, per-member BatchNorm and dropout
- `optim`: per-member settings: the configured optimizer (Adam, SGDM, RMSProp) with a learning rate
           per member (`packed_optimizer`), MATLAB's L2 and gradient threshold per member
           (`PackedGradientTreatment`)

Not yet (issue 22): packing a multirun's jobs (`pack=8`), each member its own MLflow run,
multi-step data.
"""
