"""DiLoCo (Douillard et al.): H inner AdamW steps per process, then an outer Nesterov SGD step on
the averaged pseudo-gradient, with an outer optimizer you choose.

    torchrun --standalone --nproc-per-node 4 examples/diloco.py --local-steps 20

A small character model learns a repeating text; rank 0 prints the loss at each outer step, then
one JSON line.
"""

import argparse
import json

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from gossamer.integrations import DiLoCo

TEXT = "the quick brown fox jumps over the lazy dog. " * 40


class CharModel(nn.Module):
    def __init__(self, vocab: int, width: int = 32):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.mix = nn.Linear(2 * width, width)
        self.out = nn.Linear(width, vocab)

    def forward(self, pairs):  # the two previous characters → logits of the next
        return self.out(torch.tanh(self.mix(self.embed(pairs).flatten(1))))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--local-steps", type=int, default=20)
    parser.add_argument("--outer-steps", type=int, default=10)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    vocab = sorted(set(TEXT))
    tokens = torch.tensor([vocab.index(c) for c in TEXT])
    torch.manual_seed(0)
    model = CharModel(len(vocab))
    inner = torch.optim.AdamW(model.parameters(), lr=3e-3)
    outer = torch.optim.SGD(model.parameters(), lr=0.7, momentum=0.9, nesterov=True)
    sync = DiLoCo(model, inner, outer, local_steps=args.local_steps)

    generator = torch.Generator().manual_seed(1 + rank)
    losses = []
    for step in range(args.outer_steps * args.local_steps):
        i = torch.randint(2, len(tokens), (64,), generator=generator)
        loss = F.cross_entropy(model(torch.stack([tokens[i - 2], tokens[i - 1]], 1)), tokens[i])
        inner.zero_grad()
        loss.backward()
        inner.step()  # every local_steps-th step: average, outer step, every worker restarts from it
        losses.append(loss.item())
        if rank == 0 and (step + 1) % args.local_steps == 0:
            print(f"outer step {(step + 1) // args.local_steps:3d}  inner loss {loss.item():.4f}", flush=True)

    result = {"first_loss": sum(losses[:10]) / 10, "last_loss": sum(losses[-10:]) / 10,
              "consensus_distance_sq": sync.consensus_distance(), "comm_rounds": sync.comm.rounds}
    sync.close()
    if rank == 0:
        print(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
