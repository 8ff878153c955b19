"""CHOCO-SGD, push-sum (SGP), gradient tracking and quasi-global momentum: identities with D-SGD
and closed forms on quadratics f_i(x) = ½‖x − b_i‖², driven through the schedules themselves."""

import json

import pytest
import torch

from conftest import small_config, train_final, train_rows
from gossamer.algorithms import Step
from gossamer.algorithms.gossip import Gossip, GossipState, gossip_state
from gossamer.algorithms.peer import ChocoSGD, GradientTracking, PushSum
from gossamer.cli import main
from gossamer.codecs import build_compressor
from gossamer.config import ConfigError
from gossamer.engines.sim import SimEngine
from gossamer.topology import build_topology
from gossamer.train import build_run


def close(a, b, tol=1e-10):
    torch.testing.assert_close(a, b, atol=tol, rtol=0)


def drive(schedule, X: torch.Tensor, B: torch.Tensor, steps: int, lr: float, first: int = 0) -> torch.Tensor:
    """``steps`` steps (from step ``first``) of plain SGD on f_i(x) = ½‖x − b_i‖² (gradient
    x_i − b_i) under ``schedule``, in the training loop's order of hooks; returns X."""
    engine = SimEngine(X.shape[0])
    schedule.start(engine, X)
    for t in range(first, first + steps):
        G = X - B
        step = Step(t, lr=lr, measure=False)
        schedule.on_gradients(engine, X, G, step)
        X.sub_(G, alpha=lr)
        schedule.after_step(engine, X, step)
    return X


def quadratic(n=8, d=6, seed=0, same_optimum=False):
    g = torch.Generator().manual_seed(seed)
    B = torch.randn(n, d, dtype=torch.float64, generator=g) * 3
    if same_optimum:
        B = B[:1].expand(n, d).clone()
    return torch.randn(n, d, dtype=torch.float64, generator=g), B


# ---------------------------------------------------------------- CHOCO-SGD


def test_choco_with_the_identity_codec_and_gamma_1_is_dsgd_step_for_step():
    rows_c, choco, run_c = train_rows("algorithm=choco", "topology=ring")
    rows_g, gossip, run_g = train_rows("algorithm=gossip", "topology=ring")
    for a, b in zip(rows_c, rows_g):
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-12)
        assert a["consensus_distance_sq"] == pytest.approx(b["consensus_distance_sq"], rel=1e-9)
    close(run_c.workers.X, run_g.workers.X, 1e-12)
    for key in ("bytes_per_worker", "comm_rounds", "messages_per_worker"):  # d float32 values per peer
        assert choco[key] == gossip[key], key


def test_choco_with_top_k_converges_where_naive_compressed_gossip_does_not():
    """Ring of 8, 40 coordinates, top-k 10 %: CHOCO reaches the common optimum b (to 1e-9); gossip of
    the compressed models themselves, x_i ← w_ii x_i + Σ_j≠i w_ij C(x_j), stalls far from it."""
    n, d, steps, lr = 8, 40, 1500, 0.05
    X0, B = quadratic(n, d, same_optimum=True)
    topology = build_topology("ring", n)
    compressor = build_compressor("top-k:0.1", [d], X0, contractive=True)
    choco = ChocoSGD(topology, 0.1, compressor, torch.zeros(n, 3, d, dtype=torch.float64))  # x̂ = 0, as in the paper
    X = drive(choco, X0.clone(), B, steps, lr)
    assert (X - B).abs().max() < 1e-9

    W, codec, X = torch.tensor(topology.matrix(0)), compressor.codec, X0.clone()
    own = torch.diag(W)[:, None]
    for _ in range(steps):
        X -= lr * (X - B)
        X = own * X + (W - torch.diag(torch.diag(W))) @ codec.decode(codec.encode(X))
    assert (X - B).abs().max() > 0.1


