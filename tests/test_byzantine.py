"""Workers that lie (gossamer.byzantine): each aggregator against its closed form, the attacks
against their definitions, clipped gossip against He et al.'s update written out, the engine's
robust operators against hand-made rounds, honest-only metrics, and a section that changes
nothing being the plain run bit for bit.

Compared with the authors' code: epfml/byzantine-robust-optimizer at 288417f (centered clipping,
coordinate-wise median as the mean of the two middle values, trimmed mean, the attacks' omniscient
callbacks) and epfml/byzantine-robust-decentralized-optimizer at 5387d60 (self-centered clipping's
τ as the second-largest distance, the dissensus attack's rule, DeCM/DeTM over the worker and its
neighbours), read and re-derived, not copied.
"""

import math
from statistics import NormalDist

import numpy as np
import pytest
import torch
from cases import SHORT
from test_bad_input import one_line_error, sets

from gossamer.byzantine import Adversary, ByzantineConfig, aggregators, alie_z, attacks
from gossamer.robust import centered_clip, clip, krum, krum_scores, median, trimmed_mean
from gossamer.config import load_config
from gossamer.engines.sim import SimEngine
from gossamer.topology import build_topology
from gossamer.train import Batches, build_run, train

F64 = torch.float64


def _adversary(n: int, byzantine: list[int], **keys) -> Adversary:
    mask = np.zeros(n, dtype=bool)
    mask[byzantine] = True
    return Adversary(ByzantineConfig(workers=byzantine, **keys), mask, seed=0)


# ------------------------------------------------------------------ the rules on hand-made vectors

def test_median_and_trimmed_mean_are_the_coordinate_wise_closed_forms():
    M = torch.tensor([[[1.0, 9.0], [4.0, -2.0], [2.0, 5.0], [100.0, 0.0]]], dtype=F64)  # one group of 4
    torch.testing.assert_close(median(M), torch.tensor([[3.0, 2.5]], dtype=F64), rtol=0, atol=0)  # (2+4)/2, (0+5)/2
    torch.testing.assert_close(median(M[:, :3]), torch.tensor([[2.0, 5.0]], dtype=F64), rtol=0, atol=0)
    torch.testing.assert_close(trimmed_mean(M, 1), torch.tensor([[3.0, 2.5]], dtype=F64), rtol=0, atol=0)
    torch.testing.assert_close(trimmed_mean(M, 0), M.mean(1), rtol=0, atol=0)
    # b lowered until a value is left: 4 values, b = 5 → b = 1
    torch.testing.assert_close(trimmed_mean(M, 5), trimmed_mean(M, 1), rtol=0, atol=0)
    # a receiver with fewer valid messages (the others marked invalid, whatever they hold)
    valid = torch.tensor([[True, True, True, False]])
    torch.testing.assert_close(median(M, valid), torch.tensor([[2.0, 5.0]], dtype=F64), rtol=0, atol=0)
    torch.testing.assert_close(trimmed_mean(M, 1, valid), torch.tensor([[2.0, 5.0]], dtype=F64), rtol=0, atol=0)


def test_krum_scores_and_choices_follow_blanchard_et_al():
    """Five messages, f = 1: each score sums the n − f − 2 = 2 smallest squared distances to the others."""
    points = torch.tensor([[0.0], [1.0], [3.0], [4.0], [50.0]], dtype=F64)
    scores = krum_scores(points.unsqueeze(0), f=1)[0]
    d2 = (points - points.T).square().numpy()
    expected = [sorted(np.delete(d2[i], i))[:2] for i in range(5)]
    np.testing.assert_allclose(scores.numpy(), [sum(e) for e in expected], rtol=0, atol=1e-12)
    # scores 1+9, 1+4, 1+4, 1+9, 46²+47²: krum takes message 1 (the first of the tie 1, 2)
    torch.testing.assert_close(krum(points.unsqueeze(0), 1), torch.tensor([[1.0]], dtype=F64), rtol=0, atol=0)
    # multi-krum: the mean of the n − f = 4 lowest, the outlier left out
    torch.testing.assert_close(krum(points.unsqueeze(0), 1, select=4), torch.tensor([[2.0]], dtype=F64),
                               rtol=0, atol=1e-15)


