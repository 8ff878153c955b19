"""Row-wise local optimizers: one step for all workers at once on the worker matrix.

Each optimizer keeps its state: ``rows`` are tensors shaped like X (momentum buffers, Adam
moments), row i belonging to worker i and never communicated unless the schedule averages them
(``average_optimizer_state``); Adam's step count is per worker too. A step may take a subset of
the rows (the workers that compute). Both papers keep
the state local: during all-reduce training every worker sees the same averaged gradient, so the
local buffers stay identical and equal one global buffer (the update is linear).
``state_dict()`` / ``load_state_dict()`` save and restore all of it (tensors under ``rows``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from .registry import ConfigError, Registry

OPTIMIZERS = Registry("optimizer", traits={
    "matrices": "True: the builder also gets the hidden weight matrices' slots (as muon), train.py"})


class RowOptimizer:
    """A local optimizer of every worker at once, on the rows of X: what the loop and a schedule step.

    Its state is ``rows`` (tensors shaped like X, one row per worker). ``step(X, G, lr, rows)``
    with ``rows`` (int64 local row indices, on the host; None: all) steps only those workers:
    the others keep their parameters and state (a worker that does not compute this step —
    AD-PSGD's event, a sporadic or gone worker). Each row's update is the same elementwise
    arithmetic whether it steps alone or with the others. A subclass (an ``OPTIMIZERS`` entry's
    builder ``(cfg, X, decay)`` returns one) sets ``rows`` and implements
    ``_update(X, G, lr, state, rows)`` on the rows that step (``state``: their rows of the
    state), ``state_dict()`` and ``load_state_dict(state)`` (tensors under ``rows``).

    Example::

        >>> import numpy as np, torch
        >>> from gossamer.extend import OPTIMIZERS, RowOptimizer
        >>> class SignSGD(RowOptimizer):  # x ← x − η sign(g): no state
        ...     def __init__(self, X):
        ...         self.rows = {}
        ...     def _update(self, X, G, lr, state, rows):
        ...         X.sub_(G.sign(), alpha=lr)
        ...     def state_dict(self):
        ...         return {"rows": {}}
        ...     def load_state_dict(self, state):
        ...         pass
        >>> _ = OPTIMIZERS.register("sign-sgd", help="signSGD on each worker")(lambda cfg, X, decay: SignSGD(X))
        >>> X = torch.zeros(3, 2)
        >>> SignSGD(X).step(X, torch.tensor([[1.0, -2.0]] * 3), lr=0.5, rows=np.array([1]))  # worker 1 alone
        >>> X
        tensor([[ 0.0000,  0.0000],
                [-0.5000,  0.5000],
                [ 0.0000,  0.0000]])
    """

    rows: dict[str, torch.Tensor]

    def step(self, X: torch.Tensor, G: torch.Tensor, lr: float, rows: np.ndarray | None = None) -> None:
        """Update X in place (G is used as scratch)."""
        if rows is None or len(rows) == X.shape[0]:
            self._update(X, G, lr, self.rows, None)
            return
        if len(rows) == 0:
            return
        index = torch.as_tensor(rows, device=X.device)
        state = {name: value.index_select(0, index) for name, value in self.rows.items()}
        x = X.index_select(0, index)
        self._update(x, G.index_select(0, index), lr, state, rows)
        X.index_copy_(0, index, x)
        for name, value in state.items():
            self.rows[name].index_copy_(0, index, value)

    def _update(self, X: torch.Tensor, G: torch.Tensor, lr: float, state: dict[str, torch.Tensor],
                rows: np.ndarray | None) -> None:
        raise NotImplementedError

    def reset_(self, row: int) -> None:
        """Local row ``row`` starts afresh (a worker that rejoins from its neighbours)."""
        for value in self.rows.values():
            value[row] = 0


class SGD(RowOptimizer):
    """SGD with momentum μ, optional Nesterov, and weight decay λ (torch.optim.SGD semantics).

    g ← G + λ·mask ⊙ X;  M ← μ M + g;  X ← X − η (g + μ M if Nesterov else M).
    ``decay`` is the per-coordinate λ·mask [d] (0 where a parameter gets no decay).
    """

    def __init__(self, X: torch.Tensor, momentum: float = 0.0, nesterov: bool = False,
                 decay: torch.Tensor | None = None):
        self.momentum, self.nesterov, self.decay = momentum, nesterov, decay
        self.rows = {"momentum": torch.zeros_like(X)} if momentum else {}

    def _update(self, X, G, lr, state, rows) -> None:
        if self.decay is not None:
            G.addcmul_(X, self.decay)
        if not self.momentum:
            X.add_(G, alpha=-lr)
            return
        M = state["momentum"]
        M.mul_(self.momentum).add_(G)
        if self.nesterov:
            X.add_(G.add_(M, alpha=self.momentum), alpha=-lr)
        else:
            X.add_(M, alpha=-lr)

    def state_dict(self) -> dict:
        return {"rows": dict(self.rows)}

    def load_state_dict(self, state: dict) -> None:
        for name, value in state["rows"].items():
            self.rows[name].copy_(value)


class Adam(RowOptimizer):
    """Adam / AdamW for all workers at once (torch.optim.Adam / AdamW semantics).

    m ← β₁m + (1−β₁)g;  v ← β₂v + (1−β₂)g²;  X ← X − η · (m / (1−β₁ᵗ)) / (√(v / (1−β₂ᵗ)) + ε).
    Adam adds λ·X to g (L2); AdamW decouples it: X ← X − ηλX before the step. The moments are
    per worker (decentralized Adam, Kong et al.), and so is the step count t (``steps``, on the
    host): a worker that does not step keeps its own. Rows that step with the same t share its
    bias corrections (one update for all of them when every worker steps alike).
    """

    def __init__(self, X: torch.Tensor, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 decay: torch.Tensor | None = None, decoupled: bool = False):
        self.betas, self.eps, self.decay, self.decoupled = betas, eps, decay, decoupled
        self.steps = np.zeros(X.shape[0], dtype=np.int64)
        self.rows = {"exp_avg": torch.zeros_like(X), "exp_avg_sq": torch.zeros_like(X)}

    def _update(self, X, G, lr, state, rows) -> None:
        chosen = slice(None) if rows is None else rows
        self.steps[chosen] += 1
        counts = self.steps[chosen]
        if (counts == counts[0]).all():
            self._adam(X, G, lr, state, int(counts[0]))
            return
        for t in np.unique(counts):  # rows with different step counts: one update per count
            index = torch.as_tensor(np.flatnonzero(counts == t), device=X.device)
            part = {name: value.index_select(0, index) for name, value in state.items()}
            x = X.index_select(0, index)
            self._adam(x, G.index_select(0, index), lr, part, int(t))
            X.index_copy_(0, index, x)
            for name, value in part.items():
                state[name].index_copy_(0, index, value)

    def _adam(self, X: torch.Tensor, G: torch.Tensor, lr: float, state: dict[str, torch.Tensor], t: int,
              cols: slice = slice(None)) -> None:
        """Adam's step on the columns ``cols`` of the rows given (every row with step count t)."""
        beta1, beta2 = self.betas
        X, G = X[:, cols], G[:, cols]
        if self.decay is not None:
            if self.decoupled:
                X.addcmul_(X, self.decay[cols], value=-lr)
            else:
                G.addcmul_(X, self.decay[cols])
        m, v = state["exp_avg"][:, cols], state["exp_avg_sq"][:, cols]
        m.lerp_(G, 1 - beta1)
        v.mul_(beta2).addcmul_(G, G, value=1 - beta2)
        denom = (v.sqrt() / math.sqrt(1 - beta2**t)).add_(self.eps)
        X.addcdiv_(m, denom, value=-lr / (1 - beta1**t))

    def state_dict(self) -> dict:
        steps = torch.as_tensor(self.steps, device=self.rows["exp_avg"].device)
        return {"rows": {**self.rows, "steps": steps}}

    def load_state_dict(self, state: dict) -> None:
        rows = dict(state["rows"])
        self.steps[:] = rows.pop("steps").cpu().numpy() if "steps" in rows else state["t"]  # "t": format 2, shared
        for name, value in rows.items():
            self.rows[name].copy_(value)

    def reset_(self, row: int) -> None:
        super().reset_(row)
        self.steps[row] = 0


NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)  # (a, b, c): Muon's quintic Newton–Schulz iteration
NS_EPS = 1e-7
MUON_LR_SCALES = ("original", "match_rms_adamw")


