"""Codecs: how a worker's model change travels compressed, and its exact size on the wire.

A codec turns rows of changes Δ [m, d] into messages [m, B] (``encode``) and back into the dense
rows they stand for (``decode``); engines only move the messages, so a new compressor is one
registered builder here. The ``compression`` config value names one — ``sign``, ``top-k:F``,
``random-k:F``, ``qsgd:S``, ``quant:B``, or a chain ``top-k:F+quant:B`` — or ``ef-`` + a codec for error feedback, which keeps the residual
e ← (Δ + e) − C(Δ + e) locally and adds it to the next change (:class:`Compressor`). Every codec
works per parameter tensor (T tensors of sizes d_t in a row); a message is exactly ``nbytes()``
bytes (float32 values, int32 indices):

- ``sign`` (Lin et al. 2020): C(Δ) = (‖Δ‖₁ / d_t) · sign(Δ): one bit a coordinate and one
  float32 scale a tensor, ⌈d/8⌉ + 4T bytes. A bit has two states, so an exact zero (a coordinate
  that did not move) is sent as +1 or −1 by a fair coin of the worker's row (row stream
  ``sign``: seed, round; a row per worker): E sign = 0 = sign(0), so unchanged coordinates do not drift.
- ``top-k:F`` (Stich et al. 2018): the k_t = ⌈F·d_t⌉ entries of largest magnitude, as int32
  indices and float32 values: 8 Σ k_t bytes. Biased; ‖C(Δ) − Δ‖² ≤ (1 − k_t/d_t)‖Δ‖².
- ``random-k:F``: k_t coordinates drawn uniformly without replacement from a generator that
  every worker seeds alike (stream ``random-k``: seed, round, tensor), so the indices are not sent: 4 Σ k_t
  bytes. Unbiased form (d_t / k_t)·Δ_S.
- ``qsgd:S`` (Alistarh et al. 2017): per tensor ‖Δ‖₂ · sign(Δ_j) · ξ_j / S, with ξ_j ∈ {0..S}
  rounded up from S|Δ_j|/‖Δ‖₂ with probability equal to its fractional part (a row per
  worker, row stream ``qsgd``: seed, round): unbiased. Sign and level take
  1 + ⌈log₂(S + 1)⌉ bits a coordinate, plus a float32 norm a tensor.
- ``quant:B`` (B-bit uniform quantisation): per tensor a float32 scale s_t = max_j |Δ_j| (rounded
  up to float32), each coordinate a level ℓ_j ∈ {−L..L}, L = 2^(B−1) − 1, standing for s_t ℓ_j / L,
  rounded stochastically (ℓ_j = ⌊u_j⌋ + [U_j < u_j − ⌊u_j⌋], u_j = L Δ_j / s_t; U_j from the
  worker's row, row stream ``quant``: seed, round): unbiased. B bits a coordinate, ⌈B·d/8⌉ + 4T bytes.
- chains ``S+V`` (``top-k:0.03+quant:2``, SparseLoCo's codec): the sparsifier S (top-k or
  random-k) picks the coordinates, and its kept values travel through V (``sign``, ``qsgd:S`` or
  ``quant:B``, per tensor over the k_t kept values) instead of as float32: V's bytes for the
  k_t values, plus S's int32 indices (none for random-k).

The two random codecs are unbiased, E C(Δ) = Δ, with variance E‖C(Δ) − Δ‖² ≤ ω_t‖Δ‖²
(ω_t = d_t/k_t − 1 for random-k, min(d_t/S², √d_t/S) for QSGD). Error feedback and CHOCO-SGD
need a contraction, ‖C(Δ) − Δ‖² ≤ (1 − δ)‖Δ‖² in expectation: for them the codec is built
``contractive`` and decodes C(Δ)/τ_t with τ_t = 1 + ω_t (Koloskova, Stich, Jaggi 2019, which
for random-k is the plain kept coordinates) — the same bytes, decoded alike by every receiver.
``quant:B``'s contractive form rounds to the nearest level instead: its grid holds 0 and ±s_t,
so |C(Δ)_j − Δ_j| ≤ |Δ_j| and the largest coordinate is exact: ‖C(Δ) − Δ‖² ≤ (1 − 1/d_t)‖Δ‖²
(deterministic, as SparseLoCo's error-feedback quantiser), where the unbiased form's τ_t = 1 + d_t/(4L²)
would shrink every message.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Callable, Protocol

import numpy as np
import torch

from .registry import ConfigError, short
from .rng import host_stream, row_uniforms
# the registry and the byte layout SparseLoCo's codec shares (re-exported: gossamer.codecs.CODECS, ...)
from .codec_base import BYTES_PER_VALUE, CODECS, as_bytes, from_bytes, pack_codes, unpack_codes
from .codec_base import code_kind as _code_kind
from .codec_base import tensor_offsets as _offsets

ERROR_FEEDBACK = "ef-"


class Codec(Protocol):
    """Encode rows of changes into messages, decode them, and say their size on the wire.

    ``encode(delta [m, d], round, rows)`` → uint8 messages [m, nbytes()]; ``decode(messages,
    round)`` → the dense rows they stand for; ``round`` numbers the communication (the step);
    ``rows`` are the global worker indices of the rows encoded: random codecs seed their draws
    with them (:func:`worker_uniforms`), so that every engine draws alike. A codec whose
    receivers combine the all-gathered messages otherwise than by the mean of their decodings
    also has ``aggregate(gathered, round)`` (SparseLoCo's: :mod:`gossamer.sparseloco`). A
    ``CODECS`` entry's builder is ``(param, numels, dtype, seed, contractive)``; one registered
    ``shaped=True`` is built with the tensors' shapes too (``shapes=``).

    Example::

        >>> import torch
        >>> from gossamer.extend import CODECS, Codec
        >>> class Half:  # float16 on the wire: 2 bytes a value
        ...     def __init__(self, numels, dtype):
        ...         self.d, self.dtype = sum(numels), dtype
        ...     def nbytes(self):
        ...         return 2 * self.d
        ...     def encode(self, delta, round, rows):
        ...         return delta.to(torch.float16).view(torch.uint8)
        ...     def decode(self, messages, round):
        ...         return messages.view(torch.float16).to(self.dtype)
        >>> @CODECS.register("half", help="float16 values")
        ... def build(param, numels, dtype, seed, contractive):
        ...     return Half(numels, dtype)
        >>> codec: Codec = build(None, [3], torch.float32, 0, False)
        >>> messages = codec.encode(torch.tensor([[1.0, 2.0, 3.0]]), 0, range(1))
        >>> messages.shape[1] == codec.nbytes(), codec.decode(messages, 0)
        (True, tensor([[1., 2., 3.]]))
    """

    def nbytes(self) -> int: ...

    def encode(self, delta: torch.Tensor, round: int, rows: range) -> torch.Tensor: ...

    def decode(self, messages: torch.Tensor, round: int) -> torch.Tensor: ...


def worker_uniforms(name: str, seed: int, round: int, rows: range, d: int, dtype: torch.dtype,
                    device: torch.device) -> torch.Tensor:
    """A codec's uniform draws for the workers it encodes: each worker's own, whichever process encodes it.

    Args:
        name (str): a row stream (:func:`~gossamer.rng.declare` with ``row="worker"``), keyed by the round.
        seed (int): the run's seed.
        round (int): the communication round.
        rows (range): the global indices of the workers encoded.
        d (int): the draws a worker.
        dtype (torch.dtype): float32 or float64.
        device (torch.device): where the draws go.

    Returns:
        Tensor: U[0, 1) draws [len(rows), d], row i worker rows[i]'s.

    Example::

        >>> import torch
        >>> from gossamer.extend import worker_uniforms
        >>> both = worker_uniforms("qsgd", 0, 5, range(2), 3, torch.float32, torch.device("cpu"))
        >>> second = worker_uniforms("qsgd", 0, 5, range(1, 2), 3, torch.float32, torch.device("cpu"))
        >>> both.shape, torch.equal(both[1:], second)
        (torch.Size([2, 3]), True)
    """
    kind = np.float64 if dtype == torch.float64 else np.float32
    return torch.from_numpy(row_uniforms(name, seed, round, rows=rows, width=d, dtype=kind)).to(device)


def parse_fraction(name: str, param: str | None) -> float:
    """F of ``top-k:F`` / ``random-k:F``, a number in (0, 1]."""
    try:
        f = float(param)
    except (TypeError, ValueError):
        raise ConfigError(f"compression '{name}' takes a fraction F in (0, 1], e.g. {name}:0.01; got '{short(param)}'") from None
    if not 0 < f <= 1:
        raise ConfigError(f"compression '{name}' needs a fraction F in (0, 1], got {f}")
    return f


BLOCK_VALUES = 1 << 20  # the values of rows a codec's elementwise passes take at once


def in_row_blocks(method: Callable) -> Callable:
    """A codec's ``encode(rows [m, d], round, rows)`` or ``decode(messages [m, ·], round)`` taken
    ⌊BLOCK_VALUES/d⌋ rows at a time, the results stacked. Rows are independent, so each row's result
    is what one call gives it; the blocks' temporaries are reused by the allocator and stay in
    cache instead of being fresh n × d pages every pass (qsgd:4, 16,384 rows of the 1-D CNN:
    encode and decode 1.5× faster)."""
    @functools.wraps(method)
    def blocked(self, X: torch.Tensor, round: int = 0, rows: range | None = None) -> torch.Tensor:
        step = max(1, BLOCK_VALUES // max(1, sum(self.numels)))

        def block(a: int) -> torch.Tensor:
            part = X[a : a + step]
            return method(self, part, round) if rows is None else method(self, part, round, rows[a : a + step])
        return block(0) if X.shape[0] <= step else torch.cat([block(a) for a in range(0, X.shape[0], step)])
    return blocked


@dataclass
class SignCodec:
    """C(Δ) = (‖Δ‖₁ / numel) · sign(Δ) per tensor; ``numels`` are the sizes of a row's tensors.
    sign(0) is a fair coin per coordinate, drawn from row stream ``sign`` (seed, round; worker's row)."""

    numels: list[int]
    seed: int = 0
    dtype: torch.dtype = torch.float32

    def nbytes(self) -> int:
        """Wire size of one worker's message: ⌈d/8⌉ bytes of signs plus a float32 per tensor."""
        return -(-sum(self.numels) // 8) + BYTES_PER_VALUE * len(self.numels)

    @in_row_blocks
    def encode(self, delta: torch.Tensor, round: int, rows: range) -> torch.Tensor:
        """Rows of changes [m, d] of workers ``rows`` → messages uint8 [m, nbytes]: packed signs,
        then float32 scales."""
        scales = torch.stack([part.abs().mean(1) for part in delta.split(self.numels, dim=1)], dim=1)
        coins = worker_uniforms("sign", self.seed, round, rows, delta.shape[1], torch.float32, delta.device) < 0.5
        positive = (delta > 0) | ((delta == 0) & coins)
        return torch.cat([pack_codes(positive, 1), as_bytes(scales)], dim=1)

    @in_row_blocks
    def decode(self, messages: torch.Tensor, round: int = 0) -> torch.Tensor:
        """Messages uint8 [k, nbytes] → the dense rows [k, d] they stand for: ±scale of each tensor."""
        d, T = sum(self.numels), len(self.numels)
        scales = from_bytes(messages[:, -BYTES_PER_VALUE * T :], self.dtype)
        positive = unpack_codes(messages[:, : -BYTES_PER_VALUE * T], d, 1)
        return _negate_(_per_coordinate(scales, self.numels), positive ^ 1)


@dataclass
class Kept:
    """How a sparsifier's kept values [m, Σ k_t] travel: as float32, or through a ``values`` codec
    (a chain's second codec, built on the k_t as its tensor sizes)."""

    ks: list[int]
    values: Codec | None = None

    def value_nbytes(self) -> int:
        return BYTES_PER_VALUE * sum(self.ks) if self.values is None else self.values.nbytes()

    def encode_values(self, kept: torch.Tensor, round: int, rows: range) -> torch.Tensor:
        return as_bytes(kept) if self.values is None else self.values.encode(kept, round, rows)

    def decode_values(self, data: torch.Tensor, round: int, dtype: torch.dtype) -> torch.Tensor:
        return from_bytes(data, dtype) if self.values is None else self.values.decode(data, round)


@dataclass
class TopK:
    """The k_t = ⌈F·d_t⌉ largest-magnitude entries of each tensor: their values (float32, or
    through a chain's codec), then their int32 indices."""

    numels: list[int]
    fraction: float
    dtype: torch.dtype = torch.float32

    def __post_init__(self) -> None:
        self.kept = Kept(kept_per_tensor(self.fraction, self.numels))
        self.ks = self.kept.ks

    def nbytes(self) -> int:
        return self.kept.value_nbytes() + BYTES_PER_VALUE * sum(self.ks)

    def encode(self, delta: torch.Tensor, round: int = 0, rows: range = range(0)) -> torch.Tensor:
        parts = delta.split(self.numels, dim=1)
        index = [part.abs().topk(k, dim=1, sorted=False).indices for part, k in zip(parts, self.ks)]
        values = torch.cat([part.gather(1, i) for part, i in zip(parts, index)], 1)
        return torch.cat([self.kept.encode_values(values, round, rows),
                          torch.cat(index, 1).to(torch.int32).view(torch.uint8)], 1)

    def decode(self, messages: torch.Tensor, round: int = 0) -> torch.Tensor:
        split = self.kept.value_nbytes()
        values = self.kept.decode_values(messages[:, :split], round, self.dtype)
        index = from_bytes(messages[:, split:], torch.int64, torch.int32)
        offsets = torch.as_tensor(_offsets(self.numels), device=messages.device).repeat_interleave(
            torch.as_tensor(self.ks, device=messages.device))
        out = torch.zeros(messages.shape[0], sum(self.numels), dtype=self.dtype, device=messages.device)
        return out.scatter_(1, index + offsets, values)


@dataclass
class RandomK:
    """k_t = ⌈F·d_t⌉ coordinates per tensor, drawn alike by every worker from stream ``stream``
    (seed, round, tensor; SPARTA draws its own):
    only the values travel (float32, or through a chain's codec). Decodes (d_t/k_t)·Δ_S (unbiased) or Δ_S (``contractive``)."""

    numels: list[int]
    fraction: float
    seed: int = 0
    contractive: bool = False
    dtype: torch.dtype = torch.float32
    stream: str = "random-k"  # the random stream of its coordinates

    def __post_init__(self) -> None:
        self.kept = Kept(kept_per_tensor(self.fraction, self.numels))
        self.ks = self.kept.ks
        self.scale = [1.0 if self.contractive else n / k for n, k in zip(self.numels, self.ks)]

    def nbytes(self) -> int:
        return self.kept.value_nbytes()

    def coordinates(self, round: int, device: torch.device) -> torch.Tensor:
        """The kept coordinates of a row in this round (every worker draws the same)."""
        picks = [torch.from_numpy(host_stream(self.stream, self.seed, round, t).permutation(n)[:k]) + offset
                 for t, (n, k, offset) in enumerate(zip(self.numels, self.ks, _offsets(self.numels)))]
        return torch.cat(picks).to(device)

    def encode(self, delta: torch.Tensor, round: int, rows: range = range(0)) -> torch.Tensor:
        return self.kept.encode_values(delta[:, self.coordinates(round, delta.device)], round, rows)

    def decode(self, messages: torch.Tensor, round: int) -> torch.Tensor:
        values = self.kept.decode_values(messages, round, self.dtype) * _per_coordinate(
            torch.tensor([self.scale], dtype=self.dtype, device=messages.device), self.ks)
        out = torch.zeros(messages.shape[0], sum(self.numels), dtype=self.dtype, device=messages.device)
        out[:, self.coordinates(round, messages.device)] = values
        return out


@dataclass
class QSGD:
    """Stochastic quantisation to S levels per tensor (Alistarh et al. 2017): a float32 norm, then
    sign and level of every coordinate in 1 + ⌈log₂(S + 1)⌉ packed bits. Each worker draws its
    rounding from row stream ``qsgd`` (seed, round; the worker's row). ``contractive`` decodes Q(Δ)/τ_t, τ_t = 1 + min(d_t/S², √d_t/S)."""

    numels: list[int]
    levels: int
    seed: int = 0
    contractive: bool = False
    dtype: torch.dtype = torch.float32

    def __post_init__(self) -> None:
        self.level_bits = max(1, math.ceil(math.log2(self.levels + 1)))
        s = self.levels
        self.scale = [1 / (1 + min(n / s**2, math.sqrt(n) / s)) if self.contractive else 1.0 for n in self.numels]

    @property
    def bits(self) -> int:
        return 1 + self.level_bits

    def nbytes(self) -> int:
        return -(-sum(self.numels) * self.bits // 8) + BYTES_PER_VALUE * len(self.numels)

    @in_row_blocks
    def encode(self, delta: torch.Tensor, round: int, rows: range) -> torch.Tensor:
        d = delta.shape[1]
        norms = torch.stack([part.norm(dim=1) for part in delta.split(self.numels, dim=1)], dim=1)
        scaled = _by_tensor_(delta.abs().mul_(self.levels), norms.clamp_min(torch.finfo(delta.dtype).tiny),
                             self.numels, torch.Tensor.div_)  # S|Δ_j| / ‖Δ‖
        uniform = worker_uniforms("qsgd", self.seed, round, rows, d, delta.dtype, delta.device)
        kind = _code_kind(self.bits)
        floor = scaled.floor()
        level = floor.add_(uniform < scaled.sub_(floor)).clamp_(max=self.levels).to(kind)  # ⌊s⌋ + [U < s − ⌊s⌋]
        code = (delta < 0).to(kind)
        code <<= self.level_bits
        code |= level  # the sign bit, then the level's
        return torch.cat([pack_codes(code, self.bits), as_bytes(norms)], dim=1)

    @in_row_blocks
    def decode(self, messages: torch.Tensor, round: int = 0) -> torch.Tensor:
        d, T = sum(self.numels), len(self.numels)
        code = unpack_codes(messages[:, : -BYTES_PER_VALUE * T], d, self.bits)
        level = (code & (2**self.level_bits - 1)).to(self.dtype)
        norms = from_bytes(messages[:, -BYTES_PER_VALUE * T :], self.dtype)
        norms = norms * torch.tensor(self.scale, dtype=self.dtype, device=messages.device) / self.levels
        return _negate_(_by_tensor_(level, norms, self.numels, torch.Tensor.mul_), code >> self.level_bits)


@dataclass
class Quant:
    """B-bit uniform quantisation per tensor (see the module docstring): a float32 scale s_t, then a
    level ℓ ∈ {−L..L} a coordinate as the B-bit code ℓ + L. Stochastic rounding from row stream
    ``quant`` (seed, round; the worker's row), unbiased; ``contractive``: rounded to the nearest level."""

    numels: list[int]
    bits: int
    seed: int = 0
    contractive: bool = False
    dtype: torch.dtype = torch.float32

    def __post_init__(self) -> None:
        self.levels = 2 ** (self.bits - 1) - 1  # L

    def nbytes(self) -> int:
        return -(-sum(self.numels) * self.bits // 8) + BYTES_PER_VALUE * len(self.numels)

    @in_row_blocks
    def encode(self, delta: torch.Tensor, round: int, rows: range) -> torch.Tensor:
        d = delta.shape[1]
        exact = torch.stack([part.abs().amax(1) for part in delta.split(self.numels, dim=1)], dim=1)
        scales = exact.to(torch.float32)  # the scale sent; rounded up, so that |u| ≤ L
        scales = torch.where(scales.to(exact.dtype) < exact, torch.nextafter(scales, torch.full_like(scales, math.inf)),
                             scales)
        u = _by_tensor_(delta * self.levels, scales.to(delta.dtype).clamp_min(torch.finfo(delta.dtype).tiny),
                        self.numels, torch.Tensor.div_)
        if self.contractive:
            level = u.round_()
        else:
            uniform = worker_uniforms("quant", self.seed, round, rows, d, delta.dtype, delta.device)
            floor = u.floor()
            level = floor.add_(uniform < u.sub_(floor))
        code = level.clamp_(-self.levels, self.levels).add_(self.levels).to(_code_kind(self.bits))  # ℓ + L
        return torch.cat([pack_codes(code, self.bits), as_bytes(scales)], dim=1)

    @in_row_blocks
    def decode(self, messages: torch.Tensor, round: int = 0) -> torch.Tensor:
        d, T = sum(self.numels), len(self.numels)
        code = unpack_codes(messages[:, : -BYTES_PER_VALUE * T], d, self.bits)
        level = (code.to(torch.int32) - self.levels).to(self.dtype)
        scales = from_bytes(messages[:, -BYTES_PER_VALUE * T :], self.dtype) / self.levels
        return _by_tensor_(level, scales, self.numels, torch.Tensor.mul_)


@dataclass
class Identity:
    """No compression: the change itself, d values of the run's dtype (CHOCO-SGD without a codec)."""

    numels: list[int]
    dtype: torch.dtype = torch.float32

    def nbytes(self) -> int:
        return self.dtype.itemsize * sum(self.numels)

    def encode(self, delta: torch.Tensor, round: int = 0, rows: range = range(0)) -> torch.Tensor:
        return delta

    def decode(self, messages: torch.Tensor, round: int = 0) -> torch.Tensor:
        return messages


def kept_per_tensor(fraction: float, numels: list[int]) -> list[int]:
    """k_t = ⌈F·d_t⌉ per tensor, exactly (F as the decimal it was written as: 0.01·1200 is 12)."""
    exact = Fraction(repr(fraction))
    return [math.ceil(exact * n) for n in numels]


_SAME_SIZE_INT = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def _negate_(values: torch.Tensor, negative: torch.Tensor) -> torch.Tensor:
    """−x where ``negative`` (integers 0 or 1) is 1, x elsewhere, in place: the IEEE sign bit
    xor-ed, which is exactly negation (−0 included) — what ``torch.where(negative, −x, x)`` gives,
    4× faster. Returns ``values``."""
    kind = _SAME_SIZE_INT[values.element_size()]
    values.view(kind).bitwise_xor_(negative.to(kind) << (8 * values.element_size() - 1))
    return values


def _by_tensor_(rows: torch.Tensor, per_tensor: torch.Tensor, sizes: list[int], op) -> torch.Tensor:
    """``op(block, column)`` in place on each tensor's block of ``rows`` [m, Σ sizes] with its column
    of ``per_tensor`` [m, T] (e.g. ``torch.Tensor.div_``): elementwise what the [m, Σ sizes]
    expansion would give, without making it. Returns ``rows``."""
    for t, block in enumerate(rows.split(sizes, dim=1)):
        op(block, per_tensor[:, t : t + 1])
    return rows


def _per_coordinate(per_tensor: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    """[m, T] values per tensor → [m, Σ sizes], each repeated over its tensor's coordinates."""
    return per_tensor.repeat_interleave(torch.as_tensor(sizes, device=per_tensor.device), dim=1)


# ---------------------------------------------------------------- registry
# a builder: (param, numels, dtype, seed, contractive) → codec


@CODECS.register("sign", help="(‖Δ‖₁/numel)·sign(Δ) per tensor: 1 bit a coordinate + a float32 scale a tensor")
def _sign(param, numels, dtype, seed, contractive) -> SignCodec:
    return SignCodec(numels, seed, dtype)


@CODECS.register("top-k", spec="top-k:F", takes="required", example=("0.1",),
                 help="the ⌈F·numel⌉ largest entries of each tensor: int32 index + float32 value each")
def _top_k(param, numels, dtype, seed, contractive) -> TopK:
    return TopK(numels, parse_fraction("top-k", param), dtype)


@CODECS.register("random-k", spec="random-k:F", takes="required", example=("0.2",),
                 help="⌈F·numel⌉ coordinates per tensor from a shared seed (no indices sent), unbiased")
def _random_k(param, numels, dtype, seed, contractive) -> RandomK:
    return RandomK(numels, parse_fraction("random-k", param), seed, contractive, dtype)


@CODECS.register("qsgd", spec="qsgd:S", takes="required", example=("4",),
                 help="stochastic quantisation to S levels + a float32 norm per tensor, unbiased (Alistarh et al.)")
def _qsgd(param, numels, dtype, seed, contractive) -> QSGD:
    try:
        levels = int(param)
    except ValueError:
        raise ConfigError(f"compression 'qsgd' takes an integer number of levels S >= 1, e.g. qsgd:4; got '{short(param)}'") from None
    if not 1 <= levels <= 2**16:
        raise ConfigError(f"compression 'qsgd' needs levels S in 1..65536, got {levels}")
    return QSGD(numels, levels, seed, contractive, dtype)


@CODECS.register("quant", spec="quant:B", takes="required", example=("2",),
                 help="B-bit uniform quantisation, a float32 max-scale per tensor, stochastic rounding (unbiased)")
def _quant(param, numels, dtype, seed, contractive) -> Quant:
    try:
        bits = int(param)
    except ValueError:
        raise ConfigError(f"compression 'quant' takes an integer number of bits B, e.g. quant:2; got '{param}'") from None
    if not 2 <= bits <= 16:
        raise ConfigError(f"compression 'quant' needs bits B in 2..16 (levels −L..L, L = 2^(B−1) − 1), got {bits}")
    return Quant(numels, bits, seed, contractive, dtype)


SPARSIFIERS = (TopK, RandomK)
VALUE_CODECS = ("sign", "qsgd", "quant")  # what a chain's second codec may be: the kept values quantised


def build_codec(spec: str, numels: list[int], dtype: torch.dtype, seed: int = 0, contractive: bool = False,
                shapes: list[tuple[int, ...]] | None = None) -> Codec:
    """The codec named by ``spec`` (without ``ef-``): a registered codec, or a chain ``S+V`` (a
    sparsifier S whose kept values travel through V). ``shapes``: the tensors' shapes, for a
    ``shaped`` codec (default: each tensor a vector)."""
    if spec.startswith(ERROR_FEEDBACK):
        raise ConfigError(f"compression 'ef-{short(spec)}': ef- (error feedback) is given more than once; give it once, before "
                          f"the codec")
    first, chained, rest = spec.partition("+")
    entry, param = CODECS.parse(first)
    shaped = {"shapes": shapes or [(n,) for n in numels]} if entry.traits.get("shaped") else {}
    codec = entry.build(param, numels, dtype, seed, contractive, **shaped)
    if chained:
        if not isinstance(codec, SPARSIFIERS):
            raise ConfigError(f"compression chain '{spec[:100]}' must start with top-k:F or random-k:F, got '{first[:50]}'")
        if CODECS.parse(rest.partition("+")[0])[0].name not in VALUE_CODECS:
            raise ConfigError(f"compression chain '{spec[:100]}': the second codec quantises the kept values: "
                              f"{', '.join(VALUE_CODECS)}")
        codec.kept.values = build_codec(rest, codec.ks, dtype, seed, contractive)
    return codec


@dataclass
class Compressor:
    """One compressed channel (one sync level, or CHOCO's messages): a codec and, with error feedback, its residual.

    Args:
        codec (Codec): the codec.
        residual (Tensor | None): e, the error feedback's residual rows (None: no error feedback).
        decay (float): β, e's decay (SparseLoCo's error feedback; 1: plain).

    Example::

        >>> import torch
        >>> from gossamer.extend import build_compressor
        >>> channel = build_compressor("ef-top-k:0.5", [4], torch.zeros(1, 4))
        >>> messages = channel.compress(torch.tensor([[4.0, -1.0, 0.5, 3.0]]), 0, range(1))
        >>> channel.codec.decode(messages, 0), channel.residual  # what was sent, what waits for the next round
        (tensor([[4., 0., 0., 3.]]), tensor([[ 0.0000, -1.0000,  0.5000,  0.0000]]))
    """

    codec: Codec
    residual: torch.Tensor | None = None
    decay: float = 1.0

    def compress(self, delta: torch.Tensor, round: int, rows: range) -> torch.Tensor:
        """The messages for Δ (+ βe); with error feedback, e ← (Δ + βe) − C(Δ + βe)."""
        if self.residual is not None:
            delta = torch.add(delta, self.residual, alpha=self.decay)
        messages = self.codec.encode(delta, round, rows)
        if self.residual is not None:
            self.residual = delta - self.codec.decode(messages, round)
        return messages

    def combine(self, gathered, round: int) -> torch.Tensor:
        """Per local row, its group's all-gathered messages combined: the codec's ``aggregate``
        where it has one, else the mean of their decodings."""
        aggregate = getattr(self.codec, "aggregate", None)
        return aggregate(gathered, round) if aggregate else gathered.mean(lambda m: self.codec.decode(m, round))


def build_compressor(spec: str, numels: list[int], like: torch.Tensor, seed: int = 0,
                     contractive: bool = False, decay: float = 1.0,
                     shapes: list[tuple[int, ...]] | None = None) -> Compressor:
    """The compressor named by ``spec`` (``none``, ``sign``, ``ef-top-k:0.01``, ...), a ``compression`` value.

    Args:
        spec (str): the codec, a chain ``S+V``, ``ef-`` before either for error feedback, or ``none``.
        numels (list[int]): the sizes of the tensors in a row.
        like (Tensor): rows shaped like those compressed (the residual's shape, the dtype).
        seed (int): the run's seed (random codecs' draws).
        contractive (bool): the codec's contractive form (always with error feedback).
        decay (float): β of its error feedback.
        shapes (list[tuple[int, ...]] | None): the tensors' shapes, for a ``shaped`` codec.

    Returns:
        Compressor: the channel.

    Example::

        >>> import torch
        >>> from gossamer.extend import build_compressor
        >>> channel = build_compressor("sign", [3, 5], torch.zeros(2, 8))
        >>> channel.codec.nbytes()  # ⌈8/8⌉ bytes of signs and a float32 scale a tensor
        9
    """
    if spec == "none":
        return Compressor(Identity(numels, like.dtype))
    error_feedback = spec.startswith(ERROR_FEEDBACK)
    codec = build_codec(spec.removeprefix(ERROR_FEEDBACK), numels, like.dtype, seed, contractive or error_feedback,
                        shapes)
    return Compressor(codec, torch.zeros_like(like) if error_feedback else None, decay)


def check_spec(spec: str) -> None:
    """Raise a ConfigError unless ``spec`` names a codec or chain (with or without ``ef-``) and valid parameters."""
    build_codec(spec.removeprefix(ERROR_FEEDBACK), [1], torch.float32)


from . import sparseloco  # noqa: E402,F401  (registers SparseLoCo's codec, which builds on this module)