def test_the_krum_key_is_the_f_multi_krum_assumes():
    """byzantine.krum overrides the Byzantine count: with f = 0 multi-Krum averages all 5 messages,
    with the default (1 Byzantine worker) the 4 lowest-scoring ones."""
    points = torch.tensor([[0.0], [1.0], [3.0], [4.0], [50.0]], dtype=F64).unsqueeze(0)
    members = torch.arange(5).unsqueeze(0)
    default = _adversary(5, [4], aggregator="multi-krum")  # attack none: its message is left as it is
    given = _adversary(5, [4], aggregator="multi-krum", krum=0)
    torch.testing.assert_close(default.aggregate(points, members, "x", torch.zeros(1, dtype=torch.long)),
                               torch.tensor([[2.0]], dtype=F64), rtol=0, atol=1e-15)
    torch.testing.assert_close(given.aggregate(points, members, "x", torch.zeros(1, dtype=torch.long)),
                               points.mean(1), rtol=0, atol=1e-14)


def test_centered_clipping_clips_each_difference_and_converges_to_a_fixed_point():
    u = torch.tensor([3.0, 4.0], dtype=F64)
    torch.testing.assert_close(clip(u, 1.0), u / 5, rtol=0, atol=1e-15)
    torch.testing.assert_close(clip(u, 10.0), u, rtol=0, atol=0)
    torch.testing.assert_close(clip(torch.zeros(2, dtype=F64), 1.0), torch.zeros(2, dtype=F64), rtol=0, atol=0)
    torch.testing.assert_close(clip(torch.zeros(2, dtype=F64), 0.0), torch.zeros(2, dtype=F64), rtol=0, atol=0)
    torch.testing.assert_close(clip(u, 0.0), torch.zeros(2, dtype=F64), rtol=0, atol=0)
    # one step from v = 0 by hand: messages (2, 0), (0, 1), (10, 0), τ = 1
    M = torch.tensor([[[2.0, 0.0], [0.0, 1.0], [10.0, 0.0]]], dtype=F64)
    step = centered_clip(M, torch.zeros(1, 2, dtype=F64), 1.0, 1)
    torch.testing.assert_close(step, torch.tensor([[2 / 3, 1 / 3]], dtype=F64), rtol=0, atol=1e-15)
    # with τ above every distance it is the mean after one step; many iterations reach v* with
    # Σ_j CLIP(m_j − v*, τ) = 0 (the fixed point), a point the outlier pulls by at most τ/3 per step
    torch.testing.assert_close(centered_clip(M, torch.zeros(1, 2, dtype=F64), 100.0, 1), M.mean(1), rtol=0, atol=1e-15)
    v = centered_clip(M, torch.zeros(1, 2, dtype=F64), 1.0, 500)
    torch.testing.assert_close(clip(M - v.unsqueeze(1), 1.0).sum(1), torch.zeros(1, 2, dtype=F64), rtol=0, atol=1e-12)


def test_alie_z_is_baruch_et_als_z_max():
    # n = 16, f = 2: s = ⌊9⌋ − 2 = 7 supporters, z = Φ⁻¹(9/16); f = 4: s = 5, z = Φ⁻¹(11/16)
    assert alie_z(16, 2) == pytest.approx(NormalDist().inv_cdf(9 / 16), abs=1e-15)
    assert alie_z(16, 4) == pytest.approx(NormalDist().inv_cdf(11 / 16), abs=1e-15)
    assert alie_z(16, 4) == pytest.approx(0.4887764, abs=1e-6)


# ------------------------------------------------------------------ the all-reduce family's operator

@pytest.mark.parametrize("attack,strength", [("sign-flip", 2.0), ("ipm", 0.1), ("alie", None)])
def test_the_attack_replaces_the_byzantine_rows_by_its_rule_of_the_honest_ones(attack, strength):
    """allreduce_mean_ with the mean: the honest rows' mean μ, σ by hand, the Byzantine messages
    −s·μ or μ − z·σ, every row ← the mean of all n messages."""
    n, byz = 8, [2, 5]
    engine, X = SimEngine(n), torch.randn(n, 6, dtype=F64, generator=torch.Generator().manual_seed(0))
    engine.adversary = _adversary(n, byz, attack=attack, strength=strength)
    honest = X[[i for i in range(n) if i not in byz]]
    mu, sigma = honest.mean(0), honest.std(0)
    crafted = mu - alie_z(n, 2) * sigma if attack == "alie" else -strength * mu
    expected = (honest.sum(0) + 2 * crafted) / n
    Y = X.clone()
    engine.allreduce_mean_(Y)
    torch.testing.assert_close(Y, expected.expand(n, 6), rtol=0, atol=1e-14)
    assert engine.comm.rounds_by_level["global"] == 1
    assert engine.comm.bytes_per_worker == pytest.approx(2 * (n - 1) / n * 6 * 8)  # the mean: an all-reduce of float64


