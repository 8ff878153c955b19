"""MNIST-1D (Greydanus 2020), generated locally and cached as .npz."""

from __future__ import annotations

import os
import random
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch


@dataclass(frozen=True)
class Dataset:
    """Train/test tensors; inputs are float32 [N, 1, L], labels int64 [N]."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int


def default_cache_dir() -> Path:
    """$GOSSAMER_CACHE if set, else ~/.cache/gossamer."""
    return Path(os.environ.get("GOSSAMER_CACHE", Path.home() / ".cache" / "gossamer"))


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


def load_mnist1d(num_samples: int = 5000, seed: int = 42, cache_dir: str | Path | None = None) -> Dataset:
    """Load MNIST-1D (train_split 0.8; 5000 samples -> 4000/1000), generating and caching on first use."""
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    path = cache / f"mnist1d_n{num_samples}_s{seed}.npz"
    if path.exists():
        with np.load(path) as f:
            arrays = {k: f[k] for k in f.files}
    else:
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
