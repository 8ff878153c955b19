"""The library hooks of gossamer.integrations in a plain PyTorch loop, one model per worker: in
threads of one process over a ThreadedSim engine (tests/test_integrations.py imports this), or in
the 4 processes of the dist tests' launch (tests/dist_scripts/parity.py calls :func:`main`) for the
wiring that needs real processes (DDP, process groups, a DistEngine's messages).

1. Parity: for every case in CASES (a JSON file of [name, overrides, hook]), the loop trains the
   model that ``gossamer train`` builds from the same config (same init, data order and learning
   rates) with ``torch.optim.SGD`` and the hook; each rank saves its flat parameters and counts to
   OUT/NAME/rank{R}.pt, to be compared with the simulator's run of the same overrides.
2. Resume: the first half, then state_dicts into fresh objects, then the second half, against
   one straight run: OUT/resume-rank{R}.json.
3. Buffers, process groups and bad input: OUT/checks-rank{R}.json.
4. Before any process group exists (parity.py calls :func:`two_synchronizers` first): a
   synchroniser creates the group, trains, closes; a second one (the first still referenced) joins
   it and trains — no false "lost rank", no hang. Rank 0 writes the second one's Ξ² after its
   average to OUT/synchronizers.json.
"""

import json
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from gossamer.config import load_config
from gossamer.integrations import LocalSGD
from gossamer.registry import ConfigError
from gossamer.testing import hooked, hooked_data, hooked_steps, hooked_total_steps

# the user's loop: gossamer.testing's (the conformance kit runs it on a plugin's entries)
build, train, load, total_steps = hooked, hooked_steps, hooked_data, hooked_total_steps


def parity(out: Path, name: str, overrides: list[str], hook: dict, rank: int, engine=None) -> None:
    cfg = load_config(None, overrides)
    data = load(cfg)
    model, optimizer, sync = build(cfg, data, hook, engine=engine)
    train(cfg, data, model, optimizer, range(total_steps(cfg, data)), rank)
    (out / name).mkdir(exist_ok=True)
    storage = sync.X.untyped_storage().data_ptr()  # the parameters are still views into the row X: no copies
    views = all(p.untyped_storage().data_ptr() == storage for p in model.parameters())
    sent = vars(sync.engine.sent) if hasattr(sync.engine, "sent") else None  # what a DistEngine sent
    torch.save({"X": sync.X.clone(), "comm": sync.comm.state_dict(), "step": sync.t, "sent": sent, "views": views,
                "exact": sync.consensus_distance(), "bound": sync.consensus_distance(exact=False)},
               out / name / f"rank{rank}.pt")
    sync.close()


def resume(overrides: list[str], hook: dict, cuts: list[int], rank: int, engine=None) -> float:
    """max |X_straight − X_resumed| after all steps, for a run stopped after each of ``cuts`` steps
    and continued by fresh objects from the state_dicts (a chain of restarts)."""
    cfg = load_config(None, overrides)
    data = load(cfg)
    steps = total_steps(cfg, data)
    model, optimizer, sync = build(cfg, data, hook, engine=engine)
    train(cfg, data, model, optimizer, range(steps), rank)
    straight = sync.X.clone()
    sync.close()
    saved, start = None, 0
    for stop in (*cuts, steps):
        model, optimizer, sync = build(cfg, data, hook, engine=engine)
        if saved is not None:
            model.load_state_dict(saved["model"])
            optimizer.load_state_dict(saved["optimizer"])
            sync.load_state_dict(saved["sync"])
        train(cfg, data, model, optimizer, range(start, stop), rank)
        saved, start = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "sync": sync.state_dict()}, stop
        sync.close()
    return (sync.X - straight).abs().max().item()


class BNNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 1))

    def forward(self, x):
        return self.body(x)


def buffer_check(buffers: str) -> dict:
    """LocalSGD(H = 2) on a BatchNorm model, each rank on its own data: the buffers right before and
    after the sync at step 2, as (their spread across ranks, the distance from the mean before)."""
    torch.manual_seed(0)
    model = BNNet().double()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = {}

    def before(opt, args, kwargs):  # registered first: runs before the synchroniser's own hook
        seen["before"] = torch.cat([b.detach().reshape(-1).clone() for b in model.buffers() if b.is_floating_point()])

    optimizer.register_step_post_hook(before)
    sync = LocalSGD(model, optimizer, local_steps=2, buffers=buffers)
    g = torch.Generator().manual_seed(10 + dist.get_rank())
    for _ in range(2):
        x = torch.randn(16, 6, generator=g, dtype=torch.float64) * (1 + dist.get_rank())
        optimizer.zero_grad()
        model(x).square().mean().backward()
        optimizer.step()
    after = torch.cat([b.detach().reshape(-1) for b in model.buffers() if b.is_floating_point()])
    mean_before = seen["before"].clone()
    dist.all_reduce(mean_before)
    mean_before /= dist.get_world_size()
    spread = after.clone()
    dist.all_reduce(spread, op=dist.ReduceOp.MAX)
    low = after.clone()
    dist.all_reduce(low, op=dist.ReduceOp.MIN)
    sync.close()
    return {"spread": (spread - low).abs().max().item(), "from_mean": (after - mean_before).abs().max().item()}