def test_a_block_mean_crafts_each_blocks_messages_from_that_blocks_honest_rows():
    """block_mean_ of 8 workers in blocks of 4, Byzantine 1 and 6, ALIE with the mean: each block's
    Byzantine message μ − zσ of its own 3 honest rows (z from n = 8, f = 2)."""
    n, byz = 8, [1, 6]
    engine, X = SimEngine(n), torch.randn(n, 5, dtype=F64, generator=torch.Generator().manual_seed(3))
    engine.adversary = _adversary(n, byz, attack="alie")
    Y = X.clone()
    engine.block_mean_(Y, 4)
    for block, b in ((range(0, 4), 1), (range(4, 8), 6)):
        honest = X[[i for i in block if i != b]]
        crafted = honest.mean(0) - alie_z(n, 2) * honest.std(0)
        torch.testing.assert_close(Y[list(block)], ((honest.sum(0) + crafted) / 4).expand(4, 5), rtol=0, atol=1e-14)


def test_gaussian_messages_come_from_their_named_stream_and_a_robust_rule_is_priced_as_an_all_gather():
    n = 6
    engine, X = SimEngine(n), torch.zeros(n, 4, dtype=F64)
    engine.adversary = _adversary(n, [0, 3], attack="gaussian", strength=2.0, aggregator="median")
    Y = X.clone()
    engine.block_mean_(Y, 3)  # blocks {0,1,2} and {3,4,5}: one Byzantine worker each, the median of 0, 0, noise
    torch.testing.assert_close(Y, torch.zeros(n, 4, dtype=F64), rtol=0, atol=0)
    assert engine.comm.bytes_per_worker == pytest.approx((3 - 1) * 4 * 8)  # every member's 4 float64 values from the 2 others
    noise = engine.adversary._noise(4, X)  # the operator's draw, made again from (seed, call, worker)
    assert noise[[1, 2, 4, 5]].abs().sum() == 0 and noise[[0, 3]].std() > 1
    torch.testing.assert_close(engine.adversary._noise(4, X), noise, rtol=0, atol=0)
    engine.adversary.calls += 1
    assert not torch.equal(engine.adversary._noise(4, X), noise)  # the next operator's: fresh


def test_centered_clipping_starts_from_the_previous_aggregate_of_the_same_quantity():
    n = 4
    engine = SimEngine(n)
    engine.adversary = _adversary(n, [], aggregator="centered-clip", clip=0.5)
    first = torch.tensor([[1.0], [1.0], [1.0], [1.0]], dtype=F64)
    engine.allreduce_mean_(first, "gradients")  # from 0: every difference 1 clipped to 0.5
    torch.testing.assert_close(first, torch.full((n, 1), 0.5, dtype=F64), rtol=0, atol=0)
    other = torch.full((n, 1), 3.0, dtype=F64)
    engine.allreduce_mean_(other, "update")  # another quantity: its own center, 0
    torch.testing.assert_close(other, torch.full((n, 1), 0.5, dtype=F64), rtol=0, atol=0)
    again = torch.ones(n, 1, dtype=F64)
    engine.allreduce_mean_(again, "gradients")  # from 0.5: differences 0.5, not clipped
    torch.testing.assert_close(again, torch.ones(n, 1, dtype=F64), rtol=0, atol=0)


# ------------------------------------------------------------------ gossip

def _clipped_gossip_by_hand(W: np.ndarray, X: np.ndarray, sent: dict, tau) -> np.ndarray:
    """He et al. 2022's update, worker by worker: x_i + Σ_{j ≠ i, W_ij ≠ 0} W_ij CLIP(z_ij − x_i, τ_i),
    z_ij what j sent i (``sent[(i, j)]``, else x_j); τ a number or a function of (i, distances)."""
    out = X.copy()
    for i in range(len(X)):
        neighbours = [j for j in range(len(X)) if j != i and W[i, j] != 0]
        diffs = [sent.get((i, j), X[j]) - X[i] for j in neighbours]
        t = tau(i, [np.linalg.norm(u) for u in diffs]) if callable(tau) else tau
        for j, u in zip(neighbours, diffs):
            out[i] += W[i, j] * u * min(1.0, t / np.linalg.norm(u)) if np.linalg.norm(u) else 0
    return out