def test_choco_keeps_copies_of_a_time_varying_graphs_union_and_sends_to_all_of_them():
    summary, run = train_final("algorithm=choco", "topology=one-peer-exponential", "compression=top-k:0.05",
                               "choco_gamma=0.4")
    union = run.schedule.topology.union
    assert union.index.shape[0] == 3  # n = 4: self, i + 1 and i + 2 over the period
    codec = run.schedule.compressor.codec
    # every round each worker's message goes to the 2 workers that copy it, though W_t uses one
    assert summary["bytes_per_worker"] == pytest.approx(summary["steps"] * 2 * codec.nbytes())
    assert summary["messages_per_worker"] == 2 * summary["steps"]
    copies = run.schedule.copies
    for i in range(4):  # every copy of worker j's x̂ is the same: all decode the same messages
        for k in range(3):
            j = int(union.index[k, i])
            assert torch.equal(copies[i, k], copies[j, 0])


# ---------------------------------------------------------------- push-sum (SGP)


def test_sgp_on_an_undirected_regular_graph_is_dsgd():
    _, sgp, run_s = train_rows("algorithm=sgp", "topology=ring", "momentum=0.9", "nesterov=true")
    _, gossip, run_g = train_rows("algorithm=gossip", "topology=ring", "momentum=0.9", "nesterov=true")
    close(run_s.workers.X, run_g.workers.X, 1e-12)
    assert torch.equal(run_s.schedule.weight, torch.ones(4, 1, dtype=torch.float64))
    assert sgp["test_accuracy"] == gossip["test_accuracy"]
    assert sgp["bytes_per_worker"] == pytest.approx(gossip["bytes_per_worker"] * (sgp["parameters"] + 1)
                                                   / sgp["parameters"])  # the weight travels with x


DIRECTED = "0 -> 1\n0 -> 2\n0 -> 3\n1 -> 2\n2 -> 3\n3 -> 0\n3 -> 4\n4 -> 0\n"  # in-degrees 2, 1, 2, 2, 1


