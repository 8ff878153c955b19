"""Run under P processes (torchrun, or RANK/WORLD_SIZE/MASTER_* set by tests/test_dist.py).

1. Engine checks: every DistEngine operator against SimEngine on the same full matrix, for
   n = P (one worker per process) and n = 8 (and 9 on 3 processes); the communication counts; what
   gossip really sent. Each rank writes OUT/engine-rank{R}.json.
2. Training: ``gossamer train --set engine=dist`` (through the CLI's own code) for every case in
   CASES (a JSON file: {"runs": [[name, [overrides...]], ...]}), into OUT/NAME — all in one
   process group.

With the wire tap on (:mod:`gossamer.engines.wire`), each engine checks what it hands
torch.distributed against every transfer it records: OUT/wire-NAME-rank{R}.json for a run,
OUT/wire-engine-n{n}-rank{R}.json for the engine checks.
3. With CASES' "hooks" (4 processes): the hooks' process checks of tests/dist_scripts/hooks.py,
   into OUT/hooks, in the same process group (one launch less) — the group that hooks.py's
   two-synchroniser check creates first.
"""

import json
import os
import sys
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from gossamer.cli import main
from gossamer.codecs import QSGD, SignCodec, TopK
from gossamer.engines import wire
from gossamer.engines.dist import DistEngine
from gossamer.engines.sim import SimEngine
from gossamer.faults import repair
from gossamer.groups import Groups
from gossamer.topology import build_topology


