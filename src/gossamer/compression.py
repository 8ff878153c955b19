"""Sign compression of model changes (Lin et al. 2020, sign-compressed post-local SGD).

A worker's change Δ since the last synchronisation is sent, per parameter tensor, as
C(Δ) = (‖Δ‖₁ / numel) · sign(Δ): one bit per coordinate and one float32 scale per tensor.
Zeros are sent as +1 (a bit has two states). The message is packed into bytes for the wire.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .engines.comm import BYTES_PER_VALUE


@dataclass
class SignMessage:
    """The compressed changes of m workers: ``positive`` bool [m, d] (Δ ≥ 0) and ``scales`` [m, T]."""

    positive: torch.Tensor
    scales: torch.Tensor

    @property
    def nbytes(self) -> int:
        """Wire size of one worker's message: ⌈d/8⌉ bytes of signs plus a float32 per tensor."""
        return -(-self.positive.shape[1] // 8) + BYTES_PER_VALUE * self.scales.shape[1]


def sign_compress(delta: torch.Tensor, numels: list[int]) -> SignMessage:
    """C(Δ) per tensor; ``numels`` are the sizes of the consecutive tensors of a row."""
    scales = torch.stack([part.abs().mean(1) for part in delta.split(numels, dim=1)], dim=1)
    return SignMessage(delta >= 0, scales)


def sign_decompress(message: SignMessage, numels: list[int]) -> torch.Tensor:
    """The dense rows [m, d] a message stands for: ±scale of each tensor."""
    sizes = torch.as_tensor(numels, device=message.scales.device)
    magnitude = message.scales.repeat_interleave(sizes, dim=1)
    return torch.where(message.positive, magnitude, -magnitude)


_BIT_WEIGHTS = 2 ** torch.arange(7, -1, -1, dtype=torch.uint8)


def pack_bits(positive: torch.Tensor) -> torch.Tensor:
    """bool [m, d] → uint8 [m, ⌈d/8⌉], most significant bit first."""
    m, d = positive.shape
    padded = torch.zeros(m, -(-d // 8) * 8, dtype=torch.uint8, device=positive.device)
    padded[:, :d] = positive
    return (padded.view(m, -1, 8) * _BIT_WEIGHTS.to(positive.device)).sum(2, dtype=torch.uint8)


def unpack_bits(packed: torch.Tensor, d: int) -> torch.Tensor:
    """uint8 [m, ⌈d/8⌉] → bool [m, d] (inverse of :func:`pack_bits`)."""
    bits = packed.unsqueeze(2).bitwise_and(_BIT_WEIGHTS.to(packed.device)).ne(0)
    return bits.view(packed.shape[0], -1)[:, :d]