def _round(engine, X, spec="ring"):
    Y = X.clone()
    engine.gossip_(Y, build_topology(spec, engine.n).mixing(0))
    return Y


@pytest.mark.parametrize("aggregator", ["clipped-gossip", "self-centered-clip"])
def test_clipped_gossip_on_four_nodes_is_he_et_als_update_written_out(aggregator):
    n = 4
    X = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 3.0], [5.0, 5.0]], dtype=F64)
    engine = SimEngine(n)
    keys = {"clip": 1.5} if aggregator == "clipped-gossip" else {}
    engine.adversary = _adversary(n, [], aggregator=aggregator, **keys)
    W = build_topology("ring", n).mixing(0).dense()
    tau = 1.5 if keys else (lambda i, d: sorted(d)[-2])
    expected = _clipped_gossip_by_hand(W, X.numpy(), {}, tau)
    np.testing.assert_allclose(_round(engine, X).numpy(), expected, rtol=0, atol=1e-14)


def test_dissensus_at_strength_one_cancels_the_honest_pull_and_clipping_bounds_it():
    """Ring of 6, worker 0 Byzantine: its neighbours 1 and 5 stay where they were (ε = 1); worker 3,
    with honest neighbours only, mixes as plain gossip; with ε = 2 the message is the rule written out."""
    n = 6
    X = torch.randn(n, 3, dtype=F64, generator=torch.Generator().manual_seed(1))
    W = build_topology("ring", n).mixing(0).dense()
    engine = SimEngine(n)
    engine.adversary = _adversary(n, [0], attack="dissensus")
    Y = _round(engine, X)
    torch.testing.assert_close(Y[[1, 5]], X[[1, 5]], rtol=0, atol=1e-14)
    torch.testing.assert_close(Y[3], torch.as_tensor(W[3]) @ X, rtol=0, atol=1e-14)
    engine.adversary = _adversary(n, [0], attack="dissensus", strength=2.0, aggregator="clipped-gossip", clip=0.3)
    x = X.numpy()
    sent = {(i, 0): x[i] - 2.0 * sum(W[i, j] * (x[j] - x[i]) for j in range(n) if j not in (i, 0) and W[i, j])
            / W[i, 0] for i in (1, 5)}
    np.testing.assert_allclose(_round(engine, X).numpy()[1:], _clipped_gossip_by_hand(W, x, sent, 0.3)[1:],
                               rtol=0, atol=1e-14)


def test_gossip_attacks_use_the_receivers_honest_neighbourhood_and_median_its_closed_form():
    """ALIE to worker 1 of a ring of 6 (Byzantine 0): μ − zσ over x_1 and x_2; the coordinate-wise
    median over {x_i} ∪ neighbours (DeCM)."""
    n = 6
    X = torch.randn(n, 3, dtype=F64, generator=torch.Generator().manual_seed(2))
    engine = SimEngine(n)
    engine.adversary = _adversary(n, [0], attack="alie", aggregator="median")
    Y = _round(engine, X)
    seen = X[[1, 2]]
    crafted = seen.mean(0) - alie_z(n, 1) * seen.std(0)
    torch.testing.assert_close(Y[1], torch.stack([crafted, X[1], X[2]]).median(0).values, rtol=0, atol=1e-14)
    torch.testing.assert_close(Y[3], X[[2, 3, 4]].median(0).values, rtol=0, atol=0)


# ------------------------------------------------------------------ runs

def _run(*overrides):
    cfg = load_config(None, [*SHORT, "num_samples=1000", *overrides])
    run = build_run(cfg)
    rows = []
    summary = train(cfg, run, on_row=rows.append)
    return run, rows, summary


@pytest.mark.parametrize("algorithm", [["algorithm=local", "local_steps=2"], ["algorithm=gossip", "topology=ring"]])
def test_a_section_without_byzantine_workers_or_a_robust_rule_is_the_plain_run_bit_for_bit(algorithm):
    _, plain_rows, plain = _run(*algorithm)
    run, rows, summary = _run(*algorithm, "byzantine.fraction=0")
    assert run.engine.adversary is None
    assert rows == plain_rows
    assert {k: v for k, v in summary.items() if k != "wall_seconds"} == \
        {k: v for k, v in plain.items() if k != "wall_seconds"}


