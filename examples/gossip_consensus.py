"""Gossip SGD with consensus control (Kong et al.): after every step each process exchanges its
model with its ring neighbours only; extra gossip rounds keep the consensus distance Ξ below a
target.

    torchrun --standalone --nproc-per-node 8 examples/gossip_consensus.py --target 0.05

Each rank trains on a differently skewed shard (non-i.i.d.), which pulls the models apart; rank 0
prints Ξ, the cheap bound (2/p)Θ and the extra rounds spent, then one JSON line.
"""

import argparse
import json

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from gossamer.integrations import Gossip


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topology", default="ring")
    parser.add_argument("--target", type=float, default=0.05, help="keep Ξ below this")
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    sync = Gossip(model, optimizer, topology=args.topology,
                  consensus={"target": "constant", "value": args.target, "max_extra_rounds": 50})

    generator = torch.Generator().manual_seed(1 + rank)
    shift = torch.full((4,), float(rank))  # each rank sees another region of the input space
    worst, estimates = 0.0, []
    for step in range(args.steps):
        x = torch.randn(32, 4, generator=generator) + shift
        loss = F.mse_loss(model(x), x.sin().sum(1, keepdim=True))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()  # the local step, one gossip round, and extra rounds until Ξ <= target
        xi = sync.consensus_distance() ** 0.5
        worst = max(worst, xi)
        estimates.append(sync.consensus_distance(exact=False) ** 0.5)
        if rank == 0 and step % 20 == 0:
            print(f"step {step:4d}  loss {loss.item():.4f}  Ξ {xi:.4f}  bound {estimates[-1]:.4f}  "
                  f"extra rounds so far {sync.extra_gossip_rounds}", flush=True)

    result = {"max_consensus_distance": worst, "target": args.target, "extra_gossip_rounds": sync.extra_gossip_rounds,
              "steps": args.steps, "comm_rounds": sync.comm.rounds, "mean_bound": sum(estimates) / len(estimates),
              # the ring's rounds, and control's probes of Ξ² that decided them (an all-reduce and a scalar each)
              "gossip_rounds": sync.comm.rounds_by_level["gossip"], "control_rounds": sync.comm.rounds_by_level["control"]}
    sync.close()
    if rank == 0:
        print(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
