"""Data sets (a registry: ``DATASETS``) and per-worker partitioning."""

from gossamer.data import cifar, mnist1d, text  # noqa: F401  (register their data sets)
from gossamer.data.base import DATASETS, Dataset, default_cache_dir, load_dataset

__all__ = ["DATASETS", "Dataset", "default_cache_dir", "load_dataset"]
