"""Time: the α–β costs of the operators (closed forms), the simulated clock of a run (exact sums,
overlap, measurement, compute from FLOPs), time to a target, and the commands that show time."""

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import small_config, train_rows

from gossamer.cli import main
from gossamer.codecs import SignCodec
from gossamer.engines.ledger import Compute, Transfer
from gossamer.engines.sim import SimEngine
from gossamer.groups import Groups
from gossamer.models import MLP
from gossamer.network import PRESETS, NetworkConfig, span, step_flops
from gossamer.topology import build_topology
from gossamer.train import Interrupted, build_run, train

M = 4_000_000  # bytes of a 1 M-parameter float32 model


def network(workers: int = 16, **keys) -> NetworkConfig:
    net = NetworkConfig(**{"bandwidth": 10.0, "latency": 30.0, **keys})
    net.validate(SimpleNamespace(workers=workers))
    return net


ALPHA, BETA = 30e-6, 10e9 / 8  # the flat network above: 30 µs, 10 Gbit/s


def seconds(net: NetworkConfig, op: str, group: int, nbytes: float, mixing=None) -> float:
    """The time of an operator within consecutive groups of ``group`` workers (a gossip round: along ``mixing``)."""
    groups = None if mixing is not None else Groups.blocks(group * max(1, 16 // group), group)
    return net.seconds(Transfer(op, nbytes, "global", groups=groups, mixing=mixing))


# ---------------------------------------------------------------- the operators


@pytest.mark.parametrize("g", [2, 5, 16])
def test_flat_costs_are_the_ring_formulas(g):
    net = network()
    assert seconds(net, "allreduce", g, M) == pytest.approx(2 * (g - 1) * (ALPHA + M / (g * BETA)), rel=1e-12)
    assert seconds(net, "allgather", g, 1000) == pytest.approx((g - 1) * (ALPHA + 1000 / BETA), rel=1e-12)
    assert seconds(net, "allreduce", 1, M) == 0 and seconds(net, "allreduce", g, 0) == 0


def test_gossip_costs_the_largest_degree_of_the_round():
    net = network()
    one = ALPHA + M / BETA
    ring, exp, complete = (build_topology(t, 16) for t in ("ring", "one-peer-exponential", "complete"))
    assert seconds(net, "gossip", 16, M, ring.mixing(0)) == pytest.approx(2 * one, rel=1e-12)
    assert all(seconds(net, "gossip", 16, M, w) == pytest.approx(one, rel=1e-12) for w in exp.mixings)
    assert seconds(net, "gossip", 16, M, complete.mixing(0)) == pytest.approx(15 * one, rel=1e-12)
    star = build_topology_from_edges([(0, j) for j in range(1, 6)], 6)  # the hub sends and receives 5
    assert seconds(network(6), "gossip", 6, M, star.mixing(0)) == pytest.approx(5 * one, rel=1e-12)


def build_topology_from_edges(edges, n, tmp=None):
    import tempfile
    from pathlib import Path

    path = Path(tempfile.mkdtemp()) / "edges.txt"
    path.write_text("".join(f"{i} {j}\n" for i, j in edges))
    return build_topology(f"edges:{path}", n)


def test_a_cluster_all_reduces_inside_nodes_then_across_them():
    """16 workers as 4 nodes of 4: reduce-scatter inside, 4 shards over the node's link, all-gather."""
    net = network(workers_per_node=4, intra_node_bandwidth=800.0, intra_node_latency=3.0)
    a_i, b_i = 3e-6, 800e9 / 8
    expect = 2 * 3 * (a_i + M / (4 * b_i)) + 2 * 3 * (ALPHA + M / (4 * BETA))
    assert seconds(net, "allreduce", 16, M) == pytest.approx(expect, rel=1e-12)
    # a block inside one node: the intra-node ring alone; blocks of 8 span 2 nodes
    assert seconds(net, "allreduce", 4, M) == pytest.approx(2 * 3 * (a_i + M / (4 * b_i)), rel=1e-12)
    assert seconds(net, "allreduce", 8, M) == pytest.approx(2 * 3 * (a_i + M / (4 * b_i)) + 2 * (ALPHA + M / (2 * BETA)),
                                                          rel=1e-12)
    B = 1000
    assert seconds(net, "allgather", 16, B) == pytest.approx(3 * (ALPHA + 4 * B / BETA) + 3 * (a_i + 4 * B / b_i), rel=1e-12)
    # one node holding every worker is the flat formula on the intra-node link
    whole = network(workers_per_node=16, intra_node_bandwidth=10.0, intra_node_latency=30.0)
    assert seconds(whole, "allreduce", 16, M) == pytest.approx(seconds(network(), "allreduce", 16, M), rel=1e-12)


def test_a_ring_over_nodes_sends_two_messages_across_each_node_link():
    net = network(workers_per_node=4, intra_node_bandwidth=800.0, intra_node_latency=3.0)
    ring, complete = build_topology("ring", 16), build_topology("complete", 8)
    intra, inter = 3e-6 + M / (800e9 / 8), ALPHA + M / BETA
    assert seconds(net, "gossip", 16, M, ring.mixing(0)) == pytest.approx(max(2 * intra, 2 * inter), rel=1e-12)
    # complete graph of 2 nodes of 4: 3 node-mates each; 4 × 4 messages leave each node
    net8 = network(8, workers_per_node=4, intra_node_bandwidth=800.0, intra_node_latency=3.0)
    assert seconds(net8, "gossip", 8, M, complete.mixing(0)) == pytest.approx(max(3 * intra, 16 * inter), rel=1e-12)


def test_groups_that_straddle_nodes_take_their_worst_placement():
    def blocks(g: int, w: int) -> tuple[int, int]:
        return span(Groups.blocks(math.lcm(g, w), g), w)
    assert blocks(4, 4) == (1, 4) and blocks(16, 4) == (4, 4) and blocks(8, 4) == (2, 4)
    assert blocks(4, 6) == (2, 4)  # blocks 0-3, 4-7 (across nodes 0|1: 2 + 2), 8-11 (inside node 1)
    assert blocks(3, 1) == (3, 1)
    # any groups: the same measure over their members (a grid's columns of 4 across 4 nodes of 4)
    columns = Groups(16, np.arange(16).reshape(4, 4).T.ravel(), 4)
    assert span(columns, 4) == (4, 1) and span(columns.among(np.arange(16) >= 4), 4) == (3, 1)  # node 0 gone


def test_presets_and_their_units():
    net = NetworkConfig("ethernet-10g")
    net.validate(SimpleNamespace(workers=4))
    assert (net.bandwidth, net.latency) == (PRESETS["ethernet-10g"].bandwidth, PRESETS["ethernet-10g"].latency)
    assert net.link.bandwidth == 10e9 / 8 and net.link.latency == 25e-6
    cluster = NetworkConfig("ethernet-1g", workers_per_node=2)
    cluster.validate(SimpleNamespace(workers=4))
    assert cluster.intra_node_bandwidth == PRESETS["nvlink"].bandwidth  # NVLink inside a node unless given


# ---------------------------------------------------------------- the clock of a run


NET = ["network.bandwidth=1", "network.latency=50"]  # 1 Gbit/s, 50 µs
A1, B1 = 50e-6, 1e9 / 8


def test_without_a_network_nothing_is_timed_and_the_network_changes_no_training(tmp_path, capsys):
    plain, timed = tmp_path / "plain", tmp_path / "timed"
    base = ["workers=4", "epochs=1", "num_samples=1000", "algorithm=gossip", "lr=0.05"]
    assert main(["train", "--quiet", "--out", str(plain), *sets(*base)]) == 0
    assert main(["train", "--quiet", "--out", str(timed), *sets(*base, *NET, "compute_ms=2")]) == 0
    rows = [json.loads(line) for line in (plain / "metrics.jsonl").read_text().splitlines()]
    timed_rows = [json.loads(line) for line in (timed / "metrics.jsonl").read_text().splitlines()]
    assert not any("seconds" in k for r in rows for k in r)
    timed_keys = ("sim_seconds", "idle_seconds", "compute_utilization", "compute_utilization_min")
    assert all(set(timed_keys) <= r.keys() for r in timed_rows)
    assert [{k: v for k, v in r.items() if k not in timed_keys} for r in timed_rows] == rows
    summary = json.loads((plain / "summary.json").read_text())
    assert [k for k in summary if "seconds" in k or "target" in k] == ["wall_seconds"]
    assert "network" not in (plain / "config.yaml").read_text() and "compute_ms" not in (plain / "config.yaml").read_text()
    assert "bandwidth: 1.0" in (timed / "config.yaml").read_text()


def sets(*overrides: str) -> list[str]:
    return [a for o in overrides for a in ("--set", o)]


def all_reduce_seconds(d: int, n: int = 4) -> float:
    """A ring all-reduce of d float64 values (the small config's dtype)."""
    return 2 * (n - 1) * (A1 + d * 8 / (n * B1))


def test_all_reduce_sgd_time_is_steps_times_compute_plus_one_all_reduce():
    rows, summary, run = train_rows("algorithm=allreduce", "epochs=1", *NET, "compute_ms=2",
                                    "network.count_metrics=false", "target_accuracy=1.0")
    step = 2e-3 + all_reduce_seconds(summary["parameters"])
    assert summary["sim_seconds"] == pytest.approx(summary["steps"] * step, rel=1e-12)
    assert summary["sim_seconds_comm"] == pytest.approx(summary["steps"] * (step - 2e-3), rel=1e-12)
    assert [r["sim_seconds"] for r in rows] == pytest.approx([r["step"] * step for r in rows], rel=1e-12)
    assert rows[-1]["sim_seconds"] == summary["sim_seconds"]
    assert summary["steps_to_target"] is None and summary["sim_seconds_to_target"] is None  # never reached


def test_local_sgd_pays_one_all_reduce_per_h_steps_and_sign_its_exact_message():
    common = ["algorithm=local", "local_steps=3", "epochs=1", *NET, "compute_ms=2", "network.count_metrics=false"]
    _, summary, run = train_rows(*common)
    steps = summary["steps"]
    assert summary["sim_seconds_comm"] == pytest.approx(steps // 3 * all_reduce_seconds(summary["parameters"]),
                                                        rel=1e-12)
    _, summary, run = train_rows(*common, "compression=sign")
    message = SignCodec([s.numel for s in run.workers.param_slots]).nbytes()
    assert summary["sim_seconds_comm"] == pytest.approx(steps // 3 * 3 * (A1 + message / B1), rel=1e-12)


@pytest.mark.parametrize("delay, compute_ms", [(0, 2.0), (1, 0.05), (3, 0.05), (1, 20.0)])
def test_a_streaming_fragment_runs_behind_the_compute_of_its_delay(delay, compute_ms):
    """Streaming DiLoCo, H = 4, F = 2: each send all-reduces one fragment, which costs
    max(0, comm − w·c) with w = min(τ, ⌊H/F⌋) = min(τ, 2) (τ = 0: all of it; c = 20 ms hides all)."""
    _, summary, run = train_rows("algorithm=diloco", "local_steps=4", "fragments=2", f"fragment_delay={delay}",
                                 "epochs=1", *NET, f"compute_ms={compute_ms}", "network.count_metrics=false")
    schedule, c, w = run.schedule, compute_ms / 1000, min(delay, 2)
    sends = [(j, cols) for t in range(summary["steps"]) for j, cols in enumerate(schedule.fragments)
             if schedule.sends(j, t)]
    comm = sum(max(0.0, all_reduce_seconds(cols.stop - (cols.start or 0)) - w * c) for _, cols in sends)
    assert {j for j, _ in sends} == {0, 1} and (comm == 0) == (delay > 0 and compute_ms == 20.0)
    assert summary["sim_seconds"] == pytest.approx(summary["steps"] * c + comm, rel=1e-12)


@pytest.mark.parametrize("compute_ms", [0.05, 20.0])  # communication longer, and shorter, than the backward
def test_overlap_hides_the_gradient_all_reduce_behind_the_backward(compute_ms):
    _, summary, _ = train_rows("algorithm=allreduce", "epochs=1", *NET, f"compute_ms={compute_ms}",
                               "network.count_metrics=false", "network.overlap=true")
    c, comm = compute_ms / 1000, all_reduce_seconds(summary["parameters"])
    assert summary["sim_seconds"] == pytest.approx(summary["steps"] * (c + max(0.0, comm - 2 * c / 3)), rel=1e-12)


def test_overlap_leaves_model_averaging_after_the_step():
    """Post-local SGD: the gradient all-reduces before the switch overlap, the model averages after
    it do not (they need the step's result)."""
    _, summary, _ = train_rows("algorithm=post-local", "switch_step=6", "local_steps=2", "epochs=1", *NET,
                               "compute_ms=20", "network.count_metrics=false", "network.overlap=true")
    comm = all_reduce_seconds(summary["parameters"])
    hidden = 6 * (0.02 + max(0.0, comm - 0.02 * 2 / 3))  # comm < backward: fully hidden
    assert summary["sim_seconds"] == pytest.approx(hidden + (summary["steps"] - 6) * 0.02 + 3 * comm, rel=1e-12)


def test_measurement_is_priced_apart_and_costs_time_only_when_counted():
    _, free, _ = train_rows("algorithm=gossip", "epochs=1", *NET, "compute_ms=1")
    _, paid, _ = train_rows("algorithm=gossip", "epochs=1", *NET, "compute_ms=1", "network.count_metrics=true")
    steps, d, n = paid["steps"], paid["parameters"], 4
    ring = 2 * (A1 + d * 8 / B1)  # 2 peers, d float64 values
    # every step: φ², the loss and Θ² (scalar all-gathers), Ξ² (an all-reduce of d and one); the
    # evaluation: x̄ of X (an all-reduce; the CNN has no buffers to average), the local-mean
    # accuracy, the per-layer Ξ² (two all-reduces)
    scalar, vector = (n - 1) * (A1 + 8 / B1), all_reduce_seconds(d)
    metrics = steps * (4 * scalar + vector) + (scalar + 3 * vector)
    assert paid["sim_seconds_comm"] == pytest.approx(steps * ring + metrics, rel=1e-12)
    assert free["sim_seconds_comm"] == pytest.approx(steps * ring, rel=1e-12)
    assert free["sim_seconds"] == pytest.approx(steps * (0.001 + ring), rel=1e-12)
    assert free["sim_seconds_metrics"] == paid["sim_seconds_metrics"] == pytest.approx(metrics, rel=1e-12)


def test_compute_from_flops_counts_forward_and_backward():
    torch.manual_seed(0)
    b, sizes = 16, (40, 100, 100, 10)
    model = MLP(40, (100, 100), 10).double()
    x, y = torch.randn(b, 1, 40, dtype=torch.float64), torch.randint(0, 10, (b,))
    forward = sum(2 * b * i * o for i, o in zip(sizes, sizes[1:]))
    # backward: the weight gradients of every layer and the input gradients of all but the first
    flops = 3 * forward - 2 * b * 40 * 100
    assert step_flops(model, x, y, torch.nn.functional.cross_entropy) == flops
    _, summary, run = train_rows("model=mlp", "algorithm=allreduce", "epochs=1", *NET, "compute_ms=flops:0.5")
    compute = summary["sim_seconds"] - summary["sim_seconds_comm"]
    assert compute == pytest.approx(summary["steps"] * flops / 0.5e12, rel=1e-9)


def test_time_to_target_is_the_first_evaluation_that_reaches_it():
    rows, summary, _ = train_rows("algorithm=allreduce", "epochs=3", "lr=0.5", "momentum=0.9", *NET, "compute_ms=1",
                                  "target_accuracy=0.15")
    first = next(r for r in rows if r.get("test_accuracy", 0) >= 0.15)
    assert summary["steps_to_target"] == first["step"] and summary["sim_seconds_to_target"] == first["sim_seconds"]


def test_with_measured_compute_only_the_seconds_differ_after_a_resume():
    """Exact resume with a numeric compute_ms is tests/test_durable.py's; measured compute is
    wall-clock time, so there only the simulated times (and the compute's share of them) differ."""
    cfg = small_config("algorithm=gossip", "epochs=1", *NET, "target_accuracy=0.01")
    straight_rows, resumed_rows, states = [], [], []
    straight = train(cfg, build_run(cfg), on_row=straight_rows.append)
    with pytest.raises(Interrupted):
        train(cfg, build_run(cfg), on_row=resumed_rows.append, on_checkpoint=states.append,
              stop=lambda: len(resumed_rows) == 5)
    resumed = train(cfg, build_run(cfg), on_row=resumed_rows.append, resume=states[-1])
    assert states[-1]["progress"]["sim_seconds"] > 0
    assert straight["sim_seconds"] > straight["sim_seconds_comm"] > 0  # the simulator's compute was measured
    assert all(b["sim_seconds"] > a["sim_seconds"] for a, b in zip(straight_rows, straight_rows[1:]))

    def untimed(d: dict) -> dict:
        return {k: v for k, v in d.items() if "_seconds" not in k and not k.startswith("compute_utilization")}
    assert [untimed(r) for r in resumed_rows] == [untimed(r) for r in straight_rows]
    assert untimed(resumed) == untimed(straight) and resumed["steps_to_target"] == 12


def test_every_operator_the_engine_counts_is_priced():
    """The entries the clock prices are the recorded operators, metric traffic apart."""
    e = SimEngine(4)
    e.comm.keep()
    X = torch.randn(4, 10)
    e.allreduce_mean_(X)
    e.block_mean_(X, 2)
    e.gossip_(X, build_topology("ring", 4).mixing(0))
    e.comm.compute(None, 0)
    e.consensus_distance_sq(X)
    entries = e.comm.take()
    assert [(t.op, t.groups.size if t.groups else None, t.nbytes, t.level) for t in entries if isinstance(t, Transfer)] == [
        ("allreduce", 4, 40, "global"), ("allreduce", 2, 40, "block"), ("gossip", None, 40, "gossip"),
        ("allreduce", 4, 40, "metrics"), ("allgather", 4, 4, "metrics")]
    assert isinstance(entries[3], Compute) and entries[3].workers is None
    assert e.comm.take() == [] and "entries" not in e.comm.state_dict()


# ---------------------------------------------------------------- commands and bad input


@pytest.mark.parametrize("overrides, fragment", [
    (["network.bandwidth=0", "network.latency=5"], "network.bandwidth must be > 0"),
    (["network.bandwidth=-3", "network.latency=5"], "network.bandwidth must be > 0"),
    (["network=ethernet-1g", "network.latency=.nan"], "network.latency must be a finite number"),
    (["network=ethernet-1g", "network.latency=-1"], "network.latency must be >= 0"),
    (["network=token-ring"], "unknown network preset 'token-ring'; choose one of: nvlink"),
    (["network=[1, 2]"], "network must be a preset name or a section of keys"),
    (["network.bandwidth=10"], "network needs bandwidth (Gbit/s) and latency"),
    (["network=ethernet-1g", "network.workers_per_node=3"], "workers_per_node must be a positive divisor"),
    (["network=ethernet-1g", "network.intra_node_latency=2"], "apply only with network.workers_per_node > 1"),
    (["target_accuracy=0"], "target_accuracy must be in (0, 1]"),
    (["target_accuracy=1.5"], "target_accuracy must be in (0, 1]"),
    (["target_accuracy=.nan"], "target_accuracy must be a finite number"),
    (["target_loss=0.5"], "target_loss does not apply to the classification task"),
    (["target_accuracy=0.5", "target_loss=1"], "not both"),
    (["compute_ms=5"], "compute_ms applies only with a network section"),
    (["network=nvlink", "compute_ms=fast"], "compute_ms must be measured, a number of milliseconds or flops:TFLOPS"),
    (["network=nvlink", "compute_ms=flops:0"], "flops:TFLOPS needs a device throughput > 0"),
])
def test_bad_time_options_are_one_line(tmp_path, capsys, overrides, fragment):
    code = main(["train", "--quiet", "--out", str(tmp_path / "never"), *sets("workers=4", *overrides)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and fragment in err, err
    assert not (tmp_path / "never").exists()


def test_a_preset_takes_changes_to_its_numbers(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--quiet", "--out", str(out), *sets("workers=4", "epochs=1", "num_samples=1000",
                                                              "network=ethernet-10g", "network.latency=80",
                                                              "compute_ms=1")]) == 0
    saved = (out / "config.yaml").read_text()
    assert "preset: ethernet-10g" in saved and "latency: 80.0" in saved and "bandwidth: 10.0" in saved


@pytest.fixture(scope="module")
def timed_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("timed")
    base = ["workers=4", "epochs=1", "num_samples=1000", "lr=0.05", "network=ethernet-1g", "compute_ms=1",
            "target_accuracy=0.01"]
    for name, algorithm in (("allreduce", ["algorithm=allreduce"]), ("local", ["algorithm=local", "local_steps=4"])):
        assert main(["train", "--quiet", "--out", str(root / name), *sets(*base, *algorithm)]) == 0
    assert main(["train", "--quiet", "--out", str(root / "untimed"), *sets(*base[:4])]) == 0
    return root


def test_compare_along_simulated_time(timed_runs, capsys):
    assert main(["compare", str(timed_runs / "allreduce"), str(timed_runs / "local"), "--x", "time"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].startswith("| run | test_accuracy | simulated time (s) | communication | simulated time (s) to target")
    summaries = {n: json.loads((timed_runs / n / "summary.json").read_text()) for n in ("allreduce", "local")}
    budget = min(s["sim_seconds"] for s in summaries.values())
    assert f"test_accuracy at {budget:.4g}" in table[0]
    for line, name in zip(table[2:], ("allreduce", "local")):
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[2] == f"{summaries[name]['sim_seconds']:.4g}"
    assert main(["compare", str(timed_runs / "allreduce"), str(timed_runs / "untimed"), "--x", "time"]) == 2
    assert "trained without a network section" in capsys.readouterr().err
    assert main(["compare", str(timed_runs / "allreduce"), str(timed_runs / "untimed"), "--x", "epochs"]) == 0


def test_plot_writes_one_png_and_keeps_existing_files(timed_runs, tmp_path, capsys):
    out = tmp_path / "acc.png"
    runs = [str(timed_runs / "allreduce"), str(timed_runs / "local")]
    assert main(["plot", *runs, "--x", "time", "--out", str(out)]) == 0
    assert out.read_bytes()[:4] == b"\x89PNG" and out.stat().st_size > 10_000
    before = out.read_bytes()
    assert main(["plot", *runs, "--out", str(out)]) == 2 and out.read_bytes() == before
    assert main(["plot", *runs, "--y", "loss", "--x", "epochs", "--out", str(out), "--overwrite"]) == 0
    assert main(["plot", *runs, "--out", str(tmp_path / "acc.pdf")]) == 2
    assert main(["plot", str(timed_runs / "untimed"), "--x", "time", "--out", str(tmp_path / "u.png")]) == 2
    assert not (tmp_path / "u.png").exists()


def test_topology_with_a_network_gives_the_time_of_a_round_and_of_halving(capsys):
    assert main(["topology", "ring", "-n", "32", "--network", "ethernet-10g", "--parameters", "250000", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    one = 25e-6 + 1e6 / (10e9 / 8)
    assert info["round_seconds"] == pytest.approx(2 * one, rel=1e-12)
    assert info["halve_seconds"] == pytest.approx(info["rounds_to_halve"] * 2 * one, rel=1e-12)
    assert info["allreduce_seconds"] == pytest.approx(62 * (25e-6 + 1e6 / (32 * 10e9 / 8)), rel=1e-12)
    assert math.isfinite(info["halve_seconds"])
    with pytest.raises(SystemExit) as e:
        main(["topology", "ring", "-n", "8", "--network", "token-ring"])
    assert e.value.code == 2 and "invalid choice: 'token-ring'" in capsys.readouterr().err
