"""Row-wise local optimizers: one step for all workers at once on the worker matrix.

State (momentum buffers) has the shape of X and is *local*: row i belongs to worker i and is
never communicated. Both papers keep it local; during all-reduce training every worker sees the
same averaged gradient, so the local buffers stay identical and equal one global buffer (the
update is linear), and local SGD averages parameters only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass
class SGD:
    """SGD with momentum μ, optional Nesterov, and weight decay λ (torch.optim.SGD semantics).

    g ← G + λ·mask ⊙ X;  M ← μ M + g;  X ← X − η (g + μ M if Nesterov else M).
    ``decay`` is the per-coordinate λ·mask [d] (0 where a parameter gets no decay).
    """

    momentum: float = 0.0
    nesterov: bool = False
    decay: torch.Tensor | None = None

    def init(self, X: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"momentum": torch.zeros_like(X)} if self.momentum else {}

    def step(self, X: torch.Tensor, G: torch.Tensor, state: dict[str, torch.Tensor], lr: float) -> None:
        """Update X in place; G is used as scratch."""
        if self.decay is not None:
            G.addcmul_(X, self.decay)
        if not self.momentum:
            X.add_(G, alpha=-lr)
            return
        M = state["momentum"]
        M.mul_(self.momentum).add_(G)
        if self.nesterov:
            X.add_(G.add_(M, alpha=self.momentum), alpha=-lr)
        else:
            X.add_(M, alpha=-lr)


@dataclass
class Adam:
    """Adam / AdamW for all workers at once (torch.optim.Adam / AdamW semantics).

    m ← β₁m + (1−β₁)g;  v ← β₂v + (1−β₂)g²;  X ← X − η · (m / (1−β₁ᵗ)) / (√(v / (1−β₂ᵗ)) + ε).
    Adam adds λ·X to g (L2); AdamW decouples it: X ← X − ηλX before the step. The moments are
    per worker (decentralized Adam, Kong et al.); the step count t is shared (lock-step workers).
    """

    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    decay: torch.Tensor | None = None
    decoupled: bool = False  # AdamW
    t: int = 0

    def init(self, X: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"exp_avg": torch.zeros_like(X), "exp_avg_sq": torch.zeros_like(X)}

    def step(self, X: torch.Tensor, G: torch.Tensor, state: dict[str, torch.Tensor], lr: float) -> None:
        """Update X in place; G is used as scratch."""
        beta1, beta2 = self.betas
        self.t += 1
        if self.decay is not None:
            if self.decoupled:
                X.addcmul_(X, self.decay, value=-lr)
            else:
                G.addcmul_(X, self.decay)
        m, v = state["exp_avg"], state["exp_avg_sq"]
        m.lerp_(G, 1 - beta1)
        v.mul_(beta2).addcmul_(G, G, value=1 - beta2)
        denom = (v.sqrt() / math.sqrt(1 - beta2**self.t)).add_(self.eps)
        X.addcdiv_(m, denom, value=-lr / (1 - beta1**self.t))


def decay_vector(slots, no_decay: list[bool], weight_decay: float, like: torch.Tensor) -> torch.Tensor | None:
    """λ per coordinate of a row: 0 for parameters flagged no-decay; None when λ = 0."""
    if weight_decay == 0:
        return None
    parts = [torch.full((s.numel,), 0.0 if skip else weight_decay) for s, skip in zip(slots, no_decay)]
    return torch.cat(parts).to(like)
