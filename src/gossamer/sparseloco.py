"""SparseLoCo's codec as Templar's code does it (Sarfi et al. 2025; tplr-ai/templar c2397ac,
``src/tplr/compress.py``: ``ChunkingTransformer`` without the DCT — its hparams' ``use_dct:
false`` —, ``TopKCompressor`` with ``quantization_bins: 4`` and ``quantization_range: 6``, and
``batch_decompress`` with ``clip_norm``, as ``neurons.outer_step`` calls it). Spec
``sparseloco:K`` (or ``sparseloco:K@S``); with ``ef-`` it is SparseLoCo's error-feedback channel.

- **Blocks.** Each tensor is cut into 2-D blocks of sides at most s (:mod:`gossamer.blocks`;
  s = 64, Templar's ``target_chunk``, unless ``@S`` says otherwise).
- **Top-k.** Per block the k_t entries of largest |x|, k_t = min(K, n₁n₂) rounded down to even and
  at least 2 (Templar's ``_clamp_topk``; a block of one entry keeps it). Their indices within the
  block take 12 bits each, packed in pairs into 3 bytes (so a block holds at most 4,096 entries:
  s ≤ 64).
- **2-bit values.** Per tensor its N kept values v: μ = mean v, c = v − μ, σ = ‖c‖/√(N − 1),
  δ = 6σ/4 (1 where that is 0 or not finite), code q = clamp(round(c/δ + 2), 0, 3); the receiver
  reads lookup[q] + μ, lookup[b] = the mean of the c in bin b (0 for an empty bin). μ and the four
  lookup values travel as float32. (Templar's wire holds a uint8 per code; the paper and this
  message pack 2 bits.)
- **Aggregation** (:meth:`SparseLoCoCodec.aggregate`): per tensor, sender j's values are scaled by
  min(1, med/(‖v_j‖ + 10⁻⁸)), med the lower median of the senders' ‖v_j‖; then each coordinate is
  the mean over the senders that sent it (0 where none did).

A message is 20T + ⌈2K/8⌉ + 3⌈K/2⌉ bytes, K = Σ_t blocks_t·k_t kept entries of T tensors.
Templar's error feedback puts the outer learning rate in its buffer (e ← βe + η Δ, then the
outer SGD steps with η again); gossamer's is e ← βe + Δ (:class:`~gossamer.codecs.Compressor`):
the two agree at Templar's η = 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from .blocks import Blocks
from .codec_base import BYTES_PER_VALUE, CODECS, as_bytes, from_bytes, pack_codes, tensor_offsets, unpack_codes
from .registry import ConfigError, short

BINS = 4  # 2-bit codes (Templar's quantization_bins)
RANGE = 6  # the bins span 6σ (quantization_range)
CHUNK = 64  # the block side (target_chunk)
HEADER = (1 + BINS) * BYTES_PER_VALUE  # μ and the lookup table, per tensor


def kept_per_block(k: int, size: int) -> int:
    """Templar's k for a block of ``size`` entries: min(k, size), at least 2, rounded down to even."""
    if size == 1:
        return 1
    kept = max(min(k, size), 2)
    return kept - kept % 2


