"""Data sets (a registry: ``DATASETS``) and per-worker partitioning."""

# registration order is the order of `gossamer train --help` and of error messages: the default first
from gossamer.data import mnist1d  # noqa: F401  (register their data sets)
from gossamer.data import cifar, text  # noqa: F401, I001
from gossamer.data.base import DATASETS, Dataset, default_cache_dir, load_dataset

__all__ = ["DATASETS", "Dataset", "default_cache_dir", "load_dataset"]
