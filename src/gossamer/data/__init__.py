"""Data sets (a registry: ``DATASETS``) and per-worker partitioning."""

from gossamer.data import mnist1d  # noqa: F401  (registers its data set)
from gossamer.data.base import DATASETS, Dataset, default_cache_dir, load_dataset

__all__ = ["DATASETS", "Dataset", "default_cache_dir", "load_dataset"]
