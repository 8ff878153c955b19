"""Datasets and per-worker partitioning."""

from gossamer.data.mnist1d import Dataset, load_mnist1d

DATASETS = {"mnist1d": load_mnist1d}


def load_dataset(name: str, num_samples: int, seed: int) -> Dataset:
    """Load a registered dataset by name."""
    if name not in DATASETS:
        raise ValueError(f"unknown dataset '{name}'; choose one of: {', '.join(sorted(DATASETS))}")
    return DATASETS[name](num_samples=num_samples, seed=seed)


__all__ = ["DATASETS", "Dataset", "load_dataset", "load_mnist1d"]
