"""Codecs: exact wire sizes, top-k keeps the largest entries, random-k and QSGD are unbiased (and
their contractive forms contract), shared and per-worker draws, error feedback for every codec."""

import math

import pytest
import torch

from gossamer.codecs import QSGD, RandomK, SignCodec, TopK, build_compressor, check_spec
from gossamer.registry import ConfigError

NUMELS = [7, 30, 3]  # three tensors in a row, d = 40


def changes(m=3, seed=0):
    return torch.randn(m, sum(NUMELS), dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("codec, nbytes", [
    (SignCodec(NUMELS), 5 + 4 * 3),  # ⌈40/8⌉ sign bytes + a float32 scale per tensor
    (TopK(NUMELS, 0.1), 8 * (1 + 3 + 1)),  # k_t = ⌈0.1·d_t⌉ = 1, 3, 1: an int32 index and a float32 value each
    (RandomK(NUMELS, 0.5), 4 * (4 + 15 + 2)),  # values only: the indices come from the shared seed
    (QSGD(NUMELS, 1), 10 + 4 * 3),  # 1 sign bit + 1 level bit a coordinate (80 bits) + a float32 norm per tensor
    (QSGD(NUMELS, 4), 20 + 4 * 3),  # levels 0..4: 3 bits + sign = 4 bits a coordinate
    (QSGD(NUMELS, 7), 20 + 4 * 3),  # levels 0..7: 3 bits + sign
])
def test_messages_are_exactly_nbytes(codec, nbytes):
    assert codec.nbytes() == nbytes
    message = codec.encode(changes(), 3, range(3))
    assert message.dtype == torch.uint8 and message.shape == (3, nbytes)


def test_top_k_keeps_the_largest_entries_of_each_tensor():
    delta = changes(m=4)
    codec = TopK(NUMELS, 0.2, torch.float64)
    decoded = codec.decode(codec.encode(delta))
    for part, sent, k in zip(delta.split(NUMELS, 1), decoded.split(NUMELS, 1), codec.ks):
        largest = part.abs().topk(k, dim=1).indices
        kept = torch.zeros_like(part, dtype=torch.bool).scatter_(1, largest, True)
        assert torch.equal(sent != 0, kept)
        torch.testing.assert_close(sent[kept], part[kept].float().double(), rtol=0, atol=0)  # float32 on the wire
    full = TopK(NUMELS, 1.0, torch.float64)
    torch.testing.assert_close(full.decode(full.encode(delta)), delta.float().double(), rtol=0, atol=0)


def mean_and_error(codec, delta, draws):
    """Mean over ``draws`` draws of the decoded messages, and the mean squared error per row. A
    random-k draw is a round (all workers draw alike); a QSGD draw is a worker."""
    total, error = torch.zeros_like(delta), torch.zeros(delta.shape[0], dtype=delta.dtype)
    if isinstance(codec, QSGD):  # row i of worker w = i·draws + j: one encode for every draw
        many = delta.repeat_interleave(draws, 0)
        decoded = codec.decode(codec.encode(many, 0, range(len(many))), 0).view(len(delta), draws, -1)
        return decoded.mean(1), (decoded - delta[:, None]).square().sum(2).mean(1)
    for r in range(draws):
        decoded = codec.decode(codec.encode(delta, r, range(delta.shape[0])), r)
        total += decoded
        error += (decoded - delta).square().sum(1)
    return total / draws, error / draws


def random_k_variance(delta, codec):
    """Per coordinate: Var (d_t/k_t)·Δ_j·1[j kept] = Δ_j² (d_t/k_t − 1)."""
    omega = torch.tensor([n / k - 1 for n, k in zip(NUMELS, codec.ks)], dtype=delta.dtype)
    return delta.square() * omega.repeat_interleave(torch.tensor(NUMELS))


def qsgd_variance(delta, codec):
    """Per coordinate: ‖Δ_t‖/S times a Bernoulli between two adjacent levels, variance ≤ (‖Δ_t‖/S)²/4."""
    norms = torch.stack([p.norm(dim=1) for p in delta.split(NUMELS, 1)], 1)
    return (norms / codec.levels).square().repeat_interleave(torch.tensor(NUMELS), dim=1) / 4


@pytest.mark.parametrize("codec, variance, omega", [
    (RandomK(NUMELS, 0.25, seed=1, dtype=torch.float64), random_k_variance, [7 / 2 - 1, 30 / 8 - 1, 3 / 1 - 1]),
    (QSGD(NUMELS, 2, seed=1, dtype=torch.float64), qsgd_variance, [min(n / 4, math.sqrt(n) / 2) for n in NUMELS]),
])
def test_random_codecs_are_unbiased_within_their_variance_bound(codec, variance, omega):
    delta, draws = changes(m=2, seed=5), 1000
    mean, error = mean_and_error(codec, delta, draws)
    # E C(Δ) = Δ: the mean over draws is within 5 standard errors of Δ, coordinate by coordinate
    assert ((mean - delta).abs() <= 5 * (variance(delta, codec) / draws).sqrt() + 1e-6).all()
    # E‖C(Δ) − Δ‖² ≤ Σ_t ω_t ‖Δ_t‖² (a few per cent of slack for the finite sample)
    per_tensor = torch.stack([p.square().sum(1) for p in delta.split(NUMELS, 1)], 1)
    assert (error <= 1.05 * (per_tensor * torch.tensor(omega, dtype=delta.dtype)).sum(1)).all()


@pytest.mark.parametrize("codec", [RandomK(NUMELS, 0.25, seed=1, contractive=True, dtype=torch.float64),
                                   QSGD(NUMELS, 2, seed=1, contractive=True, dtype=torch.float64)])
def test_contractive_forms_contract(codec):
    """C/τ with τ = 1 + ω: E‖C(Δ)/τ − Δ‖² ≤ (1 − 1/τ)‖Δ‖² < ‖Δ‖² (what error feedback and CHOCO need)."""
    delta = changes(m=2, seed=6)
    _, error = mean_and_error(codec, delta, 500)
    assert (error < delta.square().sum(1)).all()
    if isinstance(codec, RandomK):  # the contractive random-k is the plain kept coordinates
        decoded = codec.decode(codec.encode(delta, 9), 9)
        kept = decoded != 0
        torch.testing.assert_close(decoded[kept], delta[kept].float().double(), rtol=0, atol=0)


def test_random_k_draws_the_same_coordinates_on_every_worker_and_new_ones_each_round():
    codec = RandomK(NUMELS, 0.25, seed=3)
    a, b = codec.coordinates(7, torch.device("cpu")), codec.coordinates(7, torch.device("cpu"))
    assert torch.equal(a, b) and len(a) == sum(codec.ks)
    assert not torch.equal(a, codec.coordinates(8, torch.device("cpu")))
    assert not torch.equal(a, RandomK(NUMELS, 0.25, seed=4).coordinates(7, torch.device("cpu")))


def test_qsgd_draws_per_worker_alike_whichever_rows_are_encoded_together():
    codec, delta = QSGD(NUMELS, 3, seed=2), changes(m=4)
    together = codec.encode(delta, 5, range(4))
    assert torch.equal(codec.encode(delta[2:], 5, range(2, 4)), together[2:])  # a process holding workers 2, 3
    assert not torch.equal(codec.encode(delta[2:], 5, range(0, 2)), together[2:])  # another worker's draws
    assert not torch.equal(codec.encode(delta, 6, range(4)), together)


def test_sign_sends_a_zero_as_a_fair_coin_drawn_per_worker():
    """sign(0) = 0 cannot be one bit: each zero coordinate is sent as ±scale by a coin of (seed,
    round, worker), so over rounds its mean is 0 (no drift), and every engine draws alike."""
    codec = SignCodec(NUMELS, seed=5, dtype=torch.float64)
    delta = changes(m=4)
    delta[:, ::3] = 0.0  # a third of the coordinates did not move
    moved = delta != 0
    scale = torch.cat([part.abs().mean(1, keepdim=True).expand_as(part) for part in delta.split(NUMELS, 1)], 1)
    rounds = 2000
    signs = torch.stack([codec.decode(codec.encode(delta, r, range(4)), r) / scale.float().double() for r in range(rounds)])
    assert torch.equal(signs[:, moved], delta.sign()[moved].expand(rounds, -1))  # nonzero: their sign, every round
    zero_signs = signs[:, ~moved]
    assert set(zero_signs.unique().tolist()) == {-1.0, 1.0}
    assert zero_signs.mean(0).abs().max() < 4.5 / math.sqrt(rounds)  # each zero coordinate: a fair coin
    assert zero_signs.mean().abs() < 4.5 / math.sqrt(zero_signs.numel())
    together = codec.encode(delta, 9, range(4))
    assert torch.equal(codec.encode(delta[2:], 9, range(2, 4)), together[2:])  # a process holding workers 2, 3
    assert not torch.equal(codec.encode(delta[2:], 9, range(0, 2)), together[2:])


@pytest.mark.parametrize("spec", ["sign", "top-k:0.2", "random-k:0.3", "qsgd:4"])
def test_error_feedback_message_plus_new_residual_is_change_plus_old_residual(spec):
    like = torch.zeros(3, sum(NUMELS), dtype=torch.float64)
    compressor = build_compressor(f"ef-{spec}", NUMELS, like, seed=1)
    for r in range(3):
        old, delta = compressor.residual.clone(), changes(seed=r)
        message = compressor.codec.decode(compressor.compress(delta, r, range(3)), r)
        torch.testing.assert_close(message + compressor.residual, delta + old, rtol=0, atol=1e-12)
    if spec.startswith(("random-k", "qsgd")):
        assert compressor.codec.contractive  # error feedback needs a contraction


@pytest.mark.parametrize("spec, fragment", [
    ("top-k:0", "fraction F in (0, 1], got 0.0"),
    ("top-k:1.5", "fraction F in (0, 1]"),
    ("random-k:x", "takes a fraction F in (0, 1]"),
    ("top-k", "needs a parameter: 'top-k:F'"),
    ("qsgd:0", "levels S in 1..65536"),
    ("qsgd:2.5", "integer number of levels"),
    ("ef-zip", "unknown compression 'zip'"),
    ("sign:3", "takes no parameter"),
])
def test_bad_codec_specs(spec, fragment):
    with pytest.raises(ConfigError, match=fragment.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        check_spec(spec)


@pytest.mark.parametrize("spec", ["sign", "qsgd:4", "qsgd:2", "quant:3", "top-k:0.5+quant:2", "random-k:0.5+qsgd:4"])
def test_a_codec_in_row_blocks_sends_and_decodes_what_one_call_does(monkeypatch, spec):
    """Codecs take their rows BLOCK_VALUES values at a time (in_row_blocks): the messages and the
    decoded rows are those of one call over all rows, bit for bit (7 rows of 12 in blocks of 2)."""
    import gossamer.codecs as codecs

    numels, rows = [5, 7], range(3, 10)
    delta = torch.sin(torch.arange(7 * 12, dtype=torch.float64)).view(7, 12)
    delta[2, :3] = 0  # sign's coin
    got = []
    for block in (1 << 20, 24):
        monkeypatch.setattr(codecs, "BLOCK_VALUES", block)
        codec = build_compressor(spec, numels, delta, seed=4).codec
        messages = codec.encode(delta, 6, rows)
        got.append((messages, codec.decode(messages, 6)))
    assert torch.equal(got[0][0], got[1][0]) and torch.equal(got[0][1], got[1][1])


@pytest.mark.parametrize("dtype, bits", [(torch.float32, torch.int32), (torch.float64, torch.int64)])
def test_negating_by_the_sign_bit_is_torch_where_of_minus_x_bit_for_bit(dtype, bits):
    from gossamer.codecs import _negate_

    x = torch.tensor([0.0, -0.0, 1.5, -2.0, math.inf, 3e-39 if dtype == torch.float32 else 3e-310], dtype=dtype)
    for negative in (torch.tensor([1, 1, 1, 0, 1, 1], dtype=torch.uint8), torch.tensor([0, 1, 0, 1, 0, 1])):
        expected = torch.where(negative == 1, -x, x)
        assert torch.equal(_negate_(x.clone(), negative).view(bits), expected.view(bits))
