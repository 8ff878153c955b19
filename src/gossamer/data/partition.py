"""Per-worker batch indices for n lock-step workers: i.i.d. and Dirichlet non-i.i.d. splits.

Every function returns indices shaped [steps, n, batch_size]; worker i's batch at step s is
``indices[s, i]``. Identical arguments give identical indices.
"""

from __future__ import annotations

import numpy as np
import torch

from ..registry import ConfigError
from ..rng import epoch_generator, host_stream

_MAX_DRAWS = 100


def steps_per_epoch(num_train: int, n: int, batch_size: int) -> int:
    """Steps every worker takes per epoch: (num_train // n) // batch_size, which must be >= 1."""
    steps = (num_train // n) // batch_size
    if steps == 0:
        raise ConfigError(
            f"batch_size={batch_size} is larger than each worker's share of the data "
            f"({num_train} samples / {n} workers = {num_train // n}); reduce batch_size or workers"
        )
    return steps


def validation_size(num_train: int, fraction: float, n: int, batch_size: int) -> int:
    """⌊fraction·N⌋, the samples a validation split holds out. Refused (naming validation_fraction)
    if it holds out nothing or leaves a worker less than one batch."""
    held = int(fraction * num_train)
    kept = num_train - held
    if held == 0 or kept // n < batch_size:
        what = "holds out no sample" if held == 0 else f"leaves {kept} samples, {kept // n} per worker"
        raise ConfigError(f"validation_fraction={fraction} of the {num_train} training samples {what}; "
                          f"{n} workers need at least batch_size={batch_size} each")
    return held


def validation_split(num_train: int, fraction: float, seed: int, n: int, batch_size: int
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """(kept, held out): disjoint sorted training-set indices, the held-out part the first
    :func:`validation_size` of a permutation drawn from the seed."""
    held = validation_size(num_train, fraction, n, batch_size)
    perm = torch.from_numpy(host_stream("validation", seed).permutation(num_train))
    return perm[held:].sort().values, perm[:held].sort().values


def iid_epoch_indices(num_train: int, n: int, batch_size: int, epoch: int, seed: int) -> torch.Tensor:
    """Disjoint i.i.d. shards, redrawn every epoch, cut into consecutive batches: int64 [steps, n, batch_size]."""
    steps = steps_per_epoch(num_train, n, batch_size)
    shard = num_train // n
    perm = torch.randperm(num_train, generator=epoch_generator(seed, epoch))
    per_worker = perm[: n * shard].view(n, shard)[:, : steps * batch_size]
    return per_worker.reshape(n, steps, batch_size).transpose(0, 1).contiguous()


def _dirichlet_split(labels: np.ndarray, n: int, alpha: float, rng: np.random.Generator) -> list[np.ndarray]:
    parts: list[list[np.ndarray]] = [[] for _ in range(n)]
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        cuts = (np.cumsum(rng.dirichlet(np.full(n, alpha)))[:-1] * len(idx)).astype(int)
        for i, piece in enumerate(np.split(idx, cuts)):
            parts[i].append(piece)
    return [np.sort(np.concatenate(p)) for p in parts]


def dirichlet_shards(labels: torch.Tensor, n: int, alpha: float, seed: int, min_size: int) -> list[torch.Tensor]:
    """Fixed non-i.i.d. shards: each class is split among workers with proportions ~ Dirichlet(alpha).

    Redraws (attempts 0, 1, ... of the ``dirichlet`` stream) up to 100 times until every shard has
    >= min_size samples.
    """
    y = labels.cpu().numpy()
    for attempt in range(_MAX_DRAWS):
        parts = _dirichlet_split(y, n, alpha, host_stream("dirichlet", seed, attempt))
        if min(len(p) for p in parts) >= min_size:
            return [torch.as_tensor(p, dtype=torch.int64) for p in parts]
    raise ConfigError(
        f"dirichlet_alpha={alpha} left some of the {n} workers with fewer than {min_size} samples "
        f"in {_MAX_DRAWS} draws; increase dirichlet_alpha or reduce workers/batch_size"
    )


def shard_epoch_indices(shards: list[torch.Tensor], steps: int, batch_size: int, epoch: int, seed: int) -> torch.Tensor:
    """Each worker shuffles its own shard every epoch (tiled if short): int64 [steps, n, batch_size]."""
    need = steps * batch_size
    rows = []
    for i, shard in enumerate(shards):
        if len(shard) == 0:
            raise ValueError(f"worker {i} has an empty shard")
        perm = shard[torch.from_numpy(host_stream("shard-shuffle", seed, epoch, i).permutation(len(shard)))]
        reps = -(-need // len(perm))
        rows.append(perm.repeat(reps)[:need])
    return torch.stack(rows).view(len(shards), steps, batch_size).transpose(0, 1).contiguous()
