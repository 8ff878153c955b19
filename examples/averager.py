"""Train a plain PyTorch model with gossip averaging across processes (gossamer's library API).

    torchrun --standalone --nproc-per-node 4 examples/averager.py [--algorithm local --local-steps 4]

Each process is one worker with its own shard of a synthetic regression problem, its own model
replica and its own optimizer; after every optimizer step the Averager gossips the parameters
with the ring neighbours (or averages them exactly every H steps with --algorithm local).
Rank 0 prints the loss and the consensus distance Ξ², and finally one JSON line.
"""

import argparse
import json

import torch
from torch import nn

from gossamer.averager import Averager


class TinyNet(nn.Module):  # any nn.Module works: nothing gossamer-specific here
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))

    def forward(self, x):
        return self.body(x)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algorithm", default="gossip", help="gossip, local or allreduce")
    parser.add_argument("--topology", default="ring")
    parser.add_argument("--local-steps", type=int, default=1)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()

    torch.manual_seed(0)
    true_w = torch.randn(8, 1)  # the same problem everywhere; the data shards differ per rank
    model = TinyNet()
    options = {"gossip": {"topology": args.topology}, "local": {"local_steps": args.local_steps}}
    averager = Averager(model, algorithm=args.algorithm, **options.get(args.algorithm, {}))
    rank = averager.engine.rank
    torch.manual_seed(1 + rank)
    x = torch.randn(512, 8)
    y = torch.tanh(x @ true_w) + 0.05 * torch.randn(512, 1)

    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    losses = []
    for step in range(args.steps):
        batch = torch.randint(0, len(x), (32,))
        loss = nn.functional.mse_loss(model(x[batch]), y[batch])
        optimizer.zero_grad()
        loss.backward()
        averager.average_gradients()  # does something for allreduce only
        optimizer.step()
        averager.step()
        losses.append(loss.item())
        if step % 50 == 0 or step == args.steps - 1:
            xi_sq = averager.consensus_distance()  # a collective: every rank calls it
            if rank == 0:
                print(f"step {step:4d}  loss {loss.item():.4f}  Ξ² {xi_sq:.3e}", flush=True)

    full_loss = nn.functional.mse_loss(model(x), y).item()
    xi_sq = averager.consensus_distance()
    averager.close()
    if rank == 0:
        print(json.dumps({"first_loss": sum(losses[:10]) / 10, "final_loss": full_loss,
                          "consensus_distance_sq": xi_sq, "bytes_per_worker": averager.comm.bytes_per_worker}))


if __name__ == "__main__":
    main()
