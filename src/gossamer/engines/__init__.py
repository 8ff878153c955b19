"""Engines: where the worker rows live and how the communication primitives reach them.

``sim`` holds all n rows in one process (communication is tensor ops); ``dist`` runs under
torchrun, each of P processes holding n/P rows (:mod:`gossamer.engines.dist`). Both count what a
real network would carry in the same ledger (:mod:`gossamer.engines.ledger`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..registry import ConfigError, Registry, short
from .base import Engine
from .sim import SimEngine

ENGINES = Registry("engine")
DIST_BACKENDS = ("auto", "gloo", "nccl")


@dataclass
class DistOptions:
    dist_backend: str = "auto"  # auto: nccl on CUDA, gloo on CPU
    dist_timeout: float = 60.0  # seconds before a lost peer stops the run

    def validate(self, cfg) -> None:
        if self.dist_backend not in DIST_BACKENDS:
            raise ConfigError(f"unknown dist_backend '{short(self.dist_backend)}'; choose one of: {', '.join(DIST_BACKENDS)}")
        if not (self.dist_timeout > 0 and math.isfinite(self.dist_timeout)):
            raise ConfigError(f"dist_timeout must be a finite number of seconds > 0, got {self.dist_timeout}")
        if self.dist_backend == "nccl" and cfg.device == "cpu":
            raise ConfigError("dist_backend nccl needs device cuda (or auto on a GPU machine); on the CPU use "
                              "dist_backend gloo or auto")


@ENGINES.register("sim", help="all n workers in this process (the simulator)")
def _sim(cfg, device: torch.device) -> Engine:
    return SimEngine(cfg.workers)


@ENGINES.register("dist", options=DistOptions, help="torch.distributed: one of torchrun's P processes, n/P workers each")
def _dist(cfg, device: torch.device) -> Engine:
    from .dist import DistEngine

    return DistEngine(cfg.workers, cfg.dist_backend, cfg.dist_timeout, device, timed=cfg.network is not None)


def build_engine(cfg, device: torch.device) -> Engine:
    return ENGINES[cfg.engine].build(cfg, device)