def quantise(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows of one tensor's kept values [m, N] → (codes [m, N] in 0..3, μ [m], lookup [m, 4])."""
    mu = values.mean(1, keepdim=True)
    centred = values - mu
    N = values.shape[1]
    sigma = centred.norm(dim=1, keepdim=True) / math.sqrt(N - 1) if N > 1 else torch.full_like(mu, math.nan)
    step = RANGE * sigma / BINS
    step = torch.where((step == 0) | ~step.isfinite(), torch.ones_like(step), step)
    codes = (centred / step + BINS // 2).round().clamp(0, BINS - 1).to(torch.int64)
    sums = torch.zeros(values.shape[0], BINS, dtype=values.dtype, device=values.device).scatter_add_(1, codes, centred)
    counts = torch.zeros_like(sums).scatter_add_(1, codes, torch.ones_like(centred))
    return codes, mu.squeeze(1), torch.where(counts > 0, sums / counts.clamp(min=1), 0.0)


def pack_indices(index: torch.Tensor) -> torch.Tensor:
    """int [m, K] (each < 4,096) → uint8 [m, 3⌈K/2⌉]: pairs (a, b) as a's low byte, a's high
    nibble with b's low nibble above it, b's high byte (Templar's ``pack_12bit_indices``; an odd
    K is padded with a 0)."""
    if index.shape[1] % 2:
        index = torch.cat([index, torch.zeros_like(index[:, :1])], 1)
    a, b = index[:, 0::2], index[:, 1::2]
    packed = torch.stack([a & 0xFF, ((a >> 8) & 0x0F) | ((b & 0x0F) << 4), (b >> 4) & 0xFF], 2)
    return packed.to(torch.uint8).flatten(1)


def unpack_indices(packed: torch.Tensor, K: int) -> torch.Tensor:
    """The inverse of :func:`pack_indices`: int64 [m, K]."""
    bytes3 = packed.to(torch.int64).view(packed.shape[0], -1, 3)
    a = bytes3[:, :, 0] | ((bytes3[:, :, 1] & 0x0F) << 8)
    b = ((bytes3[:, :, 1] >> 4) & 0x0F) | (bytes3[:, :, 2] << 4)
    return torch.stack([a, b], 2).flatten(1)[:, :K]


@dataclass
class SparseLoCoCodec:
    """The codec of the module docstring over tensors of ``shapes`` (sizes ``numels``)."""

    numels: list[int]
    shapes: list[tuple[int, ...]]
    k: int
    chunk: int = CHUNK
    dtype: torch.dtype = torch.float32
    _positions: dict = field(default_factory=dict)  # device → (every block entry's column, each slot's block start)

    def __post_init__(self) -> None:
        self.blocks = [Blocks.of(shape, self.chunk, lambda size: kept_per_block(self.k, size)) for shape in self.shapes]
        self.kept = [b.count * b.k for b in self.blocks]  # values sent per tensor
        self.K = sum(self.kept)

    def nbytes(self) -> int:
        return HEADER * len(self.blocks) + -(-2 * self.K // 8) + 3 * -(-self.K // 2)

    def encode(self, delta: torch.Tensor, round: int = 0, rows: range = range(0)) -> torch.Tensor:
        """Rows [m, d] → messages uint8 [m, nbytes]: per tensor μ and lookup (float32), the 2-bit
        codes, the 12-bit indices."""
        header, codes, index = [], [], []
        for part, b in zip(delta.split(self.numels, dim=1), self.blocks):
            x = b.flat(part)
            top = x.abs().topk(b.k, dim=2, sorted=False).indices
            q, mu, lookup = quantise(x.gather(2, top).flatten(1))
            header.append(torch.cat([mu.unsqueeze(1), lookup], 1))
            codes.append(q)
            index.append(top.flatten(1))
        return torch.cat([as_bytes(torch.cat(header, 1)), pack_codes(torch.cat(codes, 1), 2),
                          pack_indices(torch.cat(index, 1))], 1)

    def _read(self, messages: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Messages [m, nbytes] → (the dequantised values [m, K], their columns in a row [m, K])."""
        T, m = len(self.blocks), messages.shape[0]
        head = from_bytes(messages[:, : HEADER * T], self.dtype).view(m, T, 1 + BINS)
        code_bytes = -(-2 * self.K // 8)
        codes = unpack_codes(messages[:, HEADER * T : HEADER * T + code_bytes], self.K, 2).to(torch.int64)
        index = unpack_indices(messages[:, HEADER * T + code_bytes :], self.K)
        values = torch.cat([head[:, t, 1:].gather(1, q) + head[:, t, :1]
                            for t, q in enumerate(codes.split(self.kept, 1))], 1)
        return values, self._columns(index)

    def _columns(self, index: torch.Tensor) -> torch.Tensor:
        """Indices within their blocks [m, K] → columns of the row [m, K]: the entry's place in its
        block's row-major order, looked up in the table of every block's columns."""
        device = index.device
        if device not in self._positions:
            offsets = tensor_offsets(self.numels)
            table = torch.cat([b.positions(device).flatten() + o for b, o in zip(self.blocks, offsets)])
            start = torch.cat([torch.arange(b.count, device=device).repeat_interleave(b.k) * b.size + o
                               for b, o in zip(self.blocks, offsets)])  # each slot's block, in the table
            self._positions[device] = table, start
        table, start = self._positions[device]
        return table[start + index]

    def decode(self, messages: torch.Tensor, round: int = 0) -> torch.Tensor:
        values, columns = self._read(messages)
        out = torch.zeros(messages.shape[0], sum(self.numels), dtype=self.dtype, device=messages.device)
        return out.scatter_(1, columns, values)

    def aggregate(self, gathered, round: int = 0) -> torch.Tensor:
        """Per local row, its group's messages combined as Templar's ``batch_decompress`` does
        (the module docstring): [m, d]."""
        return gathered.per_group(self._combine)

    def _combine(self, messages: torch.Tensor) -> torch.Tensor:
        """[g, senders, nbytes] → [g, d]: median-norm clipped, then a mean over the senders of each coordinate."""
        g, p, _ = messages.shape
        values, columns = self._read(messages.flatten(0, 1))
        values, columns = values.view(g, p, self.K), columns.view(g, p * self.K)
        norms = torch.stack([v.norm(dim=2) for v in values.split(self.kept, 2)], 2)  # [g, p, T]
        factor = (norms.median(dim=1, keepdim=True).values / (norms + 1e-8)).clamp(max=1)
        values = values * factor.repeat_interleave(torch.as_tensor(self.kept, device=values.device), dim=2)
        d = sum(self.numels)
        sums = torch.zeros(g, d, dtype=self.dtype, device=messages.device).scatter_add_(1, columns, values.view(g, -1))
        counts = torch.zeros_like(sums).scatter_add_(1, columns, torch.ones_like(sums[:, :1]).expand(g, p * self.K))
        return torch.where(counts > 0, sums / counts.clamp(min=1), 0.0)


def parse(param: str) -> tuple[int, int]:
    """``K`` or ``K@S`` → (K, S)."""
    k, _, s = param.partition("@")
    try:
        k, s = int(k), int(s) if s else CHUNK
    except ValueError:
        raise ConfigError(f"compression 'sparseloco' takes K (entries kept per block) or K@S (S: the block side), "
                          f"e.g. sparseloco:64 or sparseloco:8@16; got '{short(param)}'") from None
    if not 2 <= s <= CHUNK:
        raise ConfigError(f"compression 'sparseloco' needs a block side S in 2..{CHUNK} (12-bit indices within a "
                          f"block of S² ≤ 4,096 entries, of which it keeps fewer than all), got {s}")
    if not 2 <= k < s * s:
        raise ConfigError(f"compression 'sparseloco' needs K in 2..{s * s - 1} (Templar keeps at least 2 entries a "
                          f"block; K ≥ S² = {s * s} sends every entry of a full block); got {k}")
    return k, s


@CODECS.register("sparseloco", spec="sparseloco:K[@S]", takes="required", example=("2@4",), shaped=True,
                 help="SparseLoCo as Templar codes it: top-K of each S×S block (S = 64), 12-bit indices, 2-bit "
                      "values, median-norm clipped mean over senders")
def _sparseloco(param, numels, dtype, seed, contractive, shapes) -> SparseLoCoCodec:
    k, s = parse(param)
    return SparseLoCoCodec(numels, shapes, k, s, dtype)
