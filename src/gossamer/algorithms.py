"""Communication schedules: which operator runs on which rows after which step.

Every algorithm of both papers is a schedule over the same two hooks of the training loop:
``on_gradients`` (after backward, before the local optimizer step: where mini-batch SGD averages
gradients) and ``after_step`` (after the local step: where models are averaged or gossiped).
``t`` is the 0-based index of the step being taken.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .topology import Topology


@dataclass
class AllReduce:
    """Mini-batch SGD (Lin et al.'s baseline): gradients averaged every step, global batch n·B."""

    def on_gradients(self, engine, G: torch.Tensor, t: int) -> None:
        engine.allreduce_mean_(G)

    def after_step(self, engine, X: torch.Tensor, t: int) -> None:
        pass


@dataclass
class LocalSGD:
    """Local SGD: H local steps, then the exact average x_i ← x̄ (one all-reduce per H steps)."""

    local_steps: int

    def on_gradients(self, engine, G: torch.Tensor, t: int) -> None:
        pass

    def after_step(self, engine, X: torch.Tensor, t: int) -> None:
        if (t + 1) % self.local_steps == 0:
            engine.allreduce_mean_(X)


@dataclass
class Gossip:
    """D-SGD (Kong et al.): local step, then one gossip round, X ← (X − η ∂F(X)) W_t."""

    topology: Topology

    def on_gradients(self, engine, G: torch.Tensor, t: int) -> None:
        pass

    def after_step(self, engine, X: torch.Tensor, t: int) -> None:
        engine.gossip_(X, self.topology.mixing(t))


def build_algorithm(cfg, topology: Topology):
    """The schedule named by ``cfg.algorithm``."""
    builders = {
        "allreduce": lambda: AllReduce(),
        "local": lambda: LocalSGD(cfg.local_steps),
        "gossip": lambda: Gossip(topology),
    }
    return builders[cfg.algorithm]()
