"""Data: sources that return a SeqData (X, y, optional lengths and validation set), and the
DataModule that splits and batches it. Config files name these by `seqlab.data.<name>`."""

from seqlab.data.matlab import load_mat
from seqlab.data.module import SeqDataModule, TensorBatches
from seqlab.data.sources import SeqData, as_sequences, load_npz, pad_sequences, synthetic_daily_load
from seqlab.data.tables import load_csv, load_parquet

__all__ = [
    "SeqData",
    "SeqDataModule",
    "TensorBatches",
    "as_sequences",
    "load_csv",
    "load_mat",
    "load_npz",
    "load_parquet",
    "pad_sequences",
    "synthetic_daily_load",
]