def newton_schulz(M: torch.Tensor, steps: int) -> torch.Tensor:
    """≈ U Vᵀ of each matrix M = U S Vᵀ of the batch [m, A, B], as torch.optim.Muon computes it:
    in bfloat16, the wide orientation, M / max(‖M‖_F, ε), then ``steps`` times
    X ← a X + (b XXᵀ + c (XXᵀ)²) X (bit for bit torch's per-matrix iteration, checked in the tests)."""
    a, b, c = NS_COEFFICIENTS
    X = M.bfloat16()
    tall = M.shape[-2] > M.shape[-1]
    if tall:
        X = X.mT
    X = X / X.norm(dim=(-2, -1), keepdim=True).clamp(min=NS_EPS)
    for _ in range(steps):
        gram = X @ X.mT
        X = torch.baddbmm(X, torch.baddbmm(gram, gram, gram, beta=b, alpha=c), X, beta=a)
    return X.mT if tall else X


class Muon(Adam):
    """Muon on the hidden weight matrices, AdamW on every other parameter (the MuLoCo split;
    torch.optim.Muon and torch.optim.AdamW semantics, per worker).

    On each hidden matrix W (A × B, columns ``matrices``): B ← μB + (1 − μ)g; U = (1 − μ)g + μB
    with Nesterov, else B; O = NS(U) (:func:`newton_schulz`); W ← W(1 − ηλ) − η·s·O, s = √max(1, A/B)
    (``original``, Keller Jordan's) or 0.2·√max(A, B) (``match_rms_adamw``, Moonshot's: the update's
    RMS of AdamW's, so one η serves both). The rest takes AdamW's step with the worker's step count."""

    def __init__(self, X: torch.Tensor, matrices: list, momentum: float, nesterov: bool, ns_steps: int,
                 lr_scale: str, betas: tuple[float, float], eps: float, decay: torch.Tensor | None):
        super().__init__(X, betas, eps, decay, decoupled=True)
        self.momentum, self.nesterov, self.ns_steps = momentum, nesterov, ns_steps
        scale = (lambda A, B: math.sqrt(max(1, A / B))) if lr_scale == "original" else \
            (lambda A, B: 0.2 * math.sqrt(max(A, B)))
        self.matrices = [(slice(s.offset, s.offset + s.numel), tuple(s.shape), scale(*s.shape),
                          0.0 if decay is None else float(decay[s.offset])) for s in matrices]  # (cols, (A, B), s, λ)
        bounds = [0, *(b for cols, *_ in self.matrices for b in (cols.start, cols.stop)), X.shape[1]]
        self.others = [slice(a, b) for a, b in zip(bounds[::2], bounds[1::2]) if b > a]
        self.rows["momentum"] = torch.zeros_like(X)

    def _adam(self, X, G, lr, state, t, cols=slice(None)) -> None:
        for others in self.others:
            super()._adam(X, G, lr, state, t, others)
        for cols, (A, B), scale, decay in self.matrices:
            x, g, buf = X[:, cols], G[:, cols], state["momentum"][:, cols]
            buf.lerp_(g, 1 - self.momentum)
            update = g.lerp(buf, self.momentum) if self.nesterov else buf
            O = newton_schulz(update.reshape(-1, A, B), self.ns_steps).reshape(x.shape).to(x.dtype)
            if decay:
                x.mul_(1 - lr * decay)
            x.add_(O, alpha=-lr * scale)


