"""DeMo, Decoupled Momentum Optimization (Peng, Quesnelle, Kingma 2024): only the fast components
of each worker's momentum travel."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ..codecs import BYTES_PER_VALUE, as_bytes, from_bytes
from ..registry import ConfigError, positive_ints
from .schedule import ALGORITHMS, Context, Schedule, Step


def dct_matrix(s: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The orthonormal DCT-II of size s: D[k, j] = √(2/s) c_k cos(π(2j + 1)k / 2s), c_0 = 1/√2."""
    k = torch.arange(s, dtype=torch.float64).unsqueeze(1)
    j = torch.arange(s, dtype=torch.float64).unsqueeze(0)
    D = math.sqrt(2 / s) * torch.cos(math.pi * (2 * j + 1) * k / (2 * s))
    D[0] /= math.sqrt(2)
    return D.to(dtype=dtype, device=device)


def chunk_size(numel: int, target: int) -> int:
    """The largest divisor of ``numel`` at most ``target``: the tensor's DCT chunk length."""
    return max(s for s in range(1, min(numel, target) + 1) if numel % s == 0)


@dataclass
class DecoupledMomentum(Schedule):
    """DeMo: before the local step, each worker i

    - accumulates its momentum m_i ← β m_i + g_i;
    - takes the DCT-II q of each chunk of m_i (each parameter tensor split into chunks of s_t
      coordinates) and keeps the k_t = min(k, s_t) components of largest |q| per chunk, q̂_i:
      float32 values and int32 indices, 8 Σ_t (d_t/s_t) k_t bytes;
    - removes what it sends: m_i ← m_i − IDCT(q̂_i);
    - all-gathers the q̂_j, Q = (1/n) Σ_j IDCT(q̂_j), and steps with g_i ← sign(Q) (the local
      optimizer: SGD without momentum, x ← x − η sign(Q)).

    Every worker decodes the same messages, so the models stay identical; buffers (BatchNorm
    statistics) stay local.
    """

    beta: float
    numels: list[int]
    sizes: list[int]  # s_t
    kept: list[int]  # k_t
    momentum: torch.Tensor
    bases: dict[int, torch.Tensor] = field(default_factory=dict)  # DCT matrix per chunk size

    def _parts(self, rows: torch.Tensor):
        """Per tensor: its columns of ``rows`` as chunks [m, d_t/s_t, s_t] and its DCT matrix."""
        for part, s in zip(rows.split(self.numels, dim=1), self.sizes):
            if s not in self.bases:
                self.bases[s] = dct_matrix(s, rows.dtype, rows.device)
            yield part.reshape(rows.shape[0], -1, s), self.bases[s]

    def encode(self, M: torch.Tensor) -> torch.Tensor:
        """Rows of momentum [m, d] → messages uint8 [m, 8 Σ (d_t/s_t) k_t]: values, then indices."""
        values, index = [], []
        for (chunks, D), k in zip(self._parts(M), self.kept):
            q = chunks @ D.T
            top = q.abs().topk(k, dim=2, sorted=False).indices
            values.append(q.gather(2, top).flatten(1))
            index.append(top.flatten(1))
        return torch.cat([as_bytes(torch.cat(values, 1)), torch.cat(index, 1).to(torch.int32).view(torch.uint8)], 1)

    def decode(self, messages: torch.Tensor) -> torch.Tensor:
        """Messages → the dense rows IDCT(q̂) [m, d] they stand for."""
        n_kept = sum(n // s * k for n, s, k in zip(self.numels, self.sizes, self.kept))
        values = from_bytes(messages[:, : BYTES_PER_VALUE * n_kept], self.momentum.dtype)
        index = from_bytes(messages[:, BYTES_PER_VALUE * n_kept :], torch.int64, torch.int32)
        out, start = torch.zeros(messages.shape[0], sum(self.numels), dtype=values.dtype, device=values.device), 0
        for (chunks, D), k in zip(self._parts(out), self.kept):
            size = chunks.shape[1] * k
            q = torch.zeros_like(chunks).scatter_(2, index[:, start : start + size].view(-1, chunks.shape[1], k),
                                                 values[:, start : start + size].view(-1, chunks.shape[1], k))
            chunks.copy_(q @ D)
            start += size
        return out

    def on_gradients(self, engine, X: torch.Tensor, G: torch.Tensor, step: Step) -> None:
        M = self.momentum.mul_(self.beta).add_(G)
        messages = self.encode(M)
        M.sub_(self.decode(messages))
        G.copy_(engine.all_gather(messages).mean(self.decode)).sign_()

    def state_dict(self) -> dict:
        return {"rows": {"momentum": self.momentum}}

    def load_state_dict(self, state: dict) -> None:
        self.momentum.copy_(state["rows"]["momentum"])


@dataclass
class DecoupledMomentumOptions:
    demo_beta: float = 0.999  # β: decay of the local momentum
    demo_chunk: int = 64  # s: DCT chunk length (each tensor's largest divisor at most s)
    demo_topk: int = 32  # k: components sent per chunk

    def validate(self, cfg) -> None:
        positive_ints(self, "demo_chunk", "demo_topk")
        if not 0 <= self.demo_beta < 1:
            raise ConfigError(f"demo_beta must be in [0, 1), got {self.demo_beta}")


@ALGORITHMS.register("decoupled-momentum", options=DecoupledMomentumOptions, example=("demo_chunk=8", "demo_topk=2"),
                     requires={"optimizer": "sgd", "momentum": 0.0, "nesterov": False, "average_optimizer_state": False},
                     requires_why="it keeps its own momentum, demo_beta, and steps with sign(Q)",
                     help="DeMo: local momentum, top-k DCT components per chunk all-gathered, sign step (Peng et al.)")
def _decoupled_momentum(cfg, ctx: Context) -> DecoupledMomentum:
    sizes = [chunk_size(n, cfg.demo_chunk) for n in ctx.numels]
    return DecoupledMomentum(cfg.demo_beta, ctx.numels, sizes, [min(cfg.demo_topk, s) for s in sizes],
                             torch.zeros_like(ctx.X))