def test_sign_flip_at_strength_n_minus_f_over_f_cancels_every_allreduce_step():
    """allreduce, n = 4, f = 1, s = 3: the mean of 3 honest gradients and −3μ is 0, so plain SGD
    never moves (no momentum, no weight decay)."""
    run, rows, _ = _run("byzantine.workers=[2]", "byzantine.attack=sign-flip", "byzantine.strength=3")
    torch.testing.assert_close(run.workers.X, run.workers.X[0].expand_as(run.workers.X), rtol=0, atol=0)
    start = build_run(load_config(None, [*SHORT, "num_samples=1000"])).workers.X
    torch.testing.assert_close(run.workers.X[[0, 1, 3]], start[[0, 1, 3]], rtol=0, atol=1e-15)
    assert rows[-1]["byzantine_workers"] == 1


def test_metrics_are_over_the_honest_workers_and_the_summary_names_the_byzantine():
    run, rows, summary = _run("algorithm=gossip", "topology=ring", "byzantine.workers=[0]",
                              "byzantine.attack=gaussian", "byzantine.strength=5")
    X = run.workers.X
    honest = X[1:]
    expected = (honest - honest.mean(0)).square().sum(1).mean().item()
    assert rows[-1]["consensus_distance_sq"] == pytest.approx(expected, rel=1e-12)
    everyone = (X - X.mean(0)).square().sum(1).mean().item()
    assert abs(everyone - expected) > 1e-3 * expected  # the Byzantine row is not counted
    assert rows[-1]["loss"] > 0 and len(rows[-1]) == len(_run("algorithm=gossip", "topology=ring")[1][-1]) + 1
    assert summary["byzantine_workers"] == 1 and summary["byzantine_ids"] == [0]


def test_robust_rules_without_attackers_change_the_run_and_keep_training():
    _, plain_rows, plain = _run("algorithm=local", "local_steps=2")
    for rule in (["byzantine.aggregator=median"], ["byzantine.aggregator=centered-clip", "byzantine.clip=0.05"]):
        _, rows, summary = _run("algorithm=local", "local_steps=2", *rule)
        assert summary["final_loss"] != plain["final_loss"]
        assert summary["final_loss"] < rows[0]["loss"] and abs(summary["final_loss"] - plain["final_loss"]) < 0.2
        assert summary["bytes_per_worker"] > plain["bytes_per_worker"]  # an all-gather, not an all-reduce


def test_label_flip_workers_train_on_flipped_labels():
    cfg = load_config(None, [*SHORT, "num_samples=1000", "byzantine.workers=[1,3]", "byzantine.attack=label-flip"])
    run = build_run(cfg)
    x, y = Batches(run).of(0, 0)
    plain = build_run(load_config(None, [*SHORT, "num_samples=1000"]))
    _, y0 = Batches(plain).of(0, 0)
    torch.testing.assert_close(y[[0, 2]], y0[[0, 2]], rtol=0, atol=0)
    torch.testing.assert_close(y[[1, 3]], 9 - y0[[1, 3]], rtol=0, atol=0)


# ------------------------------------------------------------------ bad input

