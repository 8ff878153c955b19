"""Deterministic randomness: a generator per (seed, round or epoch, worker, ...), never the global RNG,
so that every engine and a resumed run draw exactly alike."""

from __future__ import annotations

import torch

_MIX = 1_000_003


def generator(*keys: int) -> torch.Generator:
    """A CPU torch.Generator seeded by a polynomial hash of integer keys."""
    h = 0
    for k in keys:
        h = (h * _MIX + int(k)) % (2**63)
    return torch.Generator().manual_seed(h)
