"""gossamer in other training loops: optimizer step hooks for one model per process
(:mod:`gossamer.integrations.hooks`) and a PyTorch Lightning callback
(:mod:`gossamer.integrations.lightning`, with ``pip install 'gossamer[lightning]'``)."""

from .hooks import DiLoCo, Gossip, LocalSGD, Synchronizer

__all__ = ["DiLoCo", "Gossip", "LocalSGD", "Synchronizer"]
