"""PyTorch Lightning + gossamer: local SGD inside Trainer.fit, Ξ² in Lightning's logger.

    pip install 'gossamer[lightning]'
    python examples/lightning_local_sgd.py --devices 2 --out runs/lightning

Lightning starts the processes (strategy="ddp" on CPU); the callback makes DDP skip its gradient
all-reduce between the averages. Rank 0 prints the path of the CSV log (one row per step with
consensus_distance_sq, comm_rounds, bytes_per_worker, ...), then one JSON line.
"""

import argparse
import json

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from lightning.pytorch.loggers import CSVLogger
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from gossamer.integrations import LocalSGD
from gossamer.integrations.lightning import Synchronize


class Classifier(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 3))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self.body(x), y)
        self.log("loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--local-steps", type=int, default=4)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--out", default="runs/lightning")
    args = parser.parse_args()

    pl.seed_everything(0)  # the same data set and initial model in every process
    centres = torch.randn(3, 10) * 2
    y = torch.randint(0, 3, (4096,))
    data = DataLoader(TensorDataset(centres[y] + torch.randn(4096, 10), y), batch_size=32, shuffle=True)
    synchronize = Synchronize(lambda model, optimizer: LocalSGD(model, optimizer, local_steps=args.local_steps),
                              log_every_n_steps=1)
    trainer = pl.Trainer(accelerator="cpu", devices=args.devices, strategy="ddp", max_steps=args.steps,
                         logger=CSVLogger(args.out, name="", version=""), log_every_n_steps=1,
                         callbacks=[synchronize], enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    trainer.fit(Classifier(), data)
    if trainer.is_global_zero:
        print(json.dumps({"metrics": f"{trainer.logger.log_dir}/metrics.csv", "steps": trainer.global_step,
                          "comm_rounds": synchronize.sync.comm.rounds}))


if __name__ == "__main__":
    main()
