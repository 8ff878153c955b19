"""MNIST-1D (Greydanus 2020), generated locally and cached as .npz: no download.

Inputs are float32 [N, 1, 40], labels int64 [N], 10 classes. The data set is always generated
with the generator seed 42 (the standard MNIST-1D); the run's seed draws models and batches.
"""

from __future__ import annotations

import os
import random
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..registry import ConfigError
from ..topology import free_memory
from .base import DATASETS, Dataset, default_cache_dir
from .partition import steps_per_epoch

MNIST1D_SEED = 42
TRAIN_SPLIT = 0.8  # the generator's train/test split
MIN_SAMPLES = 10
# peak bytes per generated sample: 1,235 measured with tracemalloc at 20,000 samples, rounded up
SAMPLE_BYTES = 1536


@dataclass
class MNIST1DOptions:
    num_samples: int = 5000  # generated samples, split 80/20 (5000 → the standard 4000/1000)

    def validate(self, cfg) -> None:
        if self.num_samples < MIN_SAMPLES:
            raise ConfigError(f"num_samples must be at least {MIN_SAMPLES} (the generator draws every class), "
                              f"got {self.num_samples}")
        steps_per_epoch(int(self.num_samples * TRAIN_SPLIT), cfg.workers, cfg.batch_size)  # before generating
        free = free_memory()
        if free is not None and self.num_samples * SAMPLE_BYTES > free:
            raise ConfigError(f"num_samples {self.num_samples:.3g} needs about {self.num_samples * SAMPLE_BYTES / 2**30:.3g}"
                              f" GiB to generate, more than the {free / 2**30:.3g} GiB free; at most "
                              f"{free // SAMPLE_BYTES:,} fit")


def _generate(num_samples: int, seed: int) -> dict[str, np.ndarray]:
    """Run the mnist1d generator (it reseeds the global RNGs; restore them after)."""
    from mnist1d.data import get_dataset_args, make_dataset

    args = get_dataset_args()
    args.num_samples = num_samples
    args.seed = seed
    py_state, np_state = random.getstate(), np.random.get_state()
    try:
        d = make_dataset(args)
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)
    return {"x_train": d["x"], "y_train": d["y"], "x_test": d["x_test"], "y_test": d["y_test"]}


def _save_atomic(path: Path, arrays: dict[str, np.ndarray]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".npz.tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def _read_cache(path: Path) -> dict[str, np.ndarray] | None:
    """The cached arrays; None when there is no usable cache (a damaged one is removed, so that
    it is generated again instead of failing every later run)."""
    if not path.exists():
        return None
    try:
        with np.load(path) as f:
            arrays = {k: f[k] for k in f.files}
        if {"x_train", "y_train", "x_test", "y_test"} <= arrays.keys():
            return arrays
    except (OSError, ValueError, EOFError, zipfile.BadZipFile):  # truncated, or not an npz
        pass
    path.unlink(missing_ok=True)
    return None


def load_mnist1d(num_samples: int = 5000, seed: int = 42, cache_dir: str | Path | None = None) -> Dataset:
    """Load MNIST-1D (train_split 0.8; 5000 samples -> 4000/1000), generating and caching on first use."""
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    path = cache / f"mnist1d_n{num_samples}_s{seed}.npz"
    arrays = _read_cache(path)
    if arrays is None:
        arrays = _generate(num_samples, seed)
        _save_atomic(path, arrays)

    def x(a: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(a, dtype=torch.float32).unsqueeze(1)

    def y(a: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(a, dtype=torch.int64)

    return Dataset(
        x_train=x(arrays["x_train"]),
        y_train=y(arrays["y_train"]),
        x_test=x(arrays["x_test"]),
        y_test=y(arrays["y_test"]),
        num_classes=10,
    )


@DATASETS.register("mnist1d", options=MNIST1DOptions, help="MNIST-1D, generated locally (10 classes, 40-sample signals)")
def _mnist1d(cfg) -> Dataset:
    return load_mnist1d(cfg.num_samples, seed=MNIST1D_SEED)