def group_check() -> dict:
    """Two groups of two ranks ({0, 1} and {2, 3}), local SGD inside each: after a sync the models
    are equal inside a group and differ between the groups."""
    groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    mine = groups[dist.get_rank() // 2]
    torch.manual_seed(0)
    model = nn.Linear(4, 1).double()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    sync = LocalSGD(model, optimizer, local_steps=2, group=mine)
    g = torch.Generator().manual_seed(dist.get_rank())
    for _ in range(2):
        optimizer.zero_grad()
        model(torch.randn(8, 4, generator=g, dtype=torch.float64)).square().mean().backward()
        optimizer.step()
    rows = [torch.empty_like(sync.X) for _ in range(dist.get_world_size())]
    dist.all_gather(rows, sync.X)
    sync.close()
    return {"inside": max((rows[0] - rows[1]).abs().max().item(), (rows[2] - rows[3]).abs().max().item()),
            "between": (rows[0] - rows[2]).abs().max().item(), "workers": sync.engine.n}


def bad_input(out: Path) -> dict:
    """The one-line error of each bad use (raised alike on every rank), by case."""
    cfg = load_config(None, ["workers=4", "num_samples=1000", "dtype=float64"])
    data = load(cfg)
    edges = out / "six-nodes.txt"
    cases = {
        "models differ": ({"kind": "LocalSGD"}, dist.get_rank()),
        "block size": ({"kind": "LocalSGD", "kwargs": {"local_steps": 2, "block_size": 3}}, None),
        "post-local hierarchical": ({"kind": "LocalSGD", "kwargs": {"switch_step": 2, "block_size": 2}}, None),
        "topology size": ({"kind": "Gossip", "kwargs": {"topology": f"edges:{edges}"}}, None),
        "buffers": ({"kind": "Gossip", "kwargs": {"buffers": "everywhere"}}, None),
        "phases": ({"kind": "Gossip", "kwargs": {"phases": ["gossip", "allreduce"]}}, None),
    }
    errors = {}
    for name, (hook, seed) in cases.items():
        try:
            build(cfg, data, hook, seed)[2].close()
            errors[name] = None
        except ConfigError as e:
            errors[name] = str(e)
    ddp = DistributedDataParallel(BNNet().double())
    try:
        LocalSGD(ddp, torch.optim.SGD(ddp.parameters(), lr=0.1), buffers="average")
        errors["ddp broadcasts buffers"] = None
    except ConfigError as e:
        errors["ddp broadcasts buffers"] = str(e)
    return errors


def two_synchronizers(out: Path) -> None:
    """Item 4 of the module's docstring, on torchrun's environment and no process group."""
    def steps(model, optimizer) -> None:
        for _ in range(2):
            optimizer.zero_grad()
            model(torch.randn(8, 4)).square().mean().backward()
            optimizer.step()
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    first = LocalSGD(model, optimizer, local_steps=2)
    steps(model, optimizer)
    first.close()
    second = LocalSGD(model, optimizer, local_steps=2)
    steps(model, optimizer)
    xi_sq = second.consensus_distance()
    second.close()
    if second.engine.rank == 0:
        (out / "synchronizers.json").write_text(json.dumps({"consensus_distance_sq": xi_sq,
                                                            "comm_rounds": second.comm.rounds}))


def main(out: Path, cases: dict) -> None:
    """Every process check, in the current process group (4 processes)."""
    rank = dist.get_rank()
    for name, overrides, hook in cases["parity"]:
        parity(out, name, overrides, hook, rank)
    resumed = {name: resume(overrides, hook, cuts, rank) for name, overrides, hook, cuts in cases["resume"]}
    (out / f"resume-rank{rank}.json").write_text(json.dumps(resumed))
    if rank == 0:
        (out / "six-nodes.txt").write_text("0 1\n1 2\n2 3\n3 4\n4 5\n5 0\n")
    dist.barrier()
    checks = {"buffers average": buffer_check("average"), "buffers local": buffer_check("local"),
              "groups": group_check(), "errors": bad_input(out)}
    (out / f"checks-rank{rank}.json").write_text(json.dumps(checks, indent=1))
