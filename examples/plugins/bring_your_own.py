"""The Python API on your own nn.Module and tensors (no registered data set): 16 workers, All-Reduce
against a ring, printing the consensus distance and both accuracies.

    python examples/plugins/bring_your_own.py [--epochs 3]

The data: 2,048 points in 20 dimensions whose class (of 4) is the quadrant of their first two
coordinates, the rest noise — made here, so nothing is downloaded.
"""

import argparse

import torch
from torch import nn

import gossamer


def make_data(samples: int = 2048, dims: int = 20, seed: int = 0) -> gossamer.Data:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, dims, generator=g)
    y = (x[:, 0] > 0).long() * 2 + (x[:, 1] > 0).long()
    cut = samples * 3 // 4
    return gossamer.Data(train=(x[:cut], y[:cut]), test=(x[cut:], y[cut:]))


def model() -> nn.Module:
    return nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 4))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    data = make_data()
    for name, keys in (("All-Reduce", {"algorithm": "allreduce"}), ("ring", {"algorithm": "gossip", "topology": "ring"})):
        result = gossamer.run({**keys, "workers": 16, "epochs": args.epochs, "batch_size": 16, "lr": 0.1}, model=model,
                              data=data)
        s = result.summary
        print(f"{name:<10} test accuracy of x̄ {s['test_accuracy']:.3f}, mean of the local models "
              f"{s['test_accuracy_local_mean']:.3f}, consensus distance Ξ² {s['final_consensus_distance_sq']:.3g}")


if __name__ == "__main__":
    main()