@pytest.mark.parametrize("overrides,names", [
    (["byzantine.attack=lies", "byzantine.workers=[0]"], "byzantine.attack"),
    (["byzantine.aggregator=krum", "algorithm=gossip"], "byzantine.aggregator"),
    (["byzantine.aggregator=clipped-gossip", "byzantine.clip=1"], "byzantine.aggregator"),
    (["byzantine.workers=[4]", "byzantine.attack=ipm"], "byzantine.workers"),
    (["byzantine.fraction=0.5", "byzantine.attack=ipm", "byzantine.aggregator=median"], "honest majority"),
    (["byzantine.workers=[0]", "byzantine.attack=dissensus"], "needs a graph"),
    (["byzantine.workers=[0]"], "need an attack"),
    (["byzantine.aggregator=centered-clip"], "byzantine.clip"),
    (["byzantine.aggregator=median", "byzantine.clip=1"], "byzantine.clip"),
    (["byzantine.workers=[0]", "byzantine.attack=ipm", "byzantine.aggregator=krum"], "2f + 2 < n"),
    (["algorithm=hierarchical", "workers=8", "block_size=4", "byzantine.workers=[0]", "byzantine.attack=ipm",
      "byzantine.aggregator=krum"], "block_size = 4"),
    (["byzantine.workers=[0]", "byzantine.attack=label-flip", "byzantine.strength=2"], "byzantine.strength"),
    (["algorithm=choco", "byzantine.workers=[0]", "byzantine.attack=ipm"], "byzantine applies to"),
    (["byzantine.clean_reference=true"], "byzantine.clean_reference"),
    (["algorithm=local", "compression=sign", "byzantine.workers=[0]", "byzantine.attack=ipm"], "compression"),
    (["byzantine.workers=[0]", "byzantine.attack=ipm", "faults.events=[1@2-3]"], "byzantine and faults"),
    (["algorithm=gossip", "phases=[allreduce,gossip]", "phase_steps=[2]", "byzantine.workers=[0]",
      "byzantine.attack=ipm"], "allreduce phase"),
    # issue 45, item 10: both ran as the plain run
    (["byzantine.fraction=0.1", "byzantine.attack=ipm"], "byzantine.fraction 0.1 of n = 4 workers makes nobody"),
    (["byzantine.attack=ipm"], "byzantine.attack ipm has no Byzantine worker to run it"),
    # issue 45, item 5: a hang
    (["byzantine.workers=[0]", "byzantine.attack=ipm", "byzantine.aggregator=centered-clip", "byzantine.clip=1",
      "byzantine.clip_iterations=1000000000"], "byzantine.clip_iterations must be an integer in [1, 1000]"),
    # issue 45, item 11: was numpy's "p must be in the range 0.0 < p < 1.0", naming no key
    (["byzantine.workers=[0,1,2]", "byzantine.attack=alie"], "f = 3 of n = 4 is too many; give byzantine.strength"),
    # issue 45, item 6: control's All-Reduce fallback ran the gossip rule as an all-reduce one (a TypeError)
    (["algorithm=gossip", "phases=[controlled]", "consensus.target=constant", "consensus.value=1e-9",
      "consensus.max_extra_rounds=1", "byzantine.workers=[0]", "byzantine.attack=sign-flip",
      "byzantine.aggregator=self-centered-clip"], "use consensus.on_budget: continue"),
])
def test_bad_byzantine_input_is_one_line(tmp_path, capsys, overrides, names):
    one_line_error(capsys, ["train", "--quiet", "--out", str(tmp_path / "never"),
                            *sets(*SHORT, "num_samples=1000", *overrides)], names)


def test_the_hooks_take_no_byzantine_section():
    """The hooks run one honest worker per process: their options have no byzantine keyword."""
    from gossamer.engines.threads import ThreadedSim
    from gossamer.integrations.hooks import LocalSGD

    model = torch.nn.Linear(3, 2)
    with pytest.raises(TypeError, match="byzantine"):
        LocalSGD(model, torch.optim.SGD(model.parameters(), lr=0.1), local_steps=2, engine=ThreadedSim(1, 0),
                 byzantine={"workers": [0], "attack": "ipm"})


PAIRS = [(family, attack, rule) for family in ("allreduce", "gossip") for attack in attacks(family)
         for rule in aggregators(family)]


@pytest.mark.parametrize("family,attack,rule", PAIRS, ids=["-".join(p) for p in PAIRS])
def test_every_attack_against_every_aggregator_trains_with_finite_honest_metrics(family, attack, rule):
    """Every pair a family takes (the dist parity cases take each attack and aggregator once)."""
    algorithm = ["algorithm=local", "local_steps=2"] if family == "allreduce" else ["algorithm=gossip",
                                                                                    "topology=exponential"]
    keys = {"centered-clip": ["byzantine.clip=0.1"], "clipped-gossip": ["byzantine.clip=0.1"]}.get(rule, [])
    _, rows, summary = _run(*algorithm, "workers=6", "epochs=1", "byzantine.workers=[3]", f"byzantine.attack={attack}",
                            f"byzantine.aggregator={rule}", *keys)
    assert all(math.isfinite(rows[-1][k]) for k in ("loss", "consensus_distance_sq", "test_accuracy"))
    assert summary["byzantine_ids"] == [3] and rows[-1]["byzantine_workers"] == 1


