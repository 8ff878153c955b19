"""What every codec shares and SparseLoCo's codec builds on: the registry of codecs (``compression``)
and the layout of bytes on the wire (float32 values and int32 indices, bit-packed codes, tensors'
offsets in a row).

:mod:`gossamer.codecs` (the codecs, error feedback, the builders) and :mod:`gossamer.sparseloco`
both import this module and not each other's definitions; ``codecs.py`` imports ``sparseloco.py``
last, so ``gossamer.codecs.CODECS`` holds every built-in codec.
"""

from __future__ import annotations

import torch

from .registry import Registry

CODECS = Registry("compression", traits={
    "shaped": "True: the builder also gets the tensors' shapes (shapes=, as sparseloco), build_codec"})
BYTES_PER_VALUE = 4  # float32 values and int32 indices on the wire


def as_bytes(values: torch.Tensor) -> torch.Tensor:
    """float rows [m, k] → their float32 bytes [m, 4k]."""
    return values.to(torch.float32).contiguous().view(torch.uint8)


def from_bytes(data: torch.Tensor, dtype: torch.dtype, kind: torch.dtype = torch.float32) -> torch.Tensor:
    """uint8 rows [m, 4k] → the float32 (or int32) values they hold [m, k], as ``dtype``."""
    return data.clone(memory_format=torch.contiguous_format).view(kind).to(dtype)


def tensor_offsets(numels: list[int]) -> list[int]:
    """Where each tensor starts in a row: the sums of the sizes before it."""
    return [sum(numels[:t]) for t in range(len(numels))]


def code_kind(bits: int) -> torch.dtype:
    """The integer dtype that holds a code of ``bits`` bits."""
    return torch.uint8 if bits <= 8 else torch.int32


def pack_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Integer (or bool) codes [m, d] of ``bits`` bits each → uint8 [m, ⌈d·bits/8⌉]: the codes end
    to end, most significant bit first, zeros after the last. Codes that tile a byte (1, 2, 4 or 8
    bits) are shifted into it; others go through their bits."""
    m, d = codes.shape
    if 8 % bits:  # a code straddles bytes: its bits, one code of 1 bit each
        shifts = torch.arange(bits - 1, -1, -1, device=codes.device).to(code_kind(bits))
        codes, bits, d = ((codes.to(code_kind(bits)).unsqueeze(2) >> shifts) & 1).view(m, d * bits), 1, d * bits
    per = 8 // bits
    padded = torch.zeros(m, -(-d // per) * per, dtype=torch.uint8, device=codes.device)
    padded[:, :d] = codes
    shifts = (torch.arange(per - 1, -1, -1, device=codes.device) * bits).to(torch.uint8)
    return (padded.view(m, -1, per) << shifts).sum(2, dtype=torch.uint8)


def unpack_codes(packed: torch.Tensor, d: int, bits: int) -> torch.Tensor:
    """uint8 [m, ⌈d·bits/8⌉] → the d codes [m, d] of ``bits`` bits (uint8; int32 above 8 bits):
    the inverse of :func:`pack_codes`."""
    m = packed.shape[0]
    if 8 % bits:
        kind = code_kind(bits)
        weights = (2 ** torch.arange(bits - 1, -1, -1, device=packed.device)).to(kind)
        return (unpack_codes(packed, d * bits, 1).view(m, d, bits).to(kind) * weights).sum(2, dtype=kind)
    per = 8 // bits
    shifts = (torch.arange(per - 1, -1, -1, device=packed.device) * bits).to(torch.uint8)
    return ((packed.unsqueeze(2) >> shifts) & (2**bits - 1)).view(m, -1)[:, :d]