# ---------------------------------------------------------------- registry: options and builders


@dataclass
class SGDOptions:
    momentum: float = 0.9
    nesterov: bool = True

    def validate(self, cfg) -> None:
        if not 0 <= self.momentum < 1:
            raise ConfigError(f"momentum must be in [0, 1), got {self.momentum}")
        if self.nesterov and self.momentum == 0:
            raise ConfigError("nesterov: true needs momentum > 0")


@dataclass
class AdamOptions:
    adam_betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    adam_eps: float = 1e-8

    def validate(self, cfg) -> None:
        if len(self.adam_betas) != 2 or not all(0 <= b < 1 for b in self.adam_betas):
            raise ConfigError(f"adam_betas must be two numbers in [0, 1), got {self.adam_betas}")
        if not self.adam_eps > 0:
            raise ConfigError(f"adam_eps must be > 0, got {self.adam_eps}")


@OPTIMIZERS.register("sgd", options=SGDOptions, example=("momentum=0.9",), help="SGD with local momentum (Nesterov by default)")
def _sgd(cfg, X: torch.Tensor, decay: torch.Tensor | None) -> SGD:
    return SGD(X, cfg.momentum, cfg.nesterov, decay)


@OPTIMIZERS.register("adam", options=AdamOptions, example=("lr=0.003",), help="Adam with L2 weight decay, local moments")
def _adam(cfg, X: torch.Tensor, decay: torch.Tensor | None) -> Adam:
    return Adam(X, tuple(cfg.adam_betas), cfg.adam_eps, decay)


