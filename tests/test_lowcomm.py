"""The low-communication frontier (issue 24): quant:B and codec chains, compressed / streaming
DiLoCo, NoLoCo, SPARTA and DeMo — each against a reference written from its update rule (f_i(x) =
½‖x − b_i‖², float64), the primitives each calls, its exact bytes and its refusals."""

import math
import re

import pytest
import torch

from conftest import train_final
from gossamer.algorithms.demo import DecoupledMomentum, demo_blocks
from gossamer.algorithms.diloco import DiLoCo, fragment_columns
from gossamer.outer import nesterov_outer
from gossamer.algorithms.sparta import Sparta
from gossamer.algorithms import Step
from gossamer.cli import main
from gossamer.codecs import RandomK, build_compressor, check_spec
from gossamer.config import ConfigError, load_config
from gossamer.engines.sim import SimEngine
from gossamer.engines.ledger import allreduce_bytes
from gossamer.rng import host_stream
from gossamer.topology import build_topology
from test_peer_algorithms import drive, quadratic
from test_schedules import record

NUMELS = [2, 3, 1]  # a row of d = 6 in three "tensors"


def nesterov(x, m, delta, lr, mu):
    """The outer step: m ← μ m + Δ; x ← x − lr (Δ + μ m)."""
    m.mul_(mu).add_(delta)
    x.sub_(lr * (delta + mu * m))


def f32(t):
    return t.to(torch.float32).to(t.dtype)


def scales(message, numels):
    """The float32 scales at the end of a quant message, one per coordinate (float64)."""
    T = len(numels)
    per_tensor = message[:, -4 * T:].clone(memory_format=torch.contiguous_format).view(torch.float32).double()
    return per_tensor.repeat_interleave(torch.tensor(numels), dim=1)


# ---------------------------------------------------------------- quant:B and chains


