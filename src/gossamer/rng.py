"""Deterministic randomness: a generator per (seed, round or epoch, worker, ...), never the global RNG,
so that every engine and a resumed run draw exactly alike."""

from __future__ import annotations

import numpy as np
import torch

_MIX = 1_000_003


def _hash(keys) -> int:
    h = 0
    for k in keys:
        h = (h * _MIX + int(k)) % (2**63)
    return h


def generator(*keys: int) -> torch.Generator:
    """A CPU torch.Generator seeded by a polynomial hash of integer keys."""
    return torch.Generator().manual_seed(_hash(keys))


def host_generator(*keys: int) -> np.random.Generator:
    """A NumPy generator seeded by the same hash: for the draws the host acts on (event times and
    order), which then read no tensor back."""
    return np.random.default_rng(_hash(keys))
