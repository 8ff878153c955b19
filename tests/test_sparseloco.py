"""SparseLoCo's codec (``sparseloco:K[@S]``) against a float64 reference written out from the rule of
Templar's code, tplr-ai/templar at c2397ac (v2.1.3): ``src/tplr/compress.py`` — the
``ChunkingTransformer`` without the DCT (its hparams' ``use_dct: false``), ``TopKCompressor``'s
``_clamp_topk``, ``compress``, ``_quantize_values`` (4 bins, range 6σ, per-bin mean lookup) and
``batch_decompress`` with ``clip_norm`` (the lower median of the senders' norms, then
``scatter_reduce(mean, include_self=False)``); ``src/tplr/neurons.py``'s ``prepare_gradient_dict``
(e ← βe + η Δ; e ← e − decompress(own message)) and ``outer_step`` (SGD at η, no momentum). The
reference below loops over workers, tensors and blocks, as that code's per-parameter loop does;
it was compared with the code by reading it, not by running it (no network here)."""

import math

import pytest
import torch

from gossamer.algorithms.diloco import DiLoCo
from gossamer.outer import nesterov_outer
from gossamer.codecs import build_compressor
from gossamer.config import load_config
from gossamer.engines.base import Gathered
from gossamer.registry import ConfigError
from gossamer.sparseloco import kept_per_block, pack_indices, unpack_indices
from test_peer_algorithms import drive, quadratic
from test_schedules import record

SHAPES = [(6, 4), (3, 2, 2), (5,), (4,), (1,)]  # a matrix, a kernel (out × the rest), vectors, a scalar


def f32(t):
    return t.to(torch.float32).to(t.dtype)


