"""Decentralized averaging for an existing PyTorch training loop (one worker per process).

The library form of gossamer's schedules, in the spirit of PyTorch's ``PeriodicModelAverager``
and BlueFog: keep your model, optimizer and data loader; under ``torchrun`` add two calls::

    averager = Averager(model, algorithm="gossip", topology="ring")
    for x, y in loader:
        loss = loss_fn(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        averager.average_gradients()   # allreduce averages gradients, gradient-tracking swaps in its tracker
        optimizer.step()
        averager.step()                # local: exact average every H steps; gossip: one round
    print(averager.consensus_distance())   # Ξ², the same on every rank

Process r is worker r (n = WORLD_SIZE). The schedules and operators are the trainer's own
(:mod:`gossamer.algorithms` over :class:`~gossamer.engines.dist.DistEngine`), so the same
algorithm, topology and seed communicate exactly as ``gossamer train --set engine=dist`` does.
Every method communicates, so every rank must call it, at the same step.
"""

from __future__ import annotations

import torch
from torch import nn

from .algorithms import Context, Step, build_schedule
from .config import from_dict
from .engines.dist import DistEngine, env_world_size


class Averager:
    """Average (or gossip) a model's parameters across processes after each optimizer step.

    ``algorithm``: ``allreduce`` (gradients averaged every step: mini-batch SGD; call
    :meth:`average_gradients` between ``backward()`` and ``optimizer.step()``), ``local`` (exact
    parameter average every ``local_steps`` steps), ``gossip`` (one round over ``topology`` after
    every step), ``choco``, ``sgp``, ``gradient-tracking``, or another schedule of
    :mod:`gossamer.algorithms` (call both hooks every step whatever the algorithm). ``options`` are that
    algorithm's config keys (``local_steps=4``, ``topology="ring"``, ``block_size=2`` for
    ``hierarchical``, ``compression="ef-sign"``).
    At construction every process takes rank 0's parameters (all workers start from one model).
    Joins the default process group, or creates one from torchrun's environment.
    """

    def __init__(self, model: nn.Module, algorithm: str = "gossip", *, timeout: float = 60.0,
                 backend: str = "auto", **options):
        self.params = [p for p in model.parameters() if p.requires_grad]
        if not self.params:
            raise ValueError("the model has no trainable parameters to average")
        if "switch_epoch" in options:
            raise ValueError("the averager counts steps, not epochs: give post-local's switch as switch_step")
        if algorithm == "post-local":
            options.setdefault("switch_step", 0)
        n = env_world_size()
        self.cfg = from_dict({"workers": n, "algorithm": algorithm, "engine": "dist", "dist_timeout": timeout,
                              "dist_backend": backend, **options})
        self.engine = DistEngine(n, backend, timeout, self.params[0].device)
        self.numels = [p.numel() for p in self.params]
        self.X = self._flat([p.detach() for p in self.params])
        self.engine.broadcast_(self.X, src=0)
        self._write(self.X)
        self.schedule = build_schedule(self.cfg, Context(self.X, self.numels, [], steps_per_epoch=1))
        self.schedule.start(self.engine, self.X)
        self.t = 0

    def average_gradients(self) -> None:
        """The schedule's gradient hook (between ``backward()`` and ``optimizer.step()``)."""
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        G = self._flat(grads)
        self.X.copy_(self._flat([p.detach() for p in self.params]))
        self.schedule.on_gradients(self.engine, self.X, G, Step(self.t))
        for p, g in zip(self.params, G[0].split(self.numels)):
            if p.grad is not None:
                p.grad.copy_(g.view_as(p))

    def step(self) -> None:
        """The schedule's model hook (after ``optimizer.step()``): average or gossip the parameters."""
        self.X.copy_(self._flat([p.detach() for p in self.params]))
        self.schedule.after_step(self.engine, self.X, Step(self.t))
        self._write(self.X)
        self.t += 1

    def consensus_distance(self) -> float:
        """Ξ² = (1/n) Σ_i ‖x_i − x̄‖² over the current parameters of all processes (a collective)."""
        return self.engine.consensus_distance_sq(self._flat([p.detach() for p in self.params]))

    def average_parameters_(self) -> None:
        """Every process's model ← x̄ (e.g. before evaluating or saving the consensus model)."""
        self.X.copy_(self._flat([p.detach() for p in self.params]))
        self.engine.allreduce_mean_(self.X)
        self._write(self.X)

    @property
    def comm(self):
        """Communication so far, per worker (:class:`~gossamer.engines.comm.CommStats`)."""
        return self.engine.comm

    def close(self) -> None:
        """Stop the heartbeat (and destroy the process group if the averager created it)."""
        self.engine.close()

    def _flat(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat([t.reshape(-1) for t in tensors]).unsqueeze(0)

    @torch.no_grad()
    def _write(self, X: torch.Tensor) -> None:
        for p, x in zip(self.params, X[0].split(self.numels)):
            p.copy_(x.view_as(p))
