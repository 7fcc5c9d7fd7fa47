"""Data loading: how batches reach the model (taught in notebooks/01_data_loading.ipynb)."""

from lab.data.loaders import InMemoryLoader, ShuffledBatchSampler, TensorBatchDataset, make_loader

__all__ = ["InMemoryLoader", "ShuffledBatchSampler", "TensorBatchDataset", "make_loader"]