def engine_checks(n: int, out: Path, d: int = 37) -> dict:
    g = torch.Generator().manual_seed(n)
    full = torch.randn(n, d, dtype=torch.float64, generator=g)
    os.environ[wire.ENV] = str(out / f"wire-engine-n{n}")
    sim, eng = SimEngine(n), DistEngine(n)
    rows = slice(eng.rows.start, eng.rows.stop)
    diffs = {}

    def check(name, op):
        ref, mine = full.clone(), full[rows].clone()
        got_ref, got = op(sim, ref), op(eng, mine)
        diffs[name] = (mine - ref[rows]).abs().max().item()
        if got_ref is not None:
            diffs[name + " (result)"] = abs(got - got_ref) if isinstance(got, float) else \
                (got - (got_ref[rows] if got_ref.shape[0] == n and got.shape[0] != n else got_ref)).abs().max().item()

    check("allreduce_mean_", lambda e, X: e.allreduce_mean_(X))
    for size in sorted({1, 2, 3, 4, n} & set(range(1, n + 1))):
        if n % size == 0:
            check(f"block_mean_({size})", lambda e, X, s=size: e.block_mean_(X, s))
    # any groups: a random partition into pairs (groups:2; one alone for odd n), and the columns of
    # an n/k × k grid (k = 2, or 3 for odd n)
    k = 2 if n % 2 == 0 else 3
    perm = np.random.default_rng(n).permutation(n)
    pairs = Groups.of(n, [perm[i : i + 2] for i in range(0, n, 2)])
    columns = Groups(n, np.arange(n).reshape(-1, k).T.ravel(), n // k)
    for name, groups in (("pairs", pairs), ("columns", columns)):
        check(f"groups_mean_ {name}", lambda e, X, g=groups: e.groups_mean_(X, g))
    sent_before = (eng.sent.messages, eng.sent.values)
    ring = build_topology("ring", n)
    check("gossip ring", lambda e, X: [e.gossip_(X, ring.mixing(t)) for t in range(3)] and None)
    ring_sent = {"messages": eng.sent.messages - sent_before[0], "values": eng.sent.values - sent_before[1],
                 "rounds": 3, "d": d, "m": eng.m}
    power_of_two = n & (n - 1) == 0  # the exponential graphs' n
    for topo in ("one-peer-exponential", "complete", "exponential")[0 if power_of_two else 1 :]:
        top = build_topology(topo, n)
        check(f"gossip {topo}", lambda e, X, top=top: [e.gossip_(X, top.mixing(t)) for t in range(4)] and None)
    codec = sign = SignCodec([10, 27], dtype=torch.float64)
    for size in (None, k):
        check(f"all_gather sign mean ({size})", lambda e, X, s=size: e.all_gather(codec.encode(X, 4, e.rows), s).mean(codec.decode))
    check("gossip Θ terms", lambda e, X: e.gossip_(X, ring.mixing(0), measure=True))

    def in_the_background(e, X, block_size=None):
        """An all-reduce and an all-gather started (async_op), a gossip round run while they are
        in flight, then both waited for: the all-gather's mean of X's codes, into X."""
        gathered = e.all_gather(codec.encode(X, 4, e.rows), block_size, async_op=True)
        mean = e.allreduce_mean_(X.clone(), async_op=True)
        e.gossip_(X.clone(), ring.mixing(1))
        X.copy_(gathered.wait().mean(codec.decode) + mean.wait())
    for size in (None, k):
        check(f"all_gather and allreduce_mean_ in the background ({size})",
              lambda e, X, s=size: in_the_background(e, X, s))
    top_k, qsgd = TopK([10, 27], 0.2), QSGD([10, 27], 3, seed=1)
    for topo in ("ring", "one-peer-exponential", "directed-exponential") if power_of_two else ("ring",):
        union = build_topology(topo, n).union
        for codec in (top_k, qsgd):  # byte messages to the workers that copy the sender, per slot
            check(f"exchange {type(codec).__name__} {topo}",
                  lambda e, X, c=codec, u=union: e.exchange(c.encode(X, 2, e.rows), u, c.nbytes()).double())
    check("exchange of float rows", lambda e, X: e.exchange(X, ring.union))
    check("mean_row", lambda e, X: e.mean_row(X))
    check("consensus_distance_sq", lambda e, X: e.consensus_distance_sq(X))
    check("mean_scalar", lambda e, X: e.mean_scalar(X[:, 0]))
    # faults: workers 1 and n - 1 gone (with n = 2, worker 1 alone); the same operators over the living
    alive = np.ones(n, dtype=bool)
    alive[[1, n - 1]] = False
    for e in (sim, eng):
        e.set_alive(alive)
    metropolis = repair(ring.mixing(0), alive, per_round=False)
    check("living allreduce_mean_", lambda e, X: e.allreduce_mean_(X))
    for size in sorted({2, 4, n} & set(range(1, n + 1))):
        if n % size == 0:
            check(f"living block_mean_({size})", lambda e, X, s=size: e.block_mean_(X, s))
    for name, groups in (("pairs", pairs), ("columns", columns)):
        check(f"living groups_mean_ {name}", lambda e, X, g=groups: e.groups_mean_(X, g))
    check("living gossip ring (local repair)", lambda e, X: [e.gossip_(X, ring.mixing(0)) for _ in range(3)] and None)
    check("living gossip ring (Metropolis-Hastings)", lambda e, X: [e.gossip_(X, metropolis) for _ in range(3)] and None)
    check("living mean_row", lambda e, X: e.mean_row(X))
    check("living consensus_distance_sq", lambda e, X: e.consensus_distance_sq(X))
    check("living mean_scalar", lambda e, X: e.mean_scalar(X[:, 0]))
    living = torch.tensor(alive, dtype=torch.float64)[:, None]  # a gone worker's row of the result: not defined
    for size in (None, k):
        check(f"living all_gather sign mean ({size})", lambda e, X, s=size: e.all_gather(
            sign.encode(X, 4, e.rows), s).mean(sign.decode) * living[e.rows.start : e.rows.stop])
    check("living exchange of float rows", lambda e, X: e.exchange(X, ring.union))
    peers = np.array(sorted({0, n - 2} - {1}))
    check("fetch_ (a returning worker's neighbours' rows)", lambda e, X: e.fetch_([X], 1, peers))
    for e in (sim, eng):
        e.set_alive(None)
    comm_equal = eng.comm == sim.comm
    eng.close()
    return {"diffs": diffs, "comm_equal": comm_equal, "comm": vars(eng.comm), "ring_sent": ring_sent}


if __name__ == "__main__":
    out, cases = Path(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text())
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    if "hooks" in cases:
        import hooks

        (out / "hooks").mkdir(exist_ok=True)
        hooks.two_synchronizers(out / "hooks")  # creates the group
    else:
        dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    report = {f"n={n}": engine_checks(n, out) for n in sorted({world, 8 if world != 3 else 9})}
    (out / f"engine-rank{rank}.json").write_text(json.dumps(report, indent=1))
    for name, overrides in cases["runs"]:
        os.environ[wire.ENV] = str(out / f"wire-{name}")
        argv = ["train", "--quiet", "--out", str(out / name), "--set", "engine=dist"]
        for o in overrides:
            argv += ["--set", o]
        code = main(argv)
        if code:
            sys.exit(f"case {name} exited with {code}")
    if "hooks" in cases:
        hooks.main(out / "hooks", cases["hooks"])
    dist.destroy_process_group()
