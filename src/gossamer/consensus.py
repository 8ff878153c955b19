"""Consensus distance: targets and the controller that keeps Ξ under them (Kong et al. 2021).

Ξ_t² = (1/n) Σ_i ‖x̄ − x_i‖² is measured by the engine. The controller runs extra gossip rounds
X ← W X after the step's normal gossip until Ξ_t ≤ target_t, at most ``max_extra_rounds``; when
the budget runs out it either falls back to an exact all-reduce (Ξ = 0) or continues training.

The paper's target is "c × φ_t^ema", which reads two ways; both are here:
- ``run:DIR``: c × the consensus distance that *uncontrolled* D-SGD had at the same step of an
  earlier run (its metrics.jsonl), smoothed by an EMA — a reference recorded beforehand;
- ``gradient``: c × η_t · sqrt(EMA of φ_t²) / p, with φ_t² = (1/n) Σ_i ‖∇f_i(x_i)‖² — the typical
  distance Ξ² = O((1 − p) η² (φ² + σ²) / p²) scaled to a distance, computable on the fly.
``constant`` keeps Ξ ≤ a fixed value.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import yaml

from .config import ConfigError


@dataclass
class Step:
    """What the schedule knows about the step being taken: index t, η_t, φ_t² and its EMA."""

    t: int
    lr: float = 0.0
    grad_norm_sq: float = 0.0
    grad_norm_sq_ema: float = 0.0


def ema(values: list[float], beta: float) -> list[float]:
    """Exponential moving average s_t = β s_{t−1} + (1 − β) v_t, started at s_0 = v_0."""
    out, s = [], None
    for v in values:
        s = v if s is None else beta * s + (1 - beta) * v
        out.append(s)
    return out


def reference_trajectory(run_dir: str, steps: int, cfg) -> list[float]:
    """Ξ_t (not squared) of an earlier run, by step 1..steps, EMA-smoothed with ``cfg.consensus.ema``.

    The earlier run must have the same workers, batch size and data size (so step t means the
    same point of training) and at least ``steps`` steps."""
    path = Path(run_dir)
    metrics = path / "metrics.jsonl"
    if not metrics.exists():
        raise ConfigError(f"consensus.target run:{run_dir}: no metrics.jsonl there (not a gossamer run)")
    ref_cfg = yaml.safe_load((path / "config.yaml").read_text()) if (path / "config.yaml").exists() else {}
    for key in ("workers", "batch_size", "num_samples"):
        if key in ref_cfg and ref_cfg[key] != getattr(cfg, key):
            raise ConfigError(f"consensus.target run:{run_dir} is incompatible: it has {key} = {ref_cfg[key]}, "
                              f"this run {getattr(cfg, key)}")
    by_step = {}
    for line in metrics.read_text().splitlines():
        row = json.loads(line)
        by_step[row["step"]] = row["consensus_distance_sq"]
    if any(s not in by_step for s in range(1, steps + 1)):
        raise ConfigError(f"consensus.target run:{run_dir} has {len(by_step)} steps; this run needs {steps}")
    return ema([math.sqrt(max(by_step[s], 0.0)) for s in range(1, steps + 1)], cfg.consensus.ema)


def build_target(cfg, p: float, steps: int) -> Callable[[Step], float]:
    """Target Ξ for a step, from ``cfg.consensus``."""
    c = cfg.consensus
    if c.target == "constant":
        return lambda step: c.value
    if c.target == "gradient":
        return lambda step: c.factor * step.lr * math.sqrt(step.grad_norm_sq_ema) / p
    trajectory = reference_trajectory(c.target.removeprefix("run:"), steps, cfg)
    return lambda step: c.factor * trajectory[step.t]


@dataclass
class Controller:
    """Extra gossip rounds until Ξ ≤ target; then an all-reduce or nothing when the budget is spent."""

    target: Callable[[Step], float]
    max_extra_rounds: int
    on_budget: str  # allreduce | continue

    def control(self, engine, X: torch.Tensor, step: Step, gossip_round: Callable[[], None]) -> dict:
        """Run after the step's normal gossip; returns this step's control metrics."""
        target = self.target(step)
        before = engine.consensus_distance_sq(X)
        xi_sq, rounds = before, 0
        while math.sqrt(xi_sq) > target and rounds < self.max_extra_rounds:
            gossip_round()
            rounds += 1
            xi_sq = engine.consensus_distance_sq(X)
        fallback = math.sqrt(xi_sq) > target and self.on_budget == "allreduce"
        if fallback:
            engine.allreduce_mean_(X)
        return {"consensus_target": target, "consensus_distance_sq_before_control": before,
                "extra_gossip_rounds": rounds, "control_allreduce": fallback}
