"""gossamer in other training loops: optimizer step hooks for one model per process
(:mod:`gossamer.integrations.hooks`), :class:`ThreadedSim` to run them in threads of one
process without torch.distributed, and a PyTorch Lightning callback
(:mod:`gossamer.integrations.lightning`, with ``pip install 'gossamer[lightning]'``)."""

from ..engines.threads import ThreadedSim
from .hooks import DiLoCo, Gossip, LocalSGD, Synchronizer

__all__ = ["DiLoCo", "Gossip", "LocalSGD", "Synchronizer", "ThreadedSim"]
