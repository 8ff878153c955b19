"""Post-local SGD on top of DistributedDataParallel (Lin et al.): DDP's gradient all-reduce until
``--switch-step``, then local SGD with an average every ``--local-steps`` steps.

    torchrun --standalone --nproc-per-node 4 examples/ddp_post_local.py

The synchroniser registers a comm hook on the DDP model: DDP all-reduces the gradients before the
switch and keeps them local after it. Rank 0 prints Ξ² before and after the switch, then one JSON line.
"""

import argparse
import json

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from gossamer.integrations import LocalSGD


def blobs(n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Three Gaussian classes in 10 dimensions (the centres are the same on every rank)."""
    centres = torch.randn(3, 10, generator=torch.Generator().manual_seed(0)) * 2
    y = torch.randint(0, 3, (n,), generator=generator)
    return centres[y] + torch.randn(n, 10, generator=generator), y


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--switch-step", type=int, default=40)
    parser.add_argument("--local-steps", type=int, default=4)
    parser.add_argument("--steps", type=int, default=120)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 3)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True)
    sync = LocalSGD(model, optimizer, local_steps=args.local_steps, switch_step=args.switch_step)

    generator = torch.Generator().manual_seed(1 + rank)
    xi_before, xi_after, losses = [], [], []
    for step in range(args.steps):
        x, y = blobs(64, generator)
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        xi_sq = sync.consensus_distance()
        (xi_before if step < args.switch_step else xi_after).append(xi_sq)
        if rank == 0 and step % 20 == 0:
            print(f"step {step:4d}  loss {loss.item():.4f}  Ξ² {xi_sq:.3e}", flush=True)

    x, y = blobs(2000, torch.Generator().manual_seed(99))
    sync.average_parameters_()  # evaluate the averaged model
    with torch.no_grad():
        accuracy = (model(x).argmax(1) == y).float().mean().item()
    result = {"max_xi_sq_before_switch": max(xi_before), "max_xi_sq_after_switch": max(xi_after),
              "first_loss": sum(losses[:10]) / 10, "last_loss": sum(losses[-10:]) / 10, "test_accuracy": accuracy,
              "comm_rounds": sync.comm.rounds}
    sync.close()
    if rank == 0:
        print(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
