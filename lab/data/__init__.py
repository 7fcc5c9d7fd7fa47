"""Data loading: how batches reach the model (taught in notebooks/01_data_loading.ipynb)."""

from lab.data.loaders import InMemoryLoader, ShuffledBatchSampler, TensorBatchDataset, make_loader
from lab.data.prefetch import DevicePrefetcher, NaiveLoader, ThreadPrefetcher

__all__ = ["DevicePrefetcher", "InMemoryLoader", "NaiveLoader", "ShuffledBatchSampler", "TensorBatchDataset",
           "ThreadPrefetcher", "make_loader"]
