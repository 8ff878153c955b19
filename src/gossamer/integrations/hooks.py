"""Local SGD, gossip and DiLoCo for a training loop with one model per process (torchrun, DDP).

Construct one after the model and its optimizer; it registers step hooks on the optimizer, so
``optimizer.step()`` communicates by itself and the loop stays as it was::

    model = Net()                                    # the same initialisation on every rank
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sync = LocalSGD(model, optimizer, local_steps=4)  # or Gossip(...), DiLoCo(...)
    for x, y in loader:
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()                             # + gradient mean before, model sync after

Process r is worker r of the n processes of ``group`` (default: all). The schedules are the
simulator's own (:mod:`gossamer.algorithms`) over an engine holding one row (``engine``: by
default a :class:`~gossamer.engines.dist.DistEngine` on ``group``; a
:class:`~gossamer.engines.threads.ThreadedSim`'s runs n models in n threads of one process): the model's parameters are re-pointed at views into one flat row X [1, d] (and
their gradients, when a schedule averages them, into G), so averaging, gossip and the outer step
are row operations on X with no copy per step. The same options, seed and data order give the
parameters that ``gossamer train --set engine=sim`` gives (tests/test_integrations.py, float64).

Before the optimizer step the schedule's gradient hook runs (an all-reduce of the gradients while
a schedule is in a mini-batch phase: before post-local's switch, in a gossip ``allreduce``
phase); with a ``DistributedDataParallel`` model over the same processes, DDP does that
all-reduce during backward through a comm hook registered here, and skips it in the local
phases. After the step the schedule's model hook runs (average every H steps, a gossip round,
DiLoCo's outer step). The keyword options are the config keys of ``gossamer train`` and are
checked the same way (one-line :class:`~gossamer.registry.ConfigError`); phases are in steps.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ..algorithms import ALGORITHMS, Context, begin_step, build_schedule
from ..algorithms.gossip import gossip_state, local_estimate
from ..config import from_dict
from ..engines.base import Engine
from ..engines.dist import DistEngine, env_world_size
from ..engines.ledger import Ledger
from ..engines.works import release_works, retain
from ..registry import ConfigError
from ..workers import bind_row, float_buffers, layout

BUFFER_POLICIES = ("local", "average")


class Synchronizer:
    """A schedule of :mod:`gossamer.algorithms` run by optimizer step hooks, one worker per process.

    The base of :class:`LocalSGD`, :class:`Gossip` and :class:`DiLoCo`, which name its
    ``algorithm`` and its options. Every method that communicates is a collective: call it on
    every rank, at the same step.

    Args:
        model (nn.Module): the model (or its ``DistributedDataParallel``), initialised alike on every rank.
        optimizer (torch.optim.Optimizer): its optimizer; the hooks are registered on it.
        options (dict): the algorithm's keys, as ``gossamer train`` takes them.
        buffers (str): ``local`` (floating buffers such as BatchNorm statistics stay each
            worker's own, as in the papers) or ``average`` (averaged — or gossiped — whenever the
            parameters are).
        group (ProcessGroup | None): the processes that are the workers (None: all).
        dist_backend (str): ``auto``, ``gloo`` or ``nccl``, of the engine made here.
        dist_timeout (float): seconds before a lost peer stops the run.
        reference (list[float] | None): Ξ_t² by step, for a ``run:DIR`` consensus target.
        engine (Engine | None): an engine holding this worker's row (None: a ``DistEngine`` on
            ``group``, made here and closed by :meth:`close`; one passed in belongs to the caller).

    Example::

        >>> import torch
        >>> from gossamer.integrations import ThreadedSim
        >>> from gossamer.integrations import LocalSGD, Synchronizer
        >>> model = torch.nn.Linear(4, 2)
        >>> sync: Synchronizer = LocalSGD(model, torch.optim.SGD(model.parameters(), lr=0.1), local_steps=2,
        ...                               engine=ThreadedSim(1).engine(0))  # one worker, this thread
        >>> state = sync.state_dict()  # beside the model's and the optimizer's, in a checkpoint
        >>> sync.load_state_dict(state)
        >>> state["algorithm"], state["step"], sync.consensus_distance()
        ('local', 0, 0.0)
        >>> sync.close()
    """

    algorithm = ""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, options: dict, *,
                 buffers: str = "local", group=None, dist_backend: str = "auto", dist_timeout: float = 60.0,
                 reference: list[float] | None = None, engine: Engine | None = None):
        if buffers not in BUFFER_POLICIES:
            raise ConfigError(f"unknown buffers '{str(buffers)[:100]}'; choose one of: {', '.join(BUFFER_POLICIES)}")
        ddp = model if isinstance(model, DistributedDataParallel) else None
        module = ddp.module if ddp is not None else model
        named = list(module.named_parameters())
        if not named:
            raise ConfigError("the model has no parameters to synchronise")
        kinds = {(p.dtype, p.device) for _, p in named}
        if len(kinds) > 1:
            raise ConfigError(f"all parameters must share one dtype and device, got {sorted(map(str, kinds))}")
        if isinstance(engine, str):
            raise ConfigError(f"engine must be an Engine holding this worker's row (or None: torch.distributed), "
                              f"got the string '{engine[:100]}'; the simulator runs these algorithms as gossamer "
                              f"train --set engine=sim")
        if engine is not None and engine.m != 1:
            raise ConfigError(f"engine must hold one worker's row (one model per worker), got {engine.m} rows")
        # the schedules whose step is the user's optimizer step with communication around it declare their hook
        hooked = [e.name for e in ALGORITHMS.entries.values() if "hook" in e.traits]
        if self.algorithm not in hooked:  # a subclass naming another schedule would train plain local SGD
            raise ConfigError(f"the step hooks run the algorithms {', '.join(hooked)}, not '{str(self.algorithm)[:100]}' "
                              f"(its step is not the optimizer's step plus communication): use gossamer train")
        n = engine.n if engine is not None else env_world_size(group)
        self.cfg = from_dict({"workers": n, "algorithm": self.algorithm, "engine": "dist",
                              "dist_backend": dist_backend, "dist_timeout": dist_timeout, **options})
        self.optimizer = optimizer
        self.slots, self.d = layout(named)
        self.module = module
        self.X = torch.cat([p.detach().reshape(-1) for _, p in named]).unsqueeze(0)
        self.G = torch.zeros_like(self.X)
        bind_row(module, self.slots, self.X[0])
        self.B = None
        buffer_rows = []
        if buffers == "average":
            named_buffers = float_buffers(module)
            if named_buffers and ddp is not None and ddp.broadcast_buffers:
                raise ConfigError("buffers='average' with a DDP model that broadcasts rank 0's buffers every "
                                  "forward: construct DistributedDataParallel(..., broadcast_buffers=False)")
            self.buffer_slots, _ = layout(named_buffers)
            self.B = torch.cat([b.detach().reshape(-1) for _, b in named_buffers] or
                               [self.X.new_zeros(0)]).unsqueeze(0)
            bind_row(module, self.buffer_slots, self.B[0], parameter=False)
            buffer_rows = [self.B]
        self.optimizer_rows: dict[str, torch.Tensor] = {}  # per-parameter optimizer state as rows, once it exists
        self._optimizer_row_list: list[torch.Tensor] = []  # the schedule's optimizer_rows, filled at step 1
        context = Context(self.X, [s.numel for s in self.slots], self._optimizer_row_list, steps_per_epoch=1,
                          reference=reference, buffer_rows=buffer_rows, shapes=[tuple(s.shape) for s in self.slots],
                          **self._context())
        self.schedule = build_schedule(self.cfg, context)  # every local check before the first collective
        self._owns_engine = engine is None
        self.engine = engine or DistEngine(n, dist_backend, dist_timeout, named[0][1].device, group=group)
        try:
            self._check_identical()
        except BaseException:
            self._close_engine()
            raise
        self.schedule.start(self.engine, self.X)
        self.anchor = self.X.clone()  # the model at the last step that ended with a global average
        self.synced = True  # whether the last step ended with a global average (anchor == X)
        self.t = 0  # steps taken
        self.grad_norm_sq_ema: float | None = None
        self.last_metrics: dict = {}  # what the schedule reported for the last step
        self._step = None
        self._ddp_averages = ddp is not None and _same_ranks(ddp.process_group, group)
        if self._ddp_averages:
            ddp.register_comm_hook(None, self._ddp_comm_hook)
        self._hooks = [optimizer.register_step_pre_hook(self._before_step),
                       optimizer.register_step_post_hook(self._after_step)]

    def _context(self) -> dict:
        """What this synchroniser adds to the schedule's :class:`~gossamer.algorithms.Context`."""
        return {}

    def _ended_synced(self) -> bool:
        """Whether the step just taken ended with every model x̄: it averaged the gradients or the models globally."""
        return self.engine.comm.rounds_by_level["global"] > self._global_rounds

    # ------------------------------------------------------------------ the step hooks

    def _before_step(self, optimizer, args, kwargs):
        """The step pre-hook: the gradient stage now, or — when the step gets a closure that computes
        the gradients (PyTorch Lightning, LBFGS) — right after that closure. The last step's finished
        collectives are freed first (a local step calls no collective that would free them)."""
        release_works()
        closure = kwargs.get("closure", args[1] if len(args) > 1 else None)  # args: (optimizer, closure?)
        if closure is None:
            self._gradient_stage(optimizer)
            return None

        def closure_then_gradient_stage():
            loss = closure()
            self._gradient_stage(optimizer)
            return loss
        if "closure" in kwargs:
            return args, {**kwargs, "closure": closure_then_gradient_stage}
        return (args[0], closure_then_gradient_stage, *args[2:]), kwargs

    def _gradient_stage(self, optimizer) -> None:
        """The loop's gradient stage (:func:`~gossamer.algorithms.begin_step`: φ² when the schedule
        tracks it, then its gradient hook — or DDP's all-reduce standing in for it) for the step
        about to be taken."""
        self._global_rounds = self.engine.comm.rounds_by_level["global"]
        lr = float(optimizer.param_groups[0]["lr"])
        averages = self.schedule.averages_gradients(self.t)
        ddp_averaged = averages and self._ddp_averages
        if self.schedule.tracks_grad_norm or (averages and not ddp_averaged):
            self._bind_gradients()
        self._step, self.grad_norm_sq_ema = begin_step(self.schedule, self.engine, self.X, self.G, self.t, lr,
                                                       self.grad_norm_sq_ema, measure=False, average=not ddp_averaged)
        if ddp_averaged:  # DDP's comm hook averaged the gradients during backward
            self.engine.recorded_allreduce(self.d, self.G.element_size())

    def _after_step(self, optimizer, args, kwargs) -> None:
        self._bind_optimizer_state()
        metrics = self.schedule.after_step(self.engine, self.X, self._step)
        self.synced = self._ended_synced()
        if self.synced:
            self.anchor.copy_(self.X)
        self.last_metrics = metrics
        self.t += 1

    def _ddp_comm_hook(self, state, bucket):
        """DDP's gradient all-reduce where the schedule averages gradients; the local gradients elsewhere."""
        buffer = bucket.buffer()
        if not self.schedule.averages_gradients(self.t):
            future = torch.futures.Future()
            future.set_result(buffer)
            return future
        buffer.div_(self.engine.world)
        work = dist.all_reduce(buffer, group=self.engine.group, async_op=True)
        retain(work)
        return work.get_future().then(lambda f: f.value()[0])

    def _bind_gradients(self) -> None:
        """Make every ``.grad`` a view into G (copying gradients that autograd put elsewhere, e.g.
        after ``zero_grad(set_to_none=True)``; a parameter without a gradient gets zeros)."""
        for s in self.slots:
            p = self.module.get_parameter(s.name)
            view = self.G[0, s.offset : s.offset + s.numel].view(s.shape)
            if p.grad is None:
                view.zero_()
            elif p.grad.data_ptr() != view.data_ptr():
                view.copy_(p.grad)
            p.grad = view

    def _bind_optimizer_state(self) -> None:
        """The optimizer's per-parameter state tensors (momentum, moments) as views into one row per
        state name, so that a schedule can average them (entering an all-reduce phase). torch
        optimizers create their state at their first step and update it in place after that."""
        for s in self.slots:
            state = self.optimizer.state.get(self.module.get_parameter(s.name), {})
            for name, value in state.items():
                if not (torch.is_tensor(value) and value.is_floating_point() and value.shape == s.shape):
                    continue
                if name not in self.optimizer_rows:
                    self.optimizer_rows[name] = torch.zeros_like(self.X)
                    self._optimizer_row_list.append(self.optimizer_rows[name])
                view = self.optimizer_rows[name][0, s.offset : s.offset + s.numel].view(s.shape)
                if value.data_ptr() != view.data_ptr():
                    view.copy_(value)
                    state[name] = view

    # ------------------------------------------------------------------ metrics

    def consensus_distance(self, exact: bool = True) -> float:
        """Ξ² = (1/n) Σ_i ‖x_i − x̄‖² now (``exact``: an all-reduce of d values), or a cheap upper
        bound on it from one scalar per worker (:meth:`_estimate`)."""
        return self.engine.consensus_distance_sq(self.X) if exact else self._estimate()

    def _estimate(self) -> float:
        """(1/n) Σ_i ‖x_i − c‖² = Ξ² + ‖x̄ − c‖² ≥ Ξ², c the model at the last step that ended with
        an exact global average (the start, a sync, an outer step): the same c on every worker."""
        return self.engine.mean_scalar((self.X - self.anchor).square().sum(1))

    @property
    def extra_gossip_rounds(self) -> int:
        """Gossip rounds that consensus control added so far (0 for other algorithms)."""
        return self.schedule.counters().get("extra_gossip_rounds", 0)

    @property
    def comm(self) -> Ledger:
        """The algorithm's communication so far, per worker, counted as in ``summary.json``."""
        return self.engine.comm

    def metrics(self) -> dict[str, float]:
        """Ξ², its cheap bound, the last step's schedule metrics and the communication counts (a collective)."""
        row = {"consensus_distance_sq": self.consensus_distance(),
               "consensus_distance_sq_bound": self.consensus_distance(exact=False),
               **{k: float(v) for k, v in self.last_metrics.items() if isinstance(v, (int, float)) and v is not None},
               "comm_rounds": self.comm.rounds, "bytes_per_worker": self.comm.bytes_per_worker}
        if self.grad_norm_sq_ema is not None:
            row.update(grad_norm_sq=self._step.grad_norm_sq, grad_norm_sq_ema=self.grad_norm_sq_ema)
        return row

    # ------------------------------------------------------------------ checkpoints and life cycle

    def state_dict(self) -> dict:
        """Everything this synchroniser carries (this rank's: models differ between syncs, so
        every rank saves its own, with its model's and optimizer's ``state_dict``)."""
        return {"algorithm": self.algorithm, "workers": self.engine.n, "config": self._options(), "step": self.t,
                "schedule": self.schedule.state_dict(), "comm": self.comm.state_dict(), "anchor": self.anchor,
                "grad_norm_sq_ema": self.grad_norm_sq_ema}

    def load_state_dict(self, state: dict) -> None:
        """Continue from :meth:`state_dict` (step counter included), after loading the model's and
        the optimizer's own state."""
        if not isinstance(state, dict) or "config" not in state:
            raise ConfigError("load_state_dict needs a state_dict() of a gossamer synchroniser")
        saved, mine = state["config"], self._options()
        changed = sorted(k for k in saved.keys() | mine.keys() if saved.get(k) != mine.get(k))
        if changed:
            shown = ", ".join(f"{k} ({str(saved.get(k))[:40]} → {str(mine.get(k))[:40]})" for k in changed[:5])
            raise ConfigError(f"this state_dict is of another configuration: {shown}")
        self.t = int(state["step"])
        self.schedule.load_state_dict(state["schedule"])
        self.comm.load_state_dict(state["comm"])
        self.anchor.copy_(state["anchor"])
        self.grad_norm_sq_ema = state["grad_norm_sq_ema"]

    def _options(self) -> dict:
        """The configuration a state belongs to: every key but those that do not change training."""
        return {k: v for k, v in self.cfg.to_dict().items() if k not in ("dist_backend", "dist_timeout")}

    def average_parameters_(self) -> None:
        """Every worker's model ← x̄ now (e.g. before evaluating or saving the consensus model)."""
        self.engine.allreduce_mean_(self.X)
        self.anchor.copy_(self.X)
        self.synced = True

    def close(self) -> None:
        """Remove the optimizer hooks; stop the engine (and the process group if it created one)."""
        for handle in self._hooks:
            handle.remove()
        self._close_engine()

    def _close_engine(self) -> None:
        if self._owns_engine:
            self.engine.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _check_identical(self) -> None:
        """One clear error, on every rank, if the models differ at the start."""
        first = self.X.clone()
        self.engine.broadcast_(first, src=0)
        if self.engine.mean_scalar((first != self.X).any(1).to(self.X.dtype)) > 0:
            raise ConfigError("the model's parameters differ across ranks at the start: initialise them alike on "
                              "every rank (the same torch.manual_seed before building the model, or one checkpoint)")
        self.engine.comm = Ledger(self.engine.n)  # the check is set-up, not training traffic


