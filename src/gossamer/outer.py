"""Outer optimizers: what moves the outer model x_outer along −Δ at an outer step (DiLoCo, its
overlapped and streaming forms, asynchronous local SGD's server), their registry, and the
schedules of their learning rate ε and momentum β.

An outer optimizer steps rows (a row per worker's copy of x_outer; the server's one row) on the
pseudo-gradient Δ at the ε and β the schedule gives that step (:class:`OuterStep`):

- ``nesterov`` (the default): u ← βu + Δ, x ← x − ε(Δ + βu) (PyTorch's ``nesterov=True``);
- ``sgd``: heavy ball, u ← βu + Δ, x ← x − εu (PyTorch's SGD; plain SGD with ``outer_momentum: 0``);
- ``adam``: Adam with β₁ = β, β₂ = 0.999, ε_A = 1e-8 (PyTorch's defaults), bias-corrected per row;
- ``delayed-nesterov``: the Delayed Nesterov update of Liu et al. 2024 (asynchronous local SGD;
  the rule as the HALoS authors transcribe it, utnslab/halos 4b5bf73 ``src/halos/opt.py``, and as
  PanocularAI/torchft 429a9db ``async_diloco.py`` has it at c = 0): for the t-th step, buffer
  size N (``outer_buffer``, default n) and c (``outer_spread``, default 0),
  Δ_buf ← Δ_buf + Δ_t; if t mod N = 0: m ← βm + Δ_buf/N, x ← x − ε((1 − cN + c)βm + Δ_t/N),
  Δ_buf ← 0; else x ← x − ε(cβm + Δ_t/N). N = 1, c = 0 is ``nesterov``.

A plugin registers another (``@OUTER_OPTIMIZERS.register(name, help=...)`` on a builder
``(cfg) -> OuterOptimizer``), e.g. a staleness-aware rule: each step is given the staleness of
its pseudo-gradient.

**Schedules** (:class:`OuterSchedule`): the k-th outer step (from 0) taken at loop step t of T
uses ε_k = ε·w(k, K_ε)·d(t/T) and β_k = β·w(k, K_β)·d_β(t/T), with the linear warm-up
w(k, K) = min(1, (k + 1)/K) over K outer steps (``outer_lr_warmup``, ``outer_momentum_warmup``;
0: none) and the decay d over the run (``outer_lr_decay``, ``outer_momentum_decay``: ``none``,
``linear`` 1 − p or ``cosine`` (1 + cos πp)/2), as Pier (Chen et al. 2025) warms up and decays
the outer momentum. Without a schedule ε_k = ε and β_k = β exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

import torch

from .optim import SGD, Adam
from .registry import ConfigError, Registry, short

OUTER_OPTIMIZERS = Registry("outer_optimizer")
DECAYS = ("none", "linear", "cosine")
ADAM_BETA2, ADAM_EPS = 0.999, 1e-8


class OuterOptimizer(Protocol):
    """The outer step of DiLoCo and asynchronous local SGD: what an ``OUTER_OPTIMIZERS`` builder ``(cfg)`` returns.

    ``start(x_outer)`` once, then ``step(x_outer, pseudo_gradient, lr, momentum, staleness)``
    moves the rows of x_outer (one per worker's copy, or the server's one) along −Δ, in place,
    at this step's learning rate ``lr`` and momentum ``momentum`` (Δ may be used as scratch);
    ``staleness``: the outer steps taken since the model Δ was computed from (a server's τ of
    the push; 1 for DiLoCo's delayed step; else 0), for a staleness-aware rule. Its state is
    ``state_dict()`` / ``load_state_dict(state)`` (tensors under ``rows``).

    Example::

        >>> import torch
        >>> from gossamer.extend import OUTER_OPTIMIZERS, OuterOptimizer
        >>> class Damped:  # plain SGD, a push τ outer steps late damped by 1/(1 + τ)
        ...     def start(self, x_outer): pass
        ...     def step(self, x_outer, pseudo_gradient, lr, momentum, staleness=0):
        ...         x_outer.add_(pseudo_gradient, alpha=-lr / (1 + staleness))
        ...     def state_dict(self): return {}
        ...     def load_state_dict(self, state): pass
        >>> _ = OUTER_OPTIMIZERS.register("damped-sgd", help="SGD, late pushes damped")(lambda cfg: Damped())
        >>> outer: OuterOptimizer = Damped()
        >>> x = torch.ones(1, 2)
        >>> outer.step(x, torch.ones(1, 2), lr=0.5, momentum=0.0, staleness=1)
        >>> x
        tensor([[0.7500, 0.7500]])
    """

    def start(self, x_outer: torch.Tensor) -> None: ...

    def step(self, x_outer: torch.Tensor, pseudo_gradient: torch.Tensor, lr: float, momentum: float,
             staleness: int = 0) -> None: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


@dataclass
class Momentum:
    """``nesterov`` and ``sgd``: :class:`gossamer.optim.SGD` on the rows at the step's β (its buffer
    exists when the configured β is > 0; a schedule's β_k is then > 0 at every step). Δ is used as
    scratch."""

    nesterov: bool
    momentum: float  # the configured β
    sgd: SGD | None = None

    def start(self, x_outer: torch.Tensor) -> None:
        self.sgd = SGD(x_outer, self.momentum, self.nesterov)

    def step(self, x_outer, pseudo_gradient, lr, momentum, staleness=0) -> None:
        if self.momentum:
            self.sgd.momentum = momentum
        self.sgd.step(x_outer, pseudo_gradient, lr)

    def state_dict(self) -> dict:
        return self.sgd.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.sgd.load_state_dict(state)


@dataclass
class OuterAdam:
    """``adam``: :class:`gossamer.optim.Adam` on the rows, β₁ the step's momentum."""

    adam: Adam | None = None

    def start(self, x_outer: torch.Tensor) -> None:
        self.adam = Adam(x_outer, (0.9, ADAM_BETA2), ADAM_EPS)

    def step(self, x_outer, pseudo_gradient, lr, momentum, staleness=0) -> None:
        self.adam.betas = (momentum, ADAM_BETA2)
        self.adam.step(x_outer, pseudo_gradient, lr)

    def state_dict(self) -> dict:
        return self.adam.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.adam.load_state_dict(state)


@dataclass
class DelayedNesterov:
    """``delayed-nesterov`` (module docstring): N, c, and per row m and Δ_buf; ``arrivals`` is t."""

    buffer: int  # N
    spread: float  # c
    arrivals: int = 0
    rows: dict = field(default_factory=dict)

    def start(self, x_outer: torch.Tensor) -> None:
        self.rows = {"momentum": torch.zeros_like(x_outer), "delta": torch.zeros_like(x_outer)}

    def step(self, x_outer, pseudo_gradient, lr, momentum, staleness=0) -> None:
        m, delta, N, c = self.rows["momentum"], self.rows["delta"], self.buffer, self.spread
        delta.add_(pseudo_gradient)
        self.arrivals += 1
        if self.arrivals % N == 0:
            m.mul_(momentum).add_(delta, alpha=1 / N)
            delta.zero_()
            x_outer.add_(pseudo_gradient.div_(N).add_(m, alpha=(1 - c * N + c) * momentum), alpha=-lr)
        else:
            x_outer.add_(pseudo_gradient.div_(N).add_(m, alpha=c * momentum), alpha=-lr)

    def state_dict(self) -> dict:
        return {"rows": dict(self.rows), "arrivals": self.arrivals}

    def load_state_dict(self, state: dict) -> None:
        self.arrivals = int(state["arrivals"])
        for name, value in state["rows"].items():
            self.rows[name].copy_(value)


@OUTER_OPTIMIZERS.register("nesterov", help="SGD with Nesterov momentum outer_momentum (DiLoCo's)")
def _nesterov(cfg) -> Momentum:
    return Momentum(True, cfg.outer_momentum)


@OUTER_OPTIMIZERS.register("sgd", help="SGD with heavy-ball momentum outer_momentum (plain SGD at 0)")
def _sgd(cfg) -> Momentum:
    return Momentum(False, cfg.outer_momentum)


@OUTER_OPTIMIZERS.register("adam", help="Adam, beta1 = outer_momentum, beta2 = 0.999, eps = 1e-8")
def _adam(cfg) -> OuterAdam:
    return OuterAdam()


@OUTER_OPTIMIZERS.register("delayed-nesterov", help="Delayed Nesterov (Liu et al. 2024): momentum every "
                                                     "outer_buffer steps, spread by outer_spread")
def _delayed_nesterov(cfg) -> DelayedNesterov:
    return DelayedNesterov(cfg.outer_buffer or cfg.workers, cfg.outer_spread)


def _factor(k: int, warmup: int, decay: str, progress: float) -> float:
    """w(k, K)·d(p) of the module docstring."""
    ramp = min(1.0, (k + 1) / warmup) if warmup else 1.0
    if decay == "linear":
        return ramp * (1 - progress)
    if decay == "cosine":
        return ramp * (1 + math.cos(math.pi * progress)) / 2
    return ramp


@dataclass(frozen=True)
class OuterSchedule:
    """ε_k and β_k (module docstring); ``total``: the run's steps T (None: no decay allowed)."""

    lr: float
    momentum: float
    lr_warmup: int = 0
    lr_decay: str = "none"
    momentum_warmup: int = 0
    momentum_decay: str = "none"
    total: int | None = None

    def at(self, k: int, t: int) -> tuple[float, float]:
        """(ε_k, β_k) of the k-th outer step, taken at loop step t."""
        progress = t / self.total if self.total else 0.0
        lr, momentum = self.lr, self.momentum
        if self.lr_warmup or self.lr_decay != "none":
            lr *= _factor(k, self.lr_warmup, self.lr_decay, progress)
        if self.momentum_warmup or self.momentum_decay != "none":
            momentum *= _factor(k, self.momentum_warmup, self.momentum_decay, progress)
        return lr, momentum


@dataclass
class OuterStep:
    """An outer optimizer with its schedule: the k-th :meth:`step` at (ε_k, β_k)."""

    optimizer: OuterOptimizer
    schedule: OuterSchedule
    steps: int = 0  # k

    def start(self, x_outer: torch.Tensor) -> None:
        self.optimizer.start(x_outer)

    def step(self, x_outer: torch.Tensor, pseudo_gradient: torch.Tensor, t: int, staleness: int = 0) -> None:
        """One outer step at loop step t (``pseudo_gradient`` is used as scratch)."""
        self.optimizer.step(x_outer, pseudo_gradient, *self.schedule.at(self.steps, t), staleness)
        self.steps += 1

    def state_dict(self) -> dict:
        return {**self.optimizer.state_dict(), "outer_steps": self.steps}

    def load_state_dict(self, state: dict) -> None:
        """The state of :meth:`state_dict` (a checkpoint from before the count was kept: 0, which only
        a schedule reads)."""
        state = dict(state)
        self.steps = int(state.pop("outer_steps", 0))
        self.optimizer.load_state_dict(state)


@dataclass
class OuterOptions:
    """The keys of an algorithm with an outer step (DiLoCo, asynchronous local SGD)."""

    outer_optimizer: str = "nesterov"  # nesterov | sgd | adam | delayed-nesterov | a plugin's
    outer_lr: float = 0.7  # ε (above 1 is legal)
    outer_momentum: float = 0.9  # β: Nesterov's, heavy ball's, Adam's β₁, Delayed Nesterov's
    outer_buffer: int | None = None  # delayed-nesterov: N, its momentum every N outer steps (None: n)
    outer_spread: float = 0.0  # delayed-nesterov: c, the momentum spread over the N steps (0: at the N-th)
    outer_lr_warmup: int = 0  # outer steps of linear warm-up of ε (0: none)
    outer_lr_decay: str = "none"  # none | linear | cosine, of ε over the run
    outer_momentum_warmup: int = 0  # outer steps of linear warm-up of β (0: none)
    outer_momentum_decay: str = "none"  # none | linear | cosine, of β over the run

    def validate(self, cfg) -> None:
        OUTER_OPTIMIZERS[self.outer_optimizer]
        if not (self.outer_lr > 0 and math.isfinite(self.outer_lr)) or not 0 <= self.outer_momentum < 1:
            raise ConfigError(f"{cfg.algorithm} needs outer_lr > 0 and outer_momentum in [0, 1), "
                              f"got {self.outer_lr} and {self.outer_momentum}")
        for key in ("outer_lr_warmup", "outer_momentum_warmup"):
            if getattr(self, key) < 0:
                raise ConfigError(f"{key} must be a number of outer steps >= 0, got {getattr(self, key)}")
        for key in ("outer_lr_decay", "outer_momentum_decay"):
            if getattr(self, key) not in DECAYS:
                raise ConfigError(f"unknown {key} '{short(getattr(self, key))}'; choose one of: {', '.join(DECAYS)}")
        if self.outer_optimizer != "delayed-nesterov":
            for key, default in (("outer_buffer", None), ("outer_spread", 0.0)):
                if getattr(self, key) != default:
                    raise ConfigError(f"{key} applies only with outer_optimizer: delayed-nesterov")
            return
        N = self.outer_buffer or cfg.workers
        if self.outer_buffer is not None and self.outer_buffer < 1:
            raise ConfigError(f"outer_buffer (N) must be a positive integer, got {self.outer_buffer}")
        if not 0 <= self.outer_spread <= (1 / (N - 1) if N > 1 else 0):
            raise ConfigError(f"outer_spread (c) must be in [0, 1/(N-1)] = [0, {1 / (N - 1) if N > 1 else 0:g}] "
                              f"for N = {N}, got {self.outer_spread}")


def outer_schedule(cfg, total: int | None) -> OuterSchedule:
    """The run's :class:`OuterSchedule` (``total``: its steps; None, a user's loop: no decay)."""
    if total is None and (cfg.outer_lr_decay, cfg.outer_momentum_decay) != ("none", "none"):
        raise ConfigError("outer_lr_decay and outer_momentum_decay need the run's length: not in a user's "
                          "training loop")
    return OuterSchedule(cfg.outer_lr, cfg.outer_momentum, cfg.outer_lr_warmup, cfg.outer_lr_decay,
                         cfg.outer_momentum_warmup, cfg.outer_momentum_decay, total)


def build_outer(cfg, total: int | None) -> OuterStep:
    """The outer optimizer ``cfg.outer_optimizer`` with the run's schedule (``total``: its steps)."""
    return OuterStep(OUTER_OPTIMIZERS[cfg.outer_optimizer].build(cfg), outer_schedule(cfg, total))


def nesterov_outer(lr: float, momentum: float) -> OuterStep:
    """DiLoCo's default outer optimizer, Nesterov SGD at a constant ε and β."""
    return OuterStep(Momentum(True, momentum), OuterSchedule(lr, momentum))