@OPTIMIZERS.register("adamw", options=AdamOptions, example=("lr=0.003", "weight_decay=0.01"), help="AdamW (decoupled weight decay), local moments")
def _adamw(cfg, X: torch.Tensor, decay: torch.Tensor | None) -> Adam:
    return Adam(X, tuple(cfg.adam_betas), cfg.adam_eps, decay, decoupled=True)


@dataclass
class MuonOptions(AdamOptions):  # adam_betas, adam_eps: the AdamW part's
    muon_momentum: float = 0.95  # μ of the hidden matrices' momentum (torch.optim.Muon's default)
    muon_nesterov: bool = True
    muon_ns_steps: int = 5  # Newton–Schulz iterations
    muon_lr_scale: str = "match_rms_adamw"  # original (√max(1, A/B)) | match_rms_adamw (0.2·√max(A, B): one lr for both)

    def validate(self, cfg) -> None:
        super().validate(cfg)
        if not 0 <= self.muon_momentum < 1:
            raise ConfigError(f"muon_momentum must be in [0, 1), got {self.muon_momentum}")
        if not 1 <= self.muon_ns_steps < 100:
            raise ConfigError(f"muon_ns_steps must be an integer in [1, 100), got {self.muon_ns_steps}")
        if self.muon_lr_scale not in MUON_LR_SCALES:
            raise ConfigError(f"unknown muon_lr_scale '{self.muon_lr_scale}'; choose one of: {', '.join(MUON_LR_SCALES)}")


@OPTIMIZERS.register("muon", options=MuonOptions, example=("lr=0.003", "model=mlp"), matrices=True,
                     help="Muon on the hidden weight matrices, AdamW on the rest (MuLoCo's inner optimizer)")
def _muon(cfg, X: torch.Tensor, decay: torch.Tensor | None, matrices: list) -> Muon:
    if not matrices:
        raise ConfigError(f"optimizer muon: model {cfg.model} has no hidden weight matrix (a 2-D weight that is "
                          f"neither an embedding nor the output layer); use adamw")
    return Muon(X, matrices, cfg.muon_momentum, cfg.muon_nesterov, cfg.muon_ns_steps, cfg.muon_lr_scale,
                tuple(cfg.adam_betas), cfg.adam_eps, decay)


def decay_vector(slots, no_decay: list[bool], weight_decay: float, like: torch.Tensor) -> torch.Tensor | None:
    """λ per coordinate of a row: 0 for parameters flagged no-decay; None when λ = 0."""
    if weight_decay == 0:
        return None
    parts = [torch.full((s.numel,), 0.0 if skip else weight_decay, dtype=like.dtype, device=like.device)
             for s, skip in zip(slots, no_decay)]  # in the run's dtype: λ = 1e-3 stays 1e-3 in float64
    return torch.cat(parts)