def _same_ranks(a, b) -> bool:
    """Whether two process groups (None: the default one) hold the same ranks."""
    def ranks(g):
        return dist.get_process_group_ranks(g if g is not None else dist.group.WORLD)
    return ranks(a) == ranks(b)


class LocalSGD(Synchronizer):
    """Local SGD (Lin et al.): H local steps, then the exact average of the models.

    ``switch_step`` t′: post-local SGD — gradients averaged every step before t′ (mini-batch SGD,
    what DDP does), local SGD from t′ on. ``block_size``/``block_rounds``: hierarchical local SGD
    — every H steps the average inside blocks of ``block_size`` consecutive ranks (a node), every
    ``block_rounds``-th time the global one. ``compression``: any codec (``sign``, ``ef-top-k:0.01``, ...).

    Args:
        model (nn.Module): the model, initialised alike on every rank.
        optimizer (torch.optim.Optimizer): its optimizer.
        local_steps (int): H.
        switch_step (int | None): t′ of post-local SGD (None: local SGD from the start).
        block_size (int | None): hierarchical local SGD's block of consecutive ranks.
        block_rounds (int): its averages in blocks per global one.
        compression (str): the codec of the averages (``none``).
        **kwargs: :class:`Synchronizer`'s (``buffers``, ``group``, ``engine``, ...).

    Example::

        >>> import torch
        >>> from gossamer.integrations import ThreadedSim
        >>> from gossamer.integrations import LocalSGD
        >>> model = torch.nn.Linear(4, 2)
        >>> optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        >>> sync = LocalSGD(model, optimizer, local_steps=2, engine=ThreadedSim(1).engine(0))  # torchrun: no engine
        >>> for x in torch.randn(4, 8, 4):
        ...     optimizer.zero_grad()
        ...     model(x).square().mean().backward()
        ...     optimizer.step()  # and every second step, the average of the models
        >>> sync.comm.rounds
        2
        >>> sync.close()
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, local_steps: int = 1, *,
                 switch_step: int | None = None, block_size: int | None = None, block_rounds: int = 1,
                 compression: str = "none", **kwargs):
        self.algorithm = ("post-local" if switch_step is not None else "hierarchical" if block_size is not None
                          else "local")
        given = {"switch_step": switch_step, "block_size": block_size, "block_rounds": None if block_rounds == 1
                 else block_rounds}  # the config refuses those that do not apply to the algorithm, by name
        options = {"local_steps": local_steps, "compression": compression,
                   **{key: value for key, value in given.items() if value is not None}}
        super().__init__(model, optimizer, options, **kwargs)


class Gossip(Synchronizer):
    """D-SGD (Kong et al.) in a training loop: a gossip round with the graph neighbours after the steps.

    After every step (every ``local_steps``-th step: local decentralized SGD), x_i ← Σ_j w_ij x_j.

    ``topology``: any ``gossamer topology`` name (time-varying ones advance per round);
    ``gossip_form``: ``step-then-mix`` or ``mix-then-step``; ``phases`` with ``phase_steps``
    (e.g. ``["controlled", "allreduce"]``, ``[1000]``); ``consensus``: the CLI's ``consensus.*``
    keys as a dict (``{"target": "constant", "value": 0.05}``; ``run:DIR`` reads that run's Ξ²;
    ``"action": "frequency"`` adapts the gossip period instead of adding rounds).
    A round exchanges only the neighbours' models, one message each (the flat row).

    Args:
        model (nn.Module): the model, initialised alike on every rank.
        optimizer (torch.optim.Optimizer): its optimizer.
        topology (str): the graph.
        local_steps (int): H, the steps per gossip round.
        topology_seed (int): a random topology's seed.
        gossip_form (str): ``step-then-mix`` or ``mix-then-step``.
        phases (list[str]): a mode per phase (``gossip``, ``controlled``, ``allreduce``).
        phase_steps (list[int]): where each phase after the first starts.
        consensus (dict | None): consensus control's keys.
        **kwargs: :class:`Synchronizer`'s (``buffers``, ``group``, ``engine``, ...).

    Example::

        >>> import torch
        >>> from gossamer.integrations import ThreadedSim
        >>> from gossamer.integrations import Gossip
        >>> model = torch.nn.Linear(4, 2)
        >>> optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> with Gossip(model, optimizer, "ring", engine=ThreadedSim(1).engine(0)) as sync:
        ...     for step in range(3):
        ...         optimizer.zero_grad()
        ...         model(torch.randn(8, 4)).abs().mean().backward()
        ...         optimizer.step()  # and a gossip round with the neighbours
        ...     sync.comm.rounds, sync.extra_gossip_rounds
        (3, 0)
    """

    algorithm = "gossip"

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, topology: str = "ring", *,
                 local_steps: int = 1, topology_seed: int = 0, gossip_form: str = "step-then-mix",
                 phases: list[str] = (), phase_steps: list[int] = (), consensus: dict | None = None, **kwargs):
        options = {"topology": topology, "local_steps": local_steps, "topology_seed": topology_seed,
                   "gossip_form": gossip_form, "phases": list(phases), "phase_steps": list(phase_steps),
                   "consensus": dict(consensus or {})}
        reference = None
        target = options["consensus"].get("target", "none")
        if isinstance(target, str) and target.startswith("run:"):
            from ..rundir import read_trajectory

            engine = kwargs.get("engine")
            workers = engine.n if engine is not None else env_world_size(kwargs.get("group"))
            reference = read_trajectory(target.removeprefix("run:"), {"workers": workers})
        super().__init__(model, optimizer, options, reference=reference, **kwargs)

    def _context(self) -> dict:
        return {"keep_change": True}  # each round's local change: the cheap estimate

    def _estimate(self) -> float:
        """The bound Ξ ≤ (2/p)Θ of the last step's gossip round (Θ² = (1/n) Σ_i ‖Σ_j w_ij x_j − x_i‖²,
        what workers compute from the models they received), squared; the base bound after a step
        that ended with a global average or without a round."""
        state = gossip_state(self.schedule)
        if state.change is None or self.synced:
            return super()._estimate()
        bound = local_estimate(self.engine.mean_scalar(state.change), state.mixing)["consensus_distance_bound"]
        return math.inf if bound is None else bound**2


class DiLoCo(Synchronizer):
    """DiLoCo (Douillard et al.) in a training loop: an outer step every H inner steps.

    H inner steps of ``inner_optimizer``, then an outer step of ``outer_optimizer`` on the
    pseudo-gradient Δ = x_outer − mean_i x_i.

    ``outer_optimizer`` is the user's, over the same parameters (e.g. ``torch.optim.SGD(
    model.parameters(), lr=0.7, momentum=0.9, nesterov=True)``, the paper's); at an outer step
    the parameters hold x_outer and their ``.grad`` holds Δ while it steps. Each worker keeps its
    inner optimizer's state across outer steps (as the DiLoCo paper does).

    The low-communication variants, as ``gossamer train``'s keys (:mod:`gossamer.algorithms.diloco`):
    ``compression`` (SparseLoCo: each worker's Δ_i = x_outer − x_i compressed, all-gathered, with
    error feedback under ``ef-``); ``fragments`` F, ``fragment_delay`` τ, ``fragment_alpha`` α
    (Streaming DiLoCo: fragment j — a run of whole parameter tensors — sent at steps ≡ ⌊jH/F⌋ mod H,
    applied τ steps later as x_i ← α x_i + (1 − α) x_outer; the outer optimizer steps only that
    fragment's parameters, the others' ``.grad`` None, so one torch optimizer whose state is per
    parameter — SGD, Adam, AdamW — is an outer optimizer per fragment); ``outer_topology`` and
    ``outer_gamma`` (NoLoCo: Δ and x_outer averaged with the topology's neighbours, the pull
    γ (x_outer,i − x̄_i) added to the outer gradient the optimizer steps on); ``outer_overlap``
    (``delayed``: the outer step on the previous round's mean; ``eager``: each worker's own fresh
    outer gradient with the others' one round late, ``eager_first`` its first round).

    Args:
        model (nn.Module): the model, initialised alike on every rank.
        inner_optimizer (torch.optim.Optimizer): the inner steps' optimizer.
        outer_optimizer (torch.optim.Optimizer): the outer steps', over the same parameters.
        local_steps (int): H, the inner steps per outer step.
        compression, fragments, fragment_delay, fragment_alpha, outer_topology, outer_gamma,
            outer_overlap, eager_first: the low-communication variants' keys (above).
        **kwargs: :class:`Synchronizer`'s (``buffers``, ``group``, ``engine``, ...).

    Example::

        >>> import torch, torch.nn.functional as F
        >>> from gossamer.integrations import ThreadedSim
        >>> from gossamer.integrations import DiLoCo
        >>> model = torch.nn.Linear(4, 2)
        >>> inner = torch.optim.AdamW(model.parameters(), lr=0.01)
        >>> outer = torch.optim.SGD(model.parameters(), lr=0.7, momentum=0.9, nesterov=True)
        >>> sync = DiLoCo(model, inner, outer, local_steps=2, engine=ThreadedSim(1).engine(0))
        >>> for x, y in zip(torch.randn(4, 8, 4), torch.randn(4, 8, 2)):
        ...     inner.zero_grad()
        ...     F.mse_loss(model(x), y).backward()
        ...     inner.step()  # every second step, the outer step
        >>> sync.comm.rounds
        2
        >>> sync.close()
    """

    algorithm = "diloco"

    def __init__(self, model: nn.Module, inner_optimizer: torch.optim.Optimizer,
                 outer_optimizer: torch.optim.Optimizer, local_steps: int = 1, *, compression: str = "none",
                 fragments: int = 1, fragment_delay: int = 0, fragment_alpha: float = 0.0,
                 outer_topology: str = "none", outer_gamma: float = 1.0, outer_overlap: str = "none",
                 eager_first: str = "own", **kwargs):
        inner = {id(p) for group in inner_optimizer.param_groups for p in group["params"]}
        outer = {id(p) for group in outer_optimizer.param_groups for p in group["params"]}
        if outer != inner:
            raise ConfigError("outer_optimizer must optimise the same parameters as the inner optimizer")
        self.outer_optimizer = outer_optimizer
        options = {"local_steps": local_steps, "compression": compression, "fragments": fragments,
                   "fragment_delay": fragment_delay, "fragment_alpha": fragment_alpha,
                   "outer_topology": outer_topology, "outer_gamma": outer_gamma, "outer_overlap": outer_overlap,
                   "eager_first": eager_first}
        super().__init__(model, inner_optimizer, options, **kwargs)

    def _context(self) -> dict:
        # the user's outer optimizer on each fragment's columns instead of the CLI's outer_optimizer
        return {"outer_optimizer": lambda cols: _TorchOuter(self, cols)}

    def _ended_synced(self) -> bool:
        return self.schedule.synced_after(self._step.t)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "outer_optimizer": self.outer_optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.outer_optimizer.load_state_dict(state["outer_optimizer"])


class _TorchOuter:
    """The user's torch optimizer as DiLoCo's outer optimizer of the columns ``cols`` (a fragment of
    whole parameter tensors; :class:`gossamer.outer.OuterOptimizer`, its own lr and momentum: the
    schedule's are not used): the fragment's parameters
    (views into X) take x_outer and their gradients Δ, the others' gradients are None (so the
    optimizer leaves them and their state alone); it steps; x_outer ← X; the worker's own
    parameters are put back (they are applied τ steps later, in the schedule)."""

    def __init__(self, sync: DiLoCo, cols: slice):
        self.sync = sync
        self.cols = cols
        start, stop, _ = cols.indices(sync.d)
        self.names = {s.name for s in sync.slots if start <= s.offset < stop}

    def start(self, x_outer: torch.Tensor) -> None:
        pass

    def step(self, x_outer: torch.Tensor, pseudo_gradient: torch.Tensor, lr: float, momentum: float,
             staleness: int = 0) -> None:
        sync, cols = self.sync, self.cols
        own = sync.X[:, cols].clone()
        sync.X[:, cols] = x_outer
        sync.G[:, cols] = pseudo_gradient
        for s in sync.slots:
            sync.module.get_parameter(s.name).grad = \
                sync.G[0, s.offset : s.offset + s.numel].view(s.shape) if s.name in self.names else None
        sync.outer_optimizer.step()
        x_outer.copy_(sync.X[:, cols])
        sync.X[:, cols] = own

    def state_dict(self) -> dict:
        return {}  # the outer optimizer's state is saved by DiLoCo.state_dict

    def load_state_dict(self, state: dict) -> None:
        pass
