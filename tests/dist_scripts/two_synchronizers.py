"""Run on 2 processes with torchrun's environment and no process group: a synchroniser creates
the group, trains, closes; a second one (the first still referenced) joins it and trains. Rank 0
prints the second one's Ξ² after its average."""

import json

import torch
from torch import nn

from gossamer.integrations import LocalSGD


def train(sync, model, optimizer, steps: int = 2) -> None:
    for _ in range(steps):
        optimizer.zero_grad()
        model(torch.randn(8, 4)).square().mean().backward()
        optimizer.step()


torch.manual_seed(0)
model = nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
first = LocalSGD(model, optimizer, local_steps=2, dist_timeout=20)
train(first, model, optimizer)
first.close()
second = LocalSGD(model, optimizer, local_steps=2, dist_timeout=20)
train(second, model, optimizer)
xi_sq = second.consensus_distance()
second.close()
if second.engine.rank == 0:
    print(json.dumps({"consensus_distance_sq": xi_sq, "comm_rounds": second.comm.rounds}))