def templar_compress(row, shapes, k, chunk):
    """One worker's row → per tensor (values dequantised as the receiver reads them [N], their
    columns in the row [N]), Templar's rule written out block by block."""
    out, offset = [], 0
    for shape in shapes:
        numel = math.prod(shape)
        A, B = (1, numel) if len(shape) == 1 else (shape[0], numel // shape[0])
        M = row[offset : offset + numel].view(A, B)
        n1 = max(s for s in range(1, min(A, chunk) + 1) if A % s == 0)
        n2 = max(s for s in range(1, min(B, chunk) + 1) if B % s == 0)
        size = n1 * n2
        kt = 1 if size == 1 else max(min(k, size), 2) - max(min(k, size), 2) % 2  # _clamp_topk
        values, columns = [], []
        for y in range(A // n1):
            for x in range(B // n2):
                block = M[y * n1 : (y + 1) * n1, x * n2 : (x + 1) * n2].reshape(-1)  # (h w), row-major
                top = block.abs().topk(kt).indices
                values.append(block[top])
                for i in top.tolist():
                    h, w = divmod(i, n2)
                    columns.append(offset + (y * n1 + h) * B + x * n2 + w)
        v = torch.cat(values)
        shift = v.mean()
        centred = v - shift
        std = centred.norm() / math.sqrt(v.numel() - 1) if v.numel() > 1 else torch.tensor(math.nan)
        scale = 6 * std / 4
        if scale == 0 or not torch.isfinite(scale):
            scale = torch.tensor(1.0, dtype=v.dtype)
        q = (centred / scale + 2).round().clamp(0, 3).long()
        lookup = torch.zeros(4, dtype=v.dtype)
        for b in range(4):
            if (q == b).any():
                lookup[b] = centred[q == b].mean()
        out.append((f32(lookup)[q] + f32(shift), torch.tensor(columns)))  # μ and the lookup travel as float32
        offset += numel
    return out


def templar_aggregate(messages, d):
    """``batch_decompress`` per tensor over the senders' messages: clip each sender's values to
    the lower median of their norms, then the mean over the senders of each coordinate."""
    result = torch.zeros(d, dtype=torch.float64)
    for t in range(len(messages[0])):
        norms = [messages[j][t][0].norm() for j in range(len(messages))]
        median = sorted(norms)[(len(norms) - 1) // 2]
        total, count = torch.zeros(d, dtype=torch.float64), torch.zeros(d, dtype=torch.float64)
        for j, (values, columns) in enumerate(m[t] for m in messages):
            total.index_add_(0, columns, values * min(1.0, float(median / (norms[j] + 1e-8))))
            count.index_add_(0, columns, torch.ones_like(values))
        result += torch.where(count > 0, total / count.clamp(min=1), 0.0)
    return result


def sparseloco_reference(X, B, lr, steps, H, shapes, k, chunk, beta):
    """DiLoCo with SparseLoCo's outer step (η = 1, no outer momentum: Templar's hparams), plain
    SGD inner steps on f_i(x) = ½‖x − b_i‖²."""
    X, n, d = X.clone(), X.shape[0], X.shape[1]
    outer, e = X.clone(), torch.zeros_like(X)
    for t in range(steps):
        X -= lr * (X - B)
        if (t + 1) % H == 0:
            messages = []
            for i in range(n):
                e[i] = beta * e[i] + (outer[i] - X[i])
                sent = templar_compress(e[i], shapes, k, chunk)
                for values, columns in sent:
                    e[i, columns] -= values
                messages.append(sent)
            outer -= templar_aggregate(messages, d)  # every worker's copy of x_outer moves alike
            X.copy_(outer)
    return X


def schedule(H, spec, like, shapes, beta):
    numels = [math.prod(s) for s in shapes]
    return DiLoCo(H, [nesterov_outer(1.0, 0.0)], [], [slice(None)],
                  [build_compressor(spec, numels, like, decay=beta, shapes=shapes)])


@pytest.mark.parametrize("k, chunk, beta", [(2, 2, 0.95), (3, 4, 1.0), (5, 3, 0.5), (64, 64, 0.9)])
def test_diloco_with_sparseloco_is_templars_rule(k, chunk, beta):
    """Blocks bigger and smaller than k (all of a small block is sent), an odd k (rounded down to
    even), a one-entry tensor; the error feedback decayed by β; five workers (the median of five
    norms) whose models start alike, as DiLoCo's do."""
    d = sum(math.prod(s) for s in SHAPES)
    X, B = quadratic(n=5, d=d)
    X = X[:1].expand_as(X).clone()
    got = drive(schedule(3, f"ef-sparseloco:{k}@{chunk}", X, SHAPES, beta), X.clone(), B, 13, 0.1)
    torch.testing.assert_close(got, sparseloco_reference(X, B, 0.1, 13, 3, SHAPES, k, chunk, beta), atol=1e-10, rtol=0)


def test_the_aggregate_takes_the_lower_median_norm_and_the_mean_over_senders():
    """Four senders of two entries each (an even count: the lower median), by hand. Two values
    fall in one bin (c = ±a, σ = a√2, δ = 1.5σ: c/δ = ±0.47 rounds to code 2), so each pair arrives as μ:
    senders (3, 1), (6, 2), (6, 8), (0.6, 0.8) arrive as (2, 2), (4, 4), (7, 7), (0.7, 0.7), norms
    2√2, 4√2, 7√2, 0.7√2. The lower median, 2√2, scales the second to (2, 2) and the third to
    (2, 2); each coordinate is then the mean of its two senders: 2 and (2 + 0.7)/2. (The mean of
    the two middle norms, 3√2, would give 2.5 on the first two.)"""
    numels, shapes = [4], [(4,)]
    codec = build_compressor("sparseloco:2@4", numels, torch.zeros(1, 4, dtype=torch.float64), shapes=shapes).codec
    rows = torch.tensor([[3.0, 1, 0, 0], [6.0, 2, 0, 0], [0, 0, 6, 8], [0, 0, 0.6, 0.8]], dtype=torch.float64)
    got = codec.aggregate(Gathered(codec.encode(rows).unsqueeze(0), torch.zeros(4, dtype=torch.long)))
    assert (got == got[0]).all()
    torch.testing.assert_close(got[0], torch.tensor([2, 2, 1.35, 1.35], dtype=torch.float64), atol=1e-6, rtol=0)
    torch.testing.assert_close(got[0], templar_aggregate([templar_compress(r, shapes, 2, 4) for r in rows], 4),
                               atol=1e-12, rtol=0)


def test_twelve_bit_indices_pack_in_pairs_as_templar_does():
    index = torch.tensor([[0xABC, 0x123, 0xFFF]])
    packed = pack_indices(index)
    assert packed.tolist() == [[0xBC, 0x3A, 0x12, 0xFF, 0x0F, 0x00]]  # an odd count is padded with a 0
    assert torch.equal(unpack_indices(packed, 3), index)


def test_k_is_clamped_as_templar_clamps_it():
    cases = [(64, 4096), (63, 4096), (1, 16), (9, 4), (5, 1)]  # (K, block size)
    assert [kept_per_block(k, size) for k, size in cases] == [64, 62, 2, 4, 1]


def test_diloco_all_gathers_templars_message_every_outer_step():
    """cnn1d's tensors as matrices, blocks of the largest side divisors at most 8: conv 25×5 → 5
    blocks of 5×5; biases of 25 → 5 blocks of 1×5; convs 25×75 → 75 blocks of 5×5; linear 10×125
    → 50 blocks of 5×5; bias of 10 → 2 blocks of 1×5; k = 2 in each: K = (5+5+75+5+75+5+50+2)·2 =
    444 entries, 2 bits and 12 bits each, plus μ and four lookup values (float32) per tensor."""
    K = (5 + 5 + 75 + 5 + 75 + 5 + 50 + 2) * 2
    calls = record("algorithm=diloco", "local_steps=4", "compression=ef-sparseloco:2@8", "ef_decay=0.95", steps=8)
    assert calls == [(t, "all_gather", 8 * 20 + math.ceil(2 * K / 8) + 3 * K // 2, None) for t in (3, 7)]


@pytest.mark.parametrize("spec, message", [
    ("sparseloco:0", "needs K in 2..4095"),
    ("sparseloco:1", "needs K in 2..4095"),  # issue 45, item 12: was sparseloco:2 bit for bit
    ("sparseloco:16@4", "K ≥ S² = 16 sends every entry of a full block"),
    ("sparseloco:2@65", "block side S in 2..64"),
    ("sparseloco:2@1", "block side S in 2..64"),  # issue 45, item 12: was "needs K in 1..0"
    ("top-k:0.1+sparseloco:4", "the second codec quantises the kept values: sign, qsgd, quant"),  # was accepted
    ("ef-ef-sparseloco:4", "ef- .error feedback. is given more than once"),  # was "unknown compression"
    ("sparseloco:x", "takes K .* or K@S"),
    ("sparseloco", "needs a parameter"),
    ("sparseloco:2+quant:2", "must start with top-k:F or random-k:F"),
])
def test_bad_sparseloco_specs(spec, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, ["algorithm=diloco", f"compression={spec}"])
