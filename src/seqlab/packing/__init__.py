"""Many models, one step (issue 22): K members of the network trained as one packed step.

- `model`: the packed CNN-LSTM (`PackedCNNLSTM`): parameters with a leading member dimension,
           member k in and out as a plain CNNLSTM state dict, per-member BatchNorm and dropout
"""