def test_self_centered_clipping_of_a_worker_whose_neighbours_all_lie_stays_finite():
    """Ring of 4, workers 0 and 2 Byzantine: 1 and 3 see only themselves honest, ALIE sends them
    their own model, τ_i = 0 — CLIP(0, 0) is 0, not 0/0 (a run stopped on NaN at step 2 before)."""
    _, rows, _ = _run("algorithm=gossip", "topology=ring", "byzantine.workers=[0,2]", "byzantine.attack=alie",
                      "byzantine.aggregator=self-centered-clip")
    assert math.isfinite(rows[-1]["loss"])


def test_the_clean_reference_is_the_plain_run_and_measures_the_honest_workers_distance_from_it():
    """byzantine.clean_reference trains the run without its section step for step: its rows are
    the plain run's bit for bit. With the trimmed mean at b = 0 and nobody lying (the mean, summed
    as x_ref + mean(Δ)), the honest workers stay within rounding of it; under attack they do not."""
    plain, _, _ = _run("algorithm=local", "local_steps=2")
    same, rows, summary = _run("algorithm=local", "local_steps=2", "byzantine.aggregator=trimmed-mean",
                               "byzantine.trim=0", "byzantine.clean_reference=true")
    assert torch.equal(same.clean.run.workers.X, plain.workers.X)
    assert summary["final_honest_distance_to_clean_sq"] < 1e-20 and "mean_distance_to_clean_sq" in rows[-1]
    attacked, rows, summary = _run("algorithm=local", "local_steps=2", "byzantine.workers=[2]",
                                   "byzantine.attack=sign-flip", "byzantine.clean_reference=true")
    X, clean = attacked.workers.X[[0, 1, 3]], attacked.clean.run.workers.X.mean(0)
    assert summary["final_honest_distance_to_clean_sq"] == pytest.approx((X - clean).square().sum(1).mean().item(),
                                                                         rel=1e-12)
    assert summary["final_mean_distance_to_clean_sq"] > 1e-6


def test_a_byzantine_gossip_round_that_cannot_fit_is_refused_naming_the_topology(monkeypatch):
    """The round holds [n, K, d] neighbours' rows: the complete graph of 4 workers needs 3·4·4·d
    values; with less memory free than that the run is refused in one line, a ring's fits."""
    import gossamer.preflight as preflight
    from gossamer.registry import ConfigError

    cfg = load_config(None, [*SHORT, "num_samples=1000", "algorithm=gossip", "topology=complete",
                             "byzantine.workers=[0]", "byzantine.attack=ipm"])
    d = build_run(load_config(None, [*SHORT, "num_samples=1000"])).workers.d
    monkeypatch.setattr(preflight, "free_memory", lambda: 3 * 4 * 4 * d * 8 - 1)
    with pytest.raises(ConfigError, match="sparser topology"):
        build_run(cfg)
    monkeypatch.setattr(preflight, "free_memory", lambda: 3 * 4 * 3 * d * 8 + 10**6)
    build_run(load_config(None, [*SHORT, "num_samples=1000", "algorithm=gossip", "topology=ring",
                                 "byzantine.workers=[0]", "byzantine.attack=ipm"]))


def test_a_block_of_byzantine_workers_only_is_left_as_it_is():
    """Hierarchical blocks of 2 with both of block 0 Byzantine: no honest row to imitate there (no
    0/0), the other blocks attacked as usual."""
    engine, X = SimEngine(4), torch.randn(4, 3, dtype=F64, generator=torch.Generator().manual_seed(4))
    engine.adversary = _adversary(4, [0, 1], attack="alie")
    Y = X.clone()
    engine.block_mean_(Y, 2)
    torch.testing.assert_close(Y[:2], X[:2].mean(0).expand(2, 3), rtol=0, atol=1e-15)
    torch.testing.assert_close(Y[2:], X[2:].mean(0).expand(2, 3), rtol=0, atol=1e-15)


def test_the_shipped_configs_load():
    """configs/*.yaml (the byzantine example among them) are valid configs."""
    from pathlib import Path

    files = sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.yaml"))
    assert any(f.name == "byzantine-ring.yaml" for f in files)
    for file in files:
        load_config(file)
    assert load_config(files[0].parent / "byzantine-ring.yaml").byzantine.attack == "dissensus"
