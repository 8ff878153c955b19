"""What a data set is to the training loop: train and test tensors, a task, per-worker batches."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from ..registry import Registry

DATASETS = Registry("dataset")


def default_cache_dir() -> Path:
    """$GOSSAMER_CACHE if set, else ~/.cache/gossamer."""
    return Path(os.environ.get("GOSSAMER_CACHE", Path.home() / ".cache" / "gossamer"))


@dataclass(frozen=True)
class Dataset:
    """Train/test tensors and what to learn from them: what a ``DATASETS`` entry's builder ``(cfg)`` returns.

    Args:
        x_train, y_train (Tensor): the training inputs [N, ...] and targets [N] (or [N, T]: tokens).
        x_test, y_test (Tensor): the test set, alike.
        num_classes (int): the model's output size (classes, or a language model's vocabulary).
        task (str): a :data:`~gossamer.tasks.TASKS` entry: ``classification`` or ``language-model``.
        augment (Callable | None): ``augment(x, rows, n, rng)``, the training augmentation of the
            batches x [m, b, ...] of workers ``rows`` (of n), drawn per worker and per sample from
            the numpy generator ``rng`` (the same draws for a worker whichever engine holds it; on
            the host, copied to x's device); never applied to the test set.
        resolved (dict): option values the data set derived (a text's vocabulary), which the
            run's config records.
        x_val, y_val (Tensor | None): a validation split held out of the training set
            (:meth:`hold_out`), or None.

    Example::

        >>> import torch
        >>> from gossamer.extend import Dataset
        >>> x, y = torch.randn(96, 1, 40), torch.randint(0, 10, (96,))
        >>> data = Dataset(x[:64], y[:64], x[64:], y[64:], num_classes=10)
        >>> data.input_shape, data.task
        ((1, 40), 'classification')
    """

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int
    task: str = "classification"
    augment: Callable[[torch.Tensor, range, int, np.random.Generator], torch.Tensor] | None = None
    resolved: dict = field(default_factory=dict)
    x_val: torch.Tensor | None = None
    y_val: torch.Tensor | None = None

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x_train.shape[1:])

    def to(self, device: torch.device, dtype: torch.dtype) -> Dataset:
        """On ``device``, floating inputs in ``dtype`` (targets and token inputs keep theirs)."""
        def move(t: torch.Tensor | None) -> torch.Tensor | None:
            if t is None:
                return None
            return t.to(device, dtype) if t.is_floating_point() else t.to(device)
        return replace(self, x_train=move(self.x_train), y_train=move(self.y_train),
                       x_test=move(self.x_test), y_test=move(self.y_test),
                       x_val=move(self.x_val), y_val=move(self.y_val))

    def hold_out(self, kept: torch.Tensor, held: torch.Tensor) -> Dataset:
        """The training samples ``kept`` as the training set, those ``held`` as the validation split."""
        return replace(self, x_train=self.x_train[kept], y_train=self.y_train[kept],
                       x_val=self.x_train[held], y_val=self.y_train[held])

    def train_batch(self, idx: torch.Tensor, rows: range, rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and targets of workers ``rows``, whose batches are ``idx[rows]`` (``idx``: every
        worker's sample indices [n, b]); augmented with the draws of ``rng`` (the step's stream) if
        the data set augments."""
        local = idx[rows.start : rows.stop]
        x = self.x_train[local]
        if self.augment is not None:
            x = self.augment(x, rows, idx.shape[0], rng)
        return x, self.y_train[local]


def load_dataset(cfg) -> Dataset:
    """The data set named by ``cfg.dataset``, built from its options."""
    return DATASETS[cfg.dataset].build(cfg)
