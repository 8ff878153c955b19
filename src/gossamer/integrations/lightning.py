"""PyTorch Lightning: any synchroniser of :mod:`gossamer.integrations.hooks` inside ``Trainer.fit``.

    pip install 'gossamer[lightning]'

    from gossamer.integrations import LocalSGD
    from gossamer.integrations.lightning import Synchronize

    trainer = Trainer(accelerator="cpu", devices=4, strategy="ddp",
                      callbacks=[Synchronize(lambda model, optimizer: LocalSGD(model, optimizer, local_steps=8))])

At the start of fit the callback builds the synchroniser on the strategy's model (the DDP wrapper:
DDP then all-reduces gradients only where the schedule averages them) and the trainer's
optimizer; Lightning's closure-style ``optimizer.step`` is handled by the step hooks (the gradient
stage runs after the closure's backward). Every ``log_every_n_steps`` steps it logs Ξ², its cheap
bound, the schedule's metrics and the communication counts to the trainer's logger; its
``state_dict`` (in Lightning's checkpoints) is rank 0's synchroniser state.
"""

from __future__ import annotations

from typing import Callable

from torch import nn
from torch.optim import Optimizer

from ..registry import ConfigError
from .hooks import Synchronizer

try:
    from lightning.pytorch import Callback
except ImportError:  # pragma: no cover - exercised by the missing-dependency test
    raise ConfigError("gossamer.integrations.lightning needs PyTorch Lightning: pip install 'gossamer[lightning]'") \
        from None


class Synchronize(Callback):
    """Apply ``make(model, optimizer)`` — a LocalSGD, Gossip or DiLoCo — to the trainer's model and
    its one optimizer, and log its metrics every ``log_every_n_steps`` (default: the trainer's)."""

    def __init__(self, make: Callable[[nn.Module, Optimizer], Synchronizer], log_every_n_steps: int | None = None):
        self.make = make
        self.log_every_n_steps = log_every_n_steps
        self.sync: Synchronizer | None = None
        self._loaded: dict | None = None

    def on_fit_start(self, trainer, pl_module) -> None:
        if len(trainer.optimizers) != 1:
            raise ConfigError(f"Synchronize needs exactly one optimizer, the trainer has {len(trainer.optimizers)}")
        self.sync = self.make(trainer.strategy.model, trainer.optimizers[0])
        if self._loaded is not None:
            self.sync.load_state_dict(self._loaded)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        every = self.log_every_n_steps or trainer.log_every_n_steps
        if self.sync is not None and self.sync.t % every == 0:  # the same step on every rank: a collective
            pl_module.log_dict(self.sync.metrics(), on_step=True, on_epoch=False)

    def on_fit_end(self, trainer, pl_module) -> None:
        if self.sync is not None:
            self.sync.close()

    def state_dict(self) -> dict:
        return self.sync.state_dict() if self.sync is not None else {}

    def load_state_dict(self, state_dict: dict) -> None:
        self._loaded = state_dict or None