def test_quant_is_b_bits_a_coordinate_plus_a_scale_and_rounds_to_a_neighbouring_level():
    X = torch.randn(3, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    for bits in (2, 3, 8):
        L = 2 ** (bits - 1) - 1
        c = build_compressor(f"quant:{bits}", NUMELS, X, seed=4).codec
        message = c.encode(X, 7, range(3))
        assert message.shape[1] == c.nbytes() == math.ceil(6 * bits / 8) + 4 * 3
        s = scales(message, NUMELS)
        assert (s >= torch.cat([p.abs().amax(1, keepdim=True).expand_as(p) for p in X.split(NUMELS, 1)], 1)).all()
        u, level = X * L / s, c.decode(message, 7) * L / s
        assert ((level - u.floor()).abs() < 1e-9).logical_or((level - u.ceil()).abs() < 1e-9).all()
        nearest = build_compressor(f"ef-quant:{bits}", NUMELS, X).codec  # the contractive form
        message = nearest.encode(X, 7, range(3))
        error, s = nearest.decode(message, 7) - X, scales(message, NUMELS)
        assert (error.abs() <= (s / (2 * L)) + 1e-12).all() and (error.abs() <= X.abs() + 1e-12).all()


def test_quant_is_unbiased_exactly():
    """E C(Δ)_j = s/L (⌊u⌋ + P[U < u − ⌊u⌋]): over the rounding's two outcomes, weighted."""
    X = torch.randn(1, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    c = build_compressor("quant:3", NUMELS, X).codec
    s = scales(c.encode(X, 0, range(1)), NUMELS)
    u = X * 3 / s
    low, high = u.floor() * s / 3, u.ceil() * s / 3
    expected = low + (u - u.floor()) * (high - low)
    torch.testing.assert_close(expected, X, atol=1e-12, rtol=0)
    draws = torch.stack([c.decode(c.encode(X, r, range(1)), r) for r in range(200)])
    assert ((draws - low).abs() < 1e-9).logical_or((draws - high).abs() < 1e-9).all()


def test_a_chain_sends_the_kept_values_quantised_and_the_indices():
    X = torch.randn(2, 60, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    c = build_compressor("ef-top-k:0.1+quant:2", [20, 40], X).codec
    k = [2, 4]
    assert c.encode(X, 0, range(2)).shape[1] == c.nbytes() == math.ceil(6 * 2 / 8) + 4 * 2 + 4 * 6
    decoded = c.decode(c.encode(X, 0, range(2)), 0)
    for part, dec, kt in zip(X.split([20, 40], 1), decoded.split([20, 40], 1), k):
        top = part.abs().topk(kt, 1).indices
        assert ((dec != 0).sum(1) <= kt).all()
        kept = part.gather(1, top)  # levels {−s, 0, s} of the kept values, s = their max
        s = f32(kept.abs().amax(1, keepdim=True))
        torch.testing.assert_close(dec.gather(1, top), (kept / s).round() * s, atol=1e-6, rtol=0)
    assert build_compressor("random-k:0.5+qsgd:4", [20, 40], X).codec.nbytes() == math.ceil(30 * 4 / 8) + 4 * 2


@pytest.mark.parametrize("spec, message", [
    ("quant:1", "quant' needs bits B in 2..16"), ("quant:x", "quant' takes an integer number of bits"),
    ("sign+quant:2", "must start with top-k:F or random-k:F"),
    ("top-k:0.1+random-k:0.5", "the second codec quantises the kept values")])
def test_bad_codec_specs_are_one_line(spec, message):
    with pytest.raises(ConfigError, match=message):
        check_spec(spec)


# ---------------------------------------------------------------- DiLoCo: compressed, streaming


def diloco_reference(X, B, lr, steps, H, fragments, delay=0, alpha=0.0, outer_lr=0.7, mu=0.9, topk=None, beta=1.0):
    """Streaming DiLoCo from its rules: fragment j (columns cols) sent after step t when
    t + 1 − ⌊jH/F⌋ ≥ 0 is a multiple of H: Δ = mean_i (x_outer − x_i) (top-k per tensor with
    error feedback if ``topk``: float32 values, the buffer decayed by ``beta`` first — SparseLoCo's
    e ← βe + Δ, as Templar's prepare_gradient_dict at c2397ac), a Nesterov outer step; applied
    after t + τ."""
    X, F = X.clone(), len(fragments)
    outer, m = X.clone(), torch.zeros_like(X)
    e = torch.zeros_like(X)
    for t in range(steps):
        X -= lr * (X - B)
        for j, cols in enumerate(fragments):
            since = t + 1 - j * H // F
            if since >= 0 and since % H == 0:
                delta = outer[:, cols] - X[:, cols]
                if topk is not None:
                    v = delta + beta * e[:, cols]
                    sent = torch.zeros_like(v)
                    for a, b, k in topk[j]:  # (start, stop, k) of each tensor of the fragment
                        idx = v[:, a:b].abs().topk(k, 1).indices
                        sent[:, a:b].scatter_(1, idx, f32(v[:, a:b].gather(1, idx)))
                    e[:, cols] = v - sent
                    delta = sent
                nesterov(outer[:, cols], m[:, cols], delta.mean(0, keepdim=True).expand_as(delta), outer_lr, mu)
            since -= delay
            if t - delay >= 0 and since >= 0 and since % H == 0:
                X[:, cols] = alpha * X[:, cols] + (1 - alpha) * outer[:, cols]
    return X


def schedule(H, fragments, compression="none", delay=0, alpha=0.0, like=None, beta=1.0):
    comp = None if compression == "none" else [build_compressor(compression, n, like[:, c], decay=beta)
                                                for n, c in fragments]
    return DiLoCo(H, [nesterov_outer(0.7, 0.9) for _ in fragments], [], [c for _, c in fragments], comp, delay, alpha)


def identical_start(n=4, d=6):
    X, B = quadratic(n=n, d=d)
    return X[:1].expand_as(X).clone(), B


def test_streaming_diloco_matches_its_update_rule():
    X, B = identical_start()
    cols = fragment_columns(NUMELS, 3)
    assert cols == [slice(0, 2), slice(2, 5), slice(5, 6)]
    got = drive(schedule(6, [([2], cols[0]), ([3], cols[1]), ([1], cols[2])], delay=1, alpha=0.5), X.clone(), B, 20, 0.1)
    torch.testing.assert_close(got, diloco_reference(X, B, 0.1, 20, 6, cols, delay=1, alpha=0.5), atol=1e-12, rtol=0)


@pytest.mark.parametrize("beta", [1.0, 0.5])
def test_diloco_with_compressed_pseudo_gradients_matches_its_update_rule(beta):
    X, B = identical_start()
    frags = [([2, 3], slice(0, 5)), ([1], slice(5, 6))]
    got = drive(schedule(4, frags, "ef-top-k:0.4", like=X, beta=beta), X.clone(), B, 17, 0.1)
    ref = diloco_reference(X, B, 0.1, 17, 4, [c for _, c in frags], topk=[[(0, 2, 1), (2, 5, 2)], [(0, 1, 1)]],
                           beta=beta)
    torch.testing.assert_close(got, ref, atol=1e-12, rtol=0)
    if beta == 1.0:  # ef_decay 1 is plain error feedback bit for bit
        assert torch.equal(got, drive(schedule(4, frags, "ef-top-k:0.4", like=X), X.clone(), B, 17, 0.1))


def test_one_fragment_without_delay_or_mixing_is_diloco_bit_for_bit():
    """DiLoCo as it was: X ← mean X in place, x_outer stepped on x_outer − X, X ← x_outer."""
    X, B = identical_start()
    got = drive(schedule(3, [(NUMELS, fragment_columns(NUMELS, 1)[0])]), X.clone(), B, 10, 0.1)
    X, outer, m = X.clone(), X.clone(), torch.zeros_like(X)
    for t in range(10):
        X.sub_(X - B, alpha=0.1)
        if (t + 1) % 3 == 0:
            X.copy_(X.mean(0, keepdim=True).expand_as(X))
            delta = outer - X
            m.mul_(0.9).add_(delta)
            outer.add_(delta.add_(m, alpha=0.9), alpha=-0.7)
            X.copy_(outer)
    assert torch.equal(got, X)


def test_compressed_and_streaming_diloco_call_and_count():
    calls = record("algorithm=diloco", "local_steps=4", "compression=ef-top-k:0.01+quant:2", steps=8)
    k = [-(-n // 100) for n in (125, 25, 1875, 25, 1875, 25, 1250, 10)]
    assert calls == [(t, "all_gather", 4 * sum(k) + math.ceil(2 * sum(k) / 8) + 4 * 8, None) for t in (3, 7)]
    calls = record("algorithm=diloco", "local_steps=4", "fragments=2", steps=8)
    d0 = 125 + 25 + 1875 + 25  # the cut nearest to d/2 = 2605: after the fourth tensor
    assert calls == [(1, "allreduce", f"{5210 - d0} columns"), (3, "allreduce", f"{d0} columns"),
                     (5, "allreduce", f"{5210 - d0} columns"), (7, "allreduce", f"{d0} columns")]
    with pytest.raises(ConfigError, match="fragments must be at most the model's 3 parameter tensors, got 4"):
        fragment_columns(NUMELS, 4)


# ---------------------------------------------------------------- NoLoCo


def test_noloco_on_the_complete_graph_is_diloco():
    a, run_a = train_final("algorithm=diloco", "local_steps=3", "outer_topology=complete", "outer_gamma=0.5")
    b, run_b = train_final("algorithm=diloco", "local_steps=3")
    torch.testing.assert_close(run_a.workers.X, run_b.workers.X, atol=1e-12, rtol=0)


def test_noloco_matches_its_update_rule_and_gossips_both_models():
    X, B = quadratic(n=8, d=6)
    topology = build_topology("one-peer-exponential", 8)
    sched = DiLoCo(2, [nesterov_outer(0.7, 0.9)], [], [slice(0, 6)], topology=topology, gamma=0.5)
    got = drive(sched, X.clone(), B, 9, 0.1)
    X, outer, m = X.clone(), X.clone(), torch.zeros_like(X)
    for t in range(9):
        X -= 0.1 * (X - B)
        if (t + 1) % 2 == 0:
            W = torch.tensor(topology.matrix((t + 1) // 2 - 1), dtype=X.dtype)
            gradient = W @ (outer - X) + 0.5 * (outer - W @ outer)  # the pull inside the momentum
            nesterov(outer, m, gradient, 0.7, 0.9)
            X = outer.clone()
    torch.testing.assert_close(got, X, atol=1e-12, rtol=0)
    calls = record("algorithm=diloco", "local_steps=3", "outer_topology=one-peer-exponential", steps=6)
    assert calls == [(t, "gossip", "10420 columns") for t in (2, 5)]  # [Δ | x_outer]: 2d values


# ---------------------------------------------------------------- SPARTA


def test_sparta_matches_its_update_rule_and_counts_one_allreduce_of_the_chosen_coordinates():
    X, B = quadratic(n=4, d=6)
    got = drive(Sparta(RandomK(NUMELS, 0.5, seed=3, stream="sparta")), X.clone(), B, 7, 0.1)
    X = X.clone()
    for t in range(7):
        X -= 0.1 * (X - B)
        chosen = [torch.from_numpy(host_stream("sparta", 3, t, k).permutation(n)[: math.ceil(n / 2)]) + o
                  for k, (n, o) in enumerate(zip(NUMELS, (0, 2, 5)))]
        for c in torch.cat(chosen).tolist():
            X[:, c] = X[:, c].mean()
    torch.testing.assert_close(got, X, atol=1e-12, rtol=0)
    k = sum(-(-n // 20) for n in (125, 25, 1875, 25, 1875, 25, 1250, 10))
    assert record("algorithm=sparta", "sparta_fraction=0.05", steps=2) == [(t, "allreduce", f"{k} columns")
                                                                           for t in (0, 1)]
    summary, _ = train_final("algorithm=sparta", "sparta_fraction=0.05")
    assert summary["bytes_per_worker"] == 2 * 12 * allreduce_bytes(k, 4, 8)


# ---------------------------------------------------------------- DeMo


def demo_reference(X, B, shapes, beta, chunk, k, lrs):
    """DeMo as the authors' code does it (bloc97/DeMo demo.py at 0e48145, DeMo.step with
    TransformDCT and CompressDCT), one worker and one tensor at a time, in float64 (values rounded
    to float32 as they travel): δ ← βδ + lr·g; per block of the tensor as a matrix, the 2-D
    orthonormal DCT and its top-k by |q|; δ −= what was sent; the gathered components, each the
    mean over its senders (scatter_reduce mean, include_self=False); IDCT; x ← x − lr·sign."""
    def dct(s):
        return torch.tensor([[math.sqrt((1 if q else 0.5) * 2 / s) * math.cos(math.pi * (2 * j + 1) * q / (2 * s))
                              for j in range(s)] for q in range(s)], dtype=torch.float64)

    def split(n):  # the reference's _get_smaller_split
        return max(v for v in range(1, min(n, chunk) + 1) if n % v == 0)

    n, X, delta = X.shape[0], X.clone(), torch.zeros_like(X)
    for lr in lrs:
        delta = beta * delta + lr * (X - B)
        Q, start = torch.zeros_like(X), 0
        for shape in shapes:
            a, b = (1, shape[0]) if len(shape) == 1 else (shape[0], math.prod(shape[1:]))
            n1, n2 = split(a), split(b)
            D1, D2 = dct(n1), dct(n2)
            kk = min(k, n1 * n2)
            cols = slice(start, start + a * b)
            start += a * b
            gathered_idx, gathered_val = [], []
            for i in range(n):
                blocks = delta[i, cols].reshape(a // n1, n1, b // n2, n2).permute(0, 2, 1, 3)  # [Y, X, n1, n2]
                q = (D1 @ blocks @ D2.T).reshape(a // n1, b // n2, n1 * n2)
                idx = q.abs().topk(kk, dim=-1).indices
                val = q.gather(-1, idx).float().double()
                own = torch.zeros_like(q).scatter_(-1, idx, val).reshape(a // n1, b // n2, n1, n2)
                delta[i, cols] -= (D1.T @ own @ D2).permute(0, 2, 1, 3).reshape(-1)
                gathered_idx.append(idx)
                gathered_val.append(val)
            mean = torch.zeros(a // n1, b // n2, n1 * n2, dtype=torch.float64).scatter_reduce(
                -1, torch.cat(gathered_idx, -1), torch.cat(gathered_val, -1), reduce="mean", include_self=False)
            Q[:, cols] = (D1.T @ mean.reshape(a // n1, b // n2, n1, n2) @ D2).permute(0, 2, 1, 3).reshape(-1)
        X -= lr * Q.sign()
    return X


@pytest.mark.parametrize("chunk, k", [(3, 2), (2, 4), (4, 5)])
def test_decoupled_momentum_is_the_authors_rule(chunk, k):
    """A matrix, a convolution kernel and two vectors; blocks with more and with fewer components
    than k (then all are sent, as the reference clamps); a warm-up learning rate (which the
    momentum accumulates: the reference's lr × g)."""
    shapes = [(6, 4), (3, 2, 2), (5,), (4,)]
    X, B = quadratic(n=4, d=sum(math.prod(s) for s in shapes))
    lrs = [0.1 * (t + 1) / 6 for t in range(6)]
    demo, engine, got = DecoupledMomentum(0.9, demo_blocks(shapes, chunk, k), torch.zeros_like(X)), SimEngine(4), X.clone()
    demo.start(engine, got)
    for t, lr in enumerate(lrs):
        G = got - B
        demo.on_gradients(engine, got, G, Step(t, lr=lr, measure=False))
        got.sub_(G, alpha=lr)
    torch.testing.assert_close(got, demo_reference(X, B, shapes, 0.9, chunk, k, lrs), atol=1e-10, rtol=0)


def test_decoupled_momentum_all_gathers_k_values_and_indices_per_block_every_step():
    """cnn1d's tensors as matrices, blocks of the largest side divisors at most 8, k = 2 per block:
    conv 25×5 → 5 blocks of 5×5; biases of 25 → 5 blocks of 1×5; convs 25×75 → 75 blocks of 5×5;
    linear 10×125 → 50 blocks of 5×5; bias of 10 → 2 blocks of 1×5: (5+5+75+5+75+5+50+2)·2 = 444
    components of 4 value and 4 index bytes."""
    cfg = ["algorithm=decoupled-momentum", "demo_chunk=8", "demo_topk=2"]
    assert record(*cfg, steps=2) == [(t, "all_gather", 444 * 8, None) for t in (0, 1)]


# ---------------------------------------------------------------- refusals


def test_an_algorithm_sets_the_values_it_requires_unless_the_user_gave_others():
    """Issue 34: DeMo with the default momentum 0.9 was refused until the user set momentum=0 and
    nesterov=false by hand; now the algorithm sets them, and config.yaml records them."""
    cfg = load_config(None, ["algorithm=decoupled-momentum"])
    assert (cfg.optimizer, cfg.momentum, cfg.nesterov, cfg.average_optimizer_state) == ("sgd", 0.0, False, False)
    assert cfg.to_dict()["momentum"] == 0.0
    explicit = load_config(None, ["algorithm=decoupled-momentum", "momentum=0", "nesterov=false"])
    assert explicit.to_dict() == cfg.to_dict()  # the same values given by hand are accepted


@pytest.mark.parametrize("overrides, message", [
    (["algorithm=diloco", "local_steps=2", "fragments=3"], "fragments must be at most local_steps=2"),
    (["algorithm=diloco", "local_steps=2", "fragment_delay=2"], r"fragment_delay must be in \[0, local_steps=2\)"),
    (["algorithm=diloco", "fragment_alpha=1"], r"fragment_alpha must be in \[0, 1\)"),
    (["algorithm=diloco", "outer_gamma=0.5"], "outer_gamma applies only with an outer_topology"),
    (["algorithm=diloco", "outer_topology=ring", "compression=sign"], "outer_topology .NoLoCo. needs compression: none"),
    (["algorithm=sparta", "sparta_fraction=0"], r"sparta_fraction must be in \(0, 1\]"),
    (["algorithm=diloco", "ef_decay=0.9"], "ef_decay applies only with an error-feedback codec"),
    (["algorithm=diloco", "compression=ef-top-k:0.1", "ef_decay=1.5"], r"ef_decay must be in \[0, 1\]"),
    (["algorithm=decoupled-momentum", "momentum=0.9"], r"algorithm decoupled-momentum sets momentum to 0.0 \(it keeps "
                                                         r"its own momentum, demo_beta, .*\): drop momentum=0.9"),
    (["algorithm=decoupled-momentum", "optimizer=adam"], "algorithm decoupled-momentum sets optimizer to sgd"),
    (["algorithm=decoupled-momentum", "demo_chunk=4", "demo_topk=16"], "demo_topk=16 sends every component"),
    (["algorithm=des-loc", "optimizer=sgd"], "algorithm des-loc sets optimizer to adam or adamw"),
    (["algorithm=des-loc", "optimizer=adam", "average_optimizer_state=true"],
     "algorithm des-loc sets average_optimizer_state to false"),
    (["algorithm=des-loc", "optimizer=adam", "desloc_m2_steps=0"], "desloc_m2_steps must be a positive integer"),
    (["algorithm=allreduce", "sparta_fraction=0.1"], "sparta_fraction does not apply to algorithm 'allreduce'"),
    (["algorithm=local", "fragments=2"], "fragments does not apply to algorithm 'local'"),
])
def test_options_that_do_not_apply_or_are_out_of_range_are_refused(overrides, message, capsys):
    assert main(["train", "--quiet", *(a for o in overrides for a in ("--set", o))]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and re.search(message, err), err


# ---------------------------------------------------------------- DES-LOC


def test_des_loc_with_equal_periods_is_local_adam_averaging_its_moments():
    """Issue 33: K_x = K_u = K_v = H is `local` with Adam and average_optimizer_state at H, bit for bit."""
    adam = ("optimizer=adam", "lr=0.003", "model=mlp")
    des_loc, a = train_final("algorithm=des-loc", "local_steps=3", "desloc_m1_steps=3", "desloc_m2_steps=3", *adam)
    local, b = train_final("algorithm=local", "local_steps=3", "average_optimizer_state=true", *adam)
    assert torch.equal(a.workers.X, b.workers.X)
    assert all(torch.equal(a.optimizer.rows[k], b.optimizer.rows[k]) for k in ("exp_avg", "exp_avg_sq"))
    assert (des_loc["comm_rounds"], des_loc["bytes_per_worker"]) == (local["comm_rounds"], local["bytes_per_worker"])


def test_des_loc_is_per_worker_torch_adam_with_three_periods():
    """Against the paper's algorithm box with torch.optim.Adam (torch 2.13) on 4 model copies, float64:
    after local step s, the parameters averaged when K_x = 2 divides s, exp_avg when K_u = 3 does,
    exp_avg_sq when K_v = 4 does; bytes: one all-reduce of d float32 values, 2·(n − 1)/n · 4d a
    worker, per average."""
    from conftest import small_config
    from gossamer.data.partition import iid_epoch_indices
    from gossamer.models import build_model
    from gossamer.train import build_run, train

    cfg = small_config("algorithm=des-loc", "optimizer=adam", "lr=0.003", "model=mlp", "local_steps=2",
                       "desloc_m1_steps=3", "desloc_m2_steps=4")
    run = build_run(cfg)
    summary = train(cfg, run)
    n, S = cfg.workers, run.steps_per_epoch
    torch.manual_seed(cfg.seed)
    models = [build_model(cfg, run.data).double() for _ in range(n)]
    for m in models[1:]:
        m.load_state_dict(models[0].state_dict())
    opts = [torch.optim.Adam(m.parameters(), lr=cfg.lr) for m in models]
    averages = 0
    for s in range(1, cfg.epochs * S + 1):
        idx = iid_epoch_indices(len(run.data.y_train), n, cfg.batch_size, (s - 1) // S, cfg.seed)[(s - 1) % S]
        for i, (model, opt) in enumerate(zip(models, opts)):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(run.data.x_train[idx[i]]), run.data.y_train[idx[i]]).backward()
            opt.step()
        for period, key in ((2, None), (3, "exp_avg"), (4, "exp_avg_sq")):
            if s % period:
                continue
            averages += 1
            for params in zip(*(m.parameters() for m in models)):
                values = [p.data if key is None else o.state[p][key] for o, p in zip(opts, params)]
                mean = torch.stack(values).mean(0)
                for v in values:
                    v.copy_(mean)
    expected = torch.stack([torch.cat([p.detach().reshape(-1) for p in m.parameters()]) for m in models])
    torch.testing.assert_close(run.workers.X, expected, atol=2e-15, rtol=0)
    d = expected.shape[1]
    assert summary["comm_rounds"] == averages
    assert summary["bytes_per_worker"] == pytest.approx(averages * 2 * (n - 1) / n * 8 * d, rel=1e-12)  # float64
