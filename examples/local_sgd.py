"""Local SGD in a plain PyTorch loop: two lines added, one model per process.

    torchrun --standalone --nproc-per-node 4 examples/local_sgd.py --local-steps 8

Every process trains its own replica on its own shard of a regression problem; after every
``local_steps`` optimizer steps the models are averaged (an all-reduce of the flat parameters).
Rank 0 prints the loss, the consensus distance Ξ² and the traffic, then one JSON line.
"""

import argparse
import json

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from gossamer.integrations import LocalSGD


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--local-steps", type=int, default=8)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)  # the same initial model on every rank
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))
    teacher = torch.randn(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sync = LocalSGD(model, optimizer, local_steps=args.local_steps)  # <- gossamer, line 1 of 2

    torch.manual_seed(1 + rank)  # this rank's data
    x = torch.randn(1024, 8)
    y = torch.tanh(x @ teacher) + 0.05 * torch.randn(1024, 1)
    losses = []
    for step in range(args.steps):
        batch = torch.randint(0, len(x), (32,))
        loss = F.mse_loss(model(x[batch]), y[batch])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()  # the average every local_steps steps happens in here
        losses.append(loss.item())
        if step % 50 == 0:
            xi_sq = sync.consensus_distance()  # a collective: every rank calls it
            if rank == 0:
                print(f"step {step:4d}  loss {loss.item():.4f}  Ξ² {xi_sq:.3e}", flush=True)

    result = {"first_loss": sum(losses[:10]) / 10, "final_loss": F.mse_loss(model(x), y).item(),
              "consensus_distance_sq": sync.consensus_distance(), "comm_rounds": sync.comm.rounds,
              "bytes_per_worker": sync.comm.bytes_per_worker}
    sync.close()  # <- line 2 (optional): remove the hooks
    if rank == 0:
        print(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
