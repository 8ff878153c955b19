"""DeMo, Decoupled Momentum Optimization (Peng, Quesnelle, Kingma 2024): only the fast components
of each worker's momentum travel — as the authors' code does it (github.com/bloc97/DeMo,
``demo.py`` at 0e48145: ``DeMo.step``, ``TransformDCT``, ``CompressDCT``).

**Blocks.** Each parameter tensor is cut into 2-D blocks as :mod:`gossamer.blocks` says, each
side at most s (``demo_chunk``): n₁ × n₂ blocks, each with its 2-D orthonormal DCT-II,
q = D₁ X D₂ᵀ. ``demo_topk`` k components of largest |q| are sent per block (all of a block with
at most k, as the reference clamps): k of s² for the blocks of a large matrix, k of n₂ ≤ s for a
vector's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ..blocks import Blocks
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


@dataclass
class DecoupledMomentum(Schedule):
    """DeMo, per worker i and step t (learning rate η_t), before the local step:

    - δ_i ← β δ_i + η_t g_i (``demo_beta``; the learning rate inside, as the reference);
    - per block, q = DCT₂(δ_i) and its k components of largest |q|, q̂_i: float32 values and int32
      indices, 8 Σ_t blocks_t·k_t bytes (the reference sends int64 indices);
    - δ_i ← δ_i − IDCT₂(q̂_i) (what it sends leaves the momentum);
    - all-gathers the q̂_j; each component is the mean over the workers that sent it (the
      reference's ``scatter_reduce(mean, include_self=False)``), Q = IDCT₂ of them;
    - steps with g_i ← sign(Q) (SGD without momentum: x ← x − η_t sign(Q)).

    Every worker decodes the same messages, so the models stay identical; buffers stay local."""

    beta: float
    blocks: list[Blocks]
    momentum: torch.Tensor
    bases: dict[int, torch.Tensor] = field(default_factory=dict)  # DCT matrix per block side

    def _basis(self, s: int, like: torch.Tensor) -> torch.Tensor:
        if s not in self.bases:
            self.bases[s] = dct_matrix(s, like.dtype, like.device)
        return self.bases[s]

    def _tensors(self, rows: torch.Tensor):
        """Per tensor: its blocks of ``rows`` [m, Y, n₁, X, n₂], their DCT matrices and layout."""
        for part, b in zip(rows.split([b.A * b.B for b in self.blocks], dim=1), self.blocks):
            yield b.split(part), self._basis(b.n1, rows), self._basis(b.n2, rows), b

    def coefficients(self, M: torch.Tensor) -> list[torch.Tensor]:
        """Per tensor, the 2-D DCT of each block: [m, Y·X, n₁·n₂]."""
        return [torch.einsum("myhxw,bh,dw->myxbd", x, D1, D2).flatten(3).flatten(1, 2)
                for x, D1, D2, _ in self._tensors(M)]

    def inverse(self, coefficients: list[torch.Tensor], out: torch.Tensor) -> torch.Tensor:
        """Write the inverse 2-D DCT of per-tensor block coefficients into ``out`` [m, d]."""
        for q, (x, D1, D2, b) in zip(coefficients, self._tensors(out)):
            q = q.view(q.shape[0], b.A // b.n1, b.B // b.n2, b.n1, b.n2)
            x.copy_(torch.einsum("myxbd,bh,dw->myhxw", q, D1, D2))
        return out

    def encode(self, M: torch.Tensor) -> torch.Tensor:
        """Rows of momentum [m, d] → messages uint8 [m, 8 Σ blocks·k]: values, then indices."""
        values, index = [], []
        for q, b in zip(self.coefficients(M), self.blocks):
            top = q.abs().topk(b.k, dim=2, sorted=False).indices
            values.append(q.gather(2, top).flatten(1))
            index.append(top.flatten(1))
        return torch.cat([as_bytes(torch.cat(values, 1)), torch.cat(index, 1).to(torch.int32).view(torch.uint8)], 1)

    def scatter(self, messages: torch.Tensor, senders: bool = False) -> torch.Tensor:
        """Messages → [m, d]: each one's coefficients in place (zeros elsewhere); with ``senders``
        [m, 2d], then a 1 where it sent a component — so that a mean over senders is a ratio of two
        means."""
        sent = sum(b.count * b.k for b in self.blocks)
        values = from_bytes(messages[:, : BYTES_PER_VALUE * sent], self.momentum.dtype)
        index = from_bytes(messages[:, BYTES_PER_VALUE * sent :], torch.int64, torch.int32)
        dense, start = [], 0
        for b in self.blocks:
            size = b.count * b.k
            where = index[:, start : start + size].view(-1, b.count, b.k)
            q = torch.zeros(messages.shape[0], b.count, b.n1 * b.n2, dtype=values.dtype, device=values.device)
            dense.append((q.scatter(2, where, values[:, start : start + size].view(-1, b.count, b.k)),
                          q.scatter(2, where, 1.0) if senders else None))
            start += size
        return torch.cat([q.flatten(1) for q, _ in dense] + ([c.flatten(1) for _, c in dense] if senders else []), 1)

    def _per_tensor(self, flat: torch.Tensor) -> list[torch.Tensor]:
        return [q.view(q.shape[0], b.count, -1) for q, b in zip(flat.split([b.A * b.B for b in self.blocks], 1),
                                                                self.blocks)]

    def on_gradients(self, engine, X: torch.Tensor, G: torch.Tensor, step: Step) -> None:
        d = X.shape[1]
        M = self.momentum.mul_(self.beta).add_(G, alpha=step.lr)
        messages = self.encode(M)
        M.sub_(self.inverse(self._per_tensor(self.scatter(messages)), torch.empty_like(M)))
        mean = engine.all_gather(messages).mean(lambda m: self.scatter(m, senders=True))  # mean values, mean senders
        total, senders = mean[:, :d], mean[:, d:]
        Q = torch.where(senders > 0, total / senders.clamp(min=1 / engine.n), 0.0)
        G.copy_(self.inverse(self._per_tensor(Q), G)).sign_()

    def state_dict(self) -> dict:
        return {"rows": {"momentum": self.momentum}}

    def load_state_dict(self, state: dict) -> None:
        self.momentum.copy_(state["rows"]["momentum"])


@dataclass
class DecoupledMomentumOptions:
    demo_beta: float = 0.999  # β: decay of the local momentum (the reference's compression_decay)
    demo_chunk: int = 64  # s: DCT block side (each side's largest divisor at most s; compression_chunk)
    demo_topk: int = 32  # k: components sent per block (compression_topk)

    def validate(self, cfg) -> None:
        positive_ints(self, "demo_chunk", "demo_topk")
        if not 0 <= self.demo_beta < 1:
            raise ConfigError(f"demo_beta must be in [0, 1), got {self.demo_beta}")
        if self.demo_topk >= self.demo_chunk**2:
            raise ConfigError(f"demo_topk={self.demo_topk} sends every component of every block (a block has at "
                              f"most demo_chunk² = {self.demo_chunk**2}): no compression; give demo_topk below "
                              f"{self.demo_chunk**2}")


def demo_blocks(shapes: list[tuple[int, ...]], chunk: int, topk: int) -> list[Blocks]:
    """Each tensor's blocks (:mod:`gossamer.blocks`) and the k kept per block (all of a smaller block)."""
    return [Blocks.of(shape, chunk, lambda size: min(topk, size)) for shape in shapes]


@ALGORITHMS.register("decoupled-momentum", options=DecoupledMomentumOptions, example=("demo_chunk=8", "demo_topk=2"),
                     requires={"optimizer": "sgd", "momentum": 0.0, "nesterov": False, "average_optimizer_state": False},
                     requires_why="it keeps its own momentum, demo_beta, and steps with sign(Q)",
                     help="DeMo: local momentum, top-k 2-D DCT components per block all-gathered and averaged over "
                          "their senders, sign step (Peng et al.; the authors' code)")
def _decoupled_momentum(cfg, ctx: Context) -> DecoupledMomentum:
    shapes = ctx.shapes or [(n,) for n in ctx.numels]
    return DecoupledMomentum(cfg.demo_beta, demo_blocks(shapes, cfg.demo_chunk, cfg.demo_topk), torch.zeros_like(ctx.X))
