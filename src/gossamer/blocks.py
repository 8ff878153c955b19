"""Tensors cut into 2-D blocks, as the DeMo and Templar (SparseLoCo) codes chunk them: each
parameter tensor is a matrix A × B — a 2-D weight as it is, a 1-D one as 1 × d (the references'
1-D chunks), a convolution kernel as out × (in·k…) (the references take only 1-D and 2-D tensors;
this is our rule) — and each side is cut into blocks of its largest divisor at most s (the
references' ``_get_smaller_split``): (A/n₁)·(B/n₂) blocks of n₁ × n₂, in row-major order."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch


def chunk_size(n: int, target: int) -> int:
    """The largest divisor of n at most ``target``: a side's block length."""
    return max(s for s in range(1, min(n, target) + 1) if n % s == 0)


def as_matrix(shape: tuple[int, ...]) -> tuple[int, int]:
    """A tensor's A × B: a matrix as it is, a vector as 1 × d, a kernel as out × (the rest)."""
    if len(shape) <= 1:
        return 1, math.prod(shape)
    return shape[0], math.prod(shape[1:])


@dataclass(frozen=True)
class Blocks:
    """One tensor's blocks: A × B cut into (A/n₁)·(B/n₂) blocks of n₁ × n₂, k kept per block."""

    A: int
    B: int
    n1: int
    n2: int
    k: int

    @classmethod
    def of(cls, shape: tuple[int, ...], chunk: int, kept: Callable[[int], int]) -> Blocks:
        """The blocks of a tensor of ``shape`` with sides at most ``chunk``, ``kept(n₁·n₂)`` kept per block."""
        A, B = as_matrix(shape)
        n1, n2 = chunk_size(A, chunk), chunk_size(B, chunk)
        return cls(A, B, n1, n2, kept(n1 * n2))

    @property
    def count(self) -> int:
        return self.A // self.n1 * (self.B // self.n2)

    @property
    def size(self) -> int:
        return self.n1 * self.n2

    def split(self, rows: torch.Tensor) -> torch.Tensor:
        """Rows [m, A·B] → their blocks [m, A/n₁, n₁, B/n₂, n₂] (a view)."""
        return rows.view(rows.shape[0], self.A // self.n1, self.n1, self.B // self.n2, self.n2)

    def flat(self, rows: torch.Tensor) -> torch.Tensor:
        """Rows [m, A·B] → each block's entries in row-major order, [m, blocks, n₁·n₂] (a copy)."""
        return self.split(rows).permute(0, 1, 3, 2, 4).reshape(rows.shape[0], self.count, self.size)

    def positions(self, device: torch.device) -> torch.Tensor:
        """[blocks, n₁·n₂]: the column in the tensor's A·B of each block entry (the inverse of :meth:`flat`)."""
        return self.flat(torch.arange(self.A * self.B, device=device).unsqueeze(0))[0]
