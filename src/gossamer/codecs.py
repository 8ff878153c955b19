"""Codecs: how a worker's model change travels compressed, and its exact size on the wire.

A codec turns rows of changes Δ [m, d] into byte messages [m, B] (``encode``) and back into the
dense rows they stand for (``decode``); engines only move the bytes (an all-gather), so a new
compressor is one registered builder here. The ``compression`` config value names one:
``sign``, or ``ef-`` + a codec (``ef-sign``) for error feedback, which keeps the residual
e ← (Δ + e) − C(Δ + e) locally and adds it to the next change (:class:`Compressor`).

- ``sign`` (Lin et al. 2020, sign-compressed post-local SGD): per parameter tensor,
  C(Δ) = (‖Δ‖₁ / numel) · sign(Δ): one bit per coordinate and one float32 scale per tensor,
  ⌈d/8⌉ + 4·T bytes. A bit has two states, so an exact zero is sent as +1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from .registry import Registry

CODECS = Registry("compression")
ERROR_FEEDBACK = "ef-"


class Codec(Protocol):
    """Encode rows of changes into byte messages, decode them, and say their size on the wire."""

    def nbytes(self) -> int: ...

    def encode(self, delta: torch.Tensor) -> torch.Tensor: ...

    def decode(self, messages: torch.Tensor) -> torch.Tensor: ...


@dataclass
class SignCodec:
    """C(Δ) = (‖Δ‖₁ / numel) · sign(Δ) per tensor; ``numels`` are the sizes of a row's tensors."""

    numels: list[int]
    dtype: torch.dtype = torch.float32

    def nbytes(self) -> int:
        """Wire size of one worker's message: ⌈d/8⌉ bytes of signs plus a float32 per tensor."""
        return -(-sum(self.numels) // 8) + 4 * len(self.numels)

    def encode(self, delta: torch.Tensor) -> torch.Tensor:
        """Rows of changes [m, d] → messages uint8 [m, nbytes]: packed signs, then float32 scales."""
        scales = torch.stack([part.abs().mean(1) for part in delta.split(self.numels, dim=1)], dim=1)
        scale_bytes = scales.to(torch.float32).contiguous().view(torch.uint8)
        return torch.cat([pack_bits(delta >= 0), scale_bytes], dim=1)

    def decode(self, messages: torch.Tensor) -> torch.Tensor:
        """Messages uint8 [k, nbytes] → the dense rows [k, d] they stand for: ±scale of each tensor."""
        d, T = sum(self.numels), len(self.numels)
        packed = messages[:, : -4 * T]
        scales = messages[:, -4 * T :].clone(memory_format=torch.contiguous_format).view(torch.float32).to(self.dtype)
        sizes = torch.as_tensor(self.numels, device=messages.device)
        magnitude = scales.repeat_interleave(sizes, dim=1)
        return torch.where(unpack_bits(packed, d), magnitude, -magnitude)


@CODECS.register("sign", help="(‖Δ‖₁/numel)·sign(Δ) per tensor: 1 bit a coordinate + a float32 scale a tensor")
def _sign(param: str | None, numels: list[int], dtype: torch.dtype) -> SignCodec:
    return SignCodec(numels, dtype)


@dataclass
class Compressor:
    """One compressed channel (one sync level): a codec and, with error feedback, its residual e."""

    codec: Codec
    residual: torch.Tensor | None = None

    def compress(self, delta: torch.Tensor) -> torch.Tensor:
        """The messages for Δ (+ e); with error feedback, e ← (Δ + e) − C(Δ + e)."""
        if self.residual is not None:
            delta = delta + self.residual
        messages = self.codec.encode(delta)
        if self.residual is not None:
            self.residual = delta - self.codec.decode(messages)
        return messages


def build_compressor(spec: str, numels: list[int], like: torch.Tensor) -> Compressor:
    """The compressor named by ``spec`` (``sign``, ``ef-sign``, ...) for rows shaped like ``like``."""
    error_feedback = spec.startswith(ERROR_FEEDBACK)
    entry, param = CODECS.parse(spec.removeprefix(ERROR_FEEDBACK))
    codec = entry.build(param, numels, like.dtype)
    return Compressor(codec, torch.zeros_like(like) if error_feedback else None)


def check_spec(spec: str) -> None:
    """Raise a ConfigError unless ``spec`` names a codec (with or without ``ef-``)."""
    CODECS.parse(spec.removeprefix(ERROR_FEEDBACK))


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