def test_push_sum_preserves_the_average_and_reaches_it_where_uniform_out_weights_are_not_doubly_stochastic(tmp_path):
    edges = tmp_path / "directed.txt"
    edges.write_text(DIRECTED)
    topology = build_topology(f"edges:{edges}", 5)
    W = torch.tensor(topology.matrix(0))
    assert not topology.doubly_stochastic and (W.sum(0) - 1).abs().max() < 1e-15
    assert (W.sum(1) - 1).abs().max() > 0.1  # what each node can set alone: rows do not sum to 1
    X0 = torch.randn(5, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    average = X0.mean(0)
    sgp = PushSum(topology, torch.ones(5, 1, dtype=torch.float64))
    X = X0.clone()
    engine = SimEngine(5)
    for t in range(200):  # pure gossip (no gradient): x and w mix, z = x / w
        sgp.on_gradients(engine, X, torch.zeros_like(X), Step(t))
        sgp.after_step(engine, X, Step(t))
        numerator = X * sgp.weight
        close(numerator.sum(0), X0.sum(0), 1e-12)  # Σ_i x_i preserved
        assert sgp.weight.sum().item() == pytest.approx(5, abs=1e-12)  # Σ_i w_i preserved
    close(X, average.expand(5, 3), 1e-12)
    assert (sgp.weight - 1).abs().max() > 0.1  # the weights did the de-biasing
    plain = X0.clone()
    for _ in range(200):  # plain gossip with the same W reaches a weighted average, not x̄
        plain = W @ plain
    assert (plain - average).abs().max() > 1e-2


def test_sgp_trains_on_a_directed_graph_from_the_cli(tmp_path):
    edges = tmp_path / "directed.txt"
    edges.write_text(DIRECTED)
    sets = [x for kv in ["workers=5", "epochs=2", "num_samples=1000", "algorithm=sgp", f"topology=edges:{edges}"]
            for x in ("--set", kv)]
    assert main(["train", *sets, "--quiet", "--out", str(tmp_path / "run")]) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["test_accuracy"] > 0.15 and summary["final_consensus_distance_sq"] < 0.05
    ckpt = torch.load(tmp_path / "run" / "checkpoint.pt")
    assert ckpt["schedule"]["rows"]["weight"].shape == (5, 1)


# ---------------------------------------------------------------- gradient tracking


def test_dsgd_stalls_at_its_closed_form_bias_and_gradient_tracking_reaches_the_optimum():
    """Heterogeneous quadratics on a ring of 8, constant step η: D-SGD's fixed point is
    X* = η (I − (1 − η) W)⁻¹ W B ≠ b̄ (each worker pulled to its own b_i); DSGT's is x_i = b̄."""
    n, d, lr = 8, 6, 0.1
    X0, B = quadratic(n, d)
    topology = build_topology("ring", n)
    W = torch.tensor(topology.matrix(0))
    fixed = lr * torch.linalg.solve(torch.eye(n, dtype=torch.float64) - (1 - lr) * W, W @ B)
    X = drive(Gossip(GossipState(topology)), X0.clone(), B, 600, lr)
    close(X, fixed, 1e-12)
    assert (fixed - B.mean(0)).abs().max() > 0.1
    tracking = GradientTracking(topology, torch.zeros_like(X0), torch.zeros_like(X0))
    X = drive(tracking, X0.clone(), B, 600, lr)
    close(X, B.mean(0).expand(n, d), 1e-12)
    close(tracking.tracker.mean(0), (X - B).mean(0), 1e-12)  # Σ_i y_i = Σ_i g_i


def test_gradient_tracking_sends_twice_the_bytes_of_dsgd():
    gt, _ = train_final("algorithm=gradient-tracking", "topology=ring")
    dsgd, _ = train_final("algorithm=gossip", "topology=ring")
    assert gt["comm_rounds"] == dsgd["comm_rounds"] == gt["steps"]
    assert gt["bytes_per_worker"] == 2 * dsgd["bytes_per_worker"]


# ---------------------------------------------------------------- state


def test_every_schedule_resumes_exactly_from_its_state_dict(tmp_path):
    """Half the steps, state_dict through torch.save, a fresh schedule, load_state_dict, the other half:
    the same X as without the break (CHOCO's copies and round, push-sum weights, the tracker)."""
    X0, B = quadratic(n=5, d=12)
    (tmp_path / "directed.txt").write_text(DIRECTED)
    directed, ring = build_topology(f"edges:{tmp_path / 'directed.txt'}", 5), build_topology("ring", 5)
    makers = {
        "choco": lambda: ChocoSGD(build_topology("directed-exponential", 5), 0.3,
                                  build_compressor("random-k:0.25", [12], X0, seed=1, contractive=True),
                                  X0.unsqueeze(1).repeat(1, 4, 1)),
        "sgp": lambda: PushSum(directed, torch.ones(5, 1, dtype=torch.float64)),
        "gradient-tracking": lambda: GradientTracking(ring, torch.zeros_like(X0), torch.zeros_like(X0)),
    }
    for name, make in makers.items():
        straight = drive(make(), X0.clone(), B, 20, 0.1)
        first = make()
        X = drive(first, X0.clone(), B, 10, 0.1)
        torch.save(first.state_dict(), tmp_path / f"{name}.pt")
        second = make()
        second.load_state_dict(torch.load(tmp_path / f"{name}.pt"))
        assert torch.equal(drive(second, X, B, 10, 0.1, first=10), straight), name


# ---------------------------------------------------------------- quasi-global momentum


@pytest.mark.parametrize("nesterov", [False, True])
def test_quasi_global_momentum_buffer_is_the_ema_of_the_model_change(nesterov):
    """One step by hand: the local step uses m = β m̂ + g (Nesterov: g + β m), and after gossip
    m̂ ← β m̂ + (1 − β)(x^(t) − x^(t+1)) / η."""
    cfg = small_config("algorithm=gossip", "momentum_mode=quasi-global", "momentum=0.9", f"nesterov={nesterov}")
    run = build_run(cfg)
    X, G, buffer, beta, lr = run.workers.X, run.workers.G, run.optimizer.rows["momentum"], 0.9, 0.05
    buffer.copy_(torch.randn_like(buffer))
    X.add_(torch.randn_like(X) * 0.01)  # workers disagree
    G.copy_(torch.randn_like(G))
    x0, m0, g = X.clone(), buffer.clone(), G.clone()
    step = Step(0, lr=lr, measure=False)
    run.schedule.on_gradients(run.engine, X, G, step)
    run.optimizer.step(X, G, lr)
    run.schedule.after_step(run.engine, X, step)
    m = beta * m0 + g
    W = torch.tensor(gossip_state(run.schedule).topology.matrix(0))
    close(X, W @ (x0 - lr * (g + beta * m if nesterov else m)), 1e-12)
    close(buffer, beta * m0 + (1 - beta) * (x0 - X) / lr, 1e-12)


def test_quasi_global_momentum_learns():
    rows, _, _ = train_rows("algorithm=gossip", "momentum_mode=quasi-global", "momentum=0.9", "epochs=4")
    first, last = (sum(r["loss"] for r in part) / 12 for part in (rows[:12], rows[-12:]))
    assert last < first - 0.02  # deterministic: seeds fixed


# ---------------------------------------------------------------- options


@pytest.mark.parametrize("overrides, fragment", [
    (["algorithm=choco", "choco_gamma=0"], "choco_gamma must be in (0, 1], got 0.0"),
    (["algorithm=choco", "choco_gamma=1.5"], "choco_gamma must be in (0, 1]"),
    (["algorithm=choco", "compression=ef-top-k:0.1"], "use compression top-k:0.1, without 'ef-'"),
    (["algorithm=choco", "compression=top-k:0"], "needs a fraction F in (0, 1]"),
    (["algorithm=local", "compression=qsgd:x"], "integer number of levels"),
    (["algorithm=gossip", "choco_gamma=0.5"], "choco_gamma does not apply to algorithm 'gossip'"),
    (["algorithm=choco", "average_optimizer_state=true"], "average_optimizer_state does not apply to algorithm 'choco'"),
    (["algorithm=sgp", "gossip_form=mix-then-step"], "gossip_form does not apply to algorithm 'sgp'"),
    (["algorithm=gossip", "momentum_mode=global"], "unknown momentum_mode 'global'"),
    (["algorithm=gossip", "momentum_mode=quasi-global", "optimizer=adam"], "needs optimizer sgd with momentum > 0"),
    (["algorithm=gossip", "momentum_mode=quasi-global", "momentum=0"], "needs optimizer sgd with momentum > 0"),
    (["algorithm=gossip", "momentum_mode=quasi-global", "momentum=0.9", "average_optimizer_state=true"],
     "cannot be averaged too"),
    (["algorithm=local", "momentum_mode=quasi-global"], "momentum_mode does not apply to algorithm 'local'"),
])
def test_bad_options(overrides, fragment):
    with pytest.raises(ConfigError, match=fragment.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        small_config(*overrides)


@pytest.mark.parametrize("algorithm", ["gossip", "choco", "gradient-tracking"])
def test_only_sgp_runs_on_a_directed_graph(tmp_path, capsys, algorithm):
    edges = tmp_path / "directed.txt"
    edges.write_text(DIRECTED)
    sets = ["--set", "workers=5", "--set", f"algorithm={algorithm}", "--set", f"topology=edges:{edges}"]
    assert main(["train", *sets, "--quiet", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is directed" in err and "only algorithm sgp" in err
    assert not (tmp_path / "run").exists()


def test_push_sum_needs_every_node_to_send(tmp_path, capsys):
    edges = tmp_path / "sink.txt"
    edges.write_text("0 -> 1\n1 -> 2\n0 -> 2\n")
    sets = ["--set", "workers=3", "--set", "algorithm=sgp", "--set", f"topology=edges:{edges}"]
    assert main(["train", *sets, "--quiet", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "node 2 has no out-edge" in err


@pytest.mark.parametrize("overrides", [["algorithm=ad-psgd", "topology={graph}"],
                                       ["algorithm=diloco", "outer_topology={graph}", "local_steps=2"]])
def test_ad_psgd_and_noloco_take_doubly_stochastic_directed_graphs_and_refuse_column_stochastic_ones(
        tmp_path, capsys, overrides):
    """Issue 34 item 6, decided: directed-exponential is a circulant, doubly stochastic though not
    symmetric (as one-peer-exponential, NoLoCo's own example). AD-PSGD's pair average is symmetric
    whoever picks whom, and NoLoCo keeps x̄ with any doubly stochastic W: both run on it (the docs
    said refused); a graph that is only column stochastic is refused, naming it."""
    directed = [o.format(graph="directed-exponential") for o in overrides]
    build_run(small_config(*directed))  # accepted
    edges = tmp_path / "directed.txt"
    edges.write_text(DIRECTED)
    sets = [a for o in ["workers=5", *(o.format(graph=f"edges:{edges}") for o in overrides)] for a in ("--set", o)]
    assert main(["train", *sets, "--quiet", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and ("is directed" in err or "only column stochastic" in err)
