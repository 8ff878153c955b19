"""AD-PSGD on real processes (``engine: dist``): a worker's side (:class:`PairWorker`), shared by
the processes and the replay, and the replay of their event log (:class:`PairReplay`). The rule is
the simulator's (:mod:`gossamer.algorithms.asynchronous`); who orders the events differs.

**Processes.** n workers and a coordinator: P = n + 1 processes, rank ``server_rank`` the
coordinator (it holds no model: it grants the pairs and keeps the order), the others workers
0 … n−1 in rank order. Worker i repeats: its k-th gradient g_i at x̂_i (its k-th batch, η_k of its
own step count, augmentation draw k·n + i), then j drawn as the simulator draws it (uniform among
i's neighbours in W_k, row stream ``ad-psgd-neighbour``), a request for the pair (i, j) to the
coordinator, and, once granted, its event: x_i, x_j ← (x_i + x_j)/2 (the models exchanged point to
point), x_i ← x_i − η_k g_i (the local optimizer), x̂_i ← x_i. j is passive: a thread of its process
answers while its own gradient runs on.

**Deadlock-free by construction.** One coordinator grants a pair only when neither worker is in
one, and takes the pair's two locks at once (there is no partial hold to wait on); a request that
cannot be granted waits in arrival order and is retried whenever a pair ends. Events on disjoint
pairs run at the same time; events that share a worker are ordered by their grants, so the grant
order (the log) is an order of the events that every model sees alike.

**Reads.** x̂_i ← x_i as i's event ends (before its pair is released): a passive average that
lands on i afterwards reaches i's next gradient only after that one (the simulator reads after
the exchange's τ, so there a passive average inside (f_i, f_i + τ) reaches it).

**Rows.** The processes write the event log, the final models and a summary of them (x̄'s test
metrics, Ξ²); the rows come from the replay, which holds every model at every event: a loop step
is n events, in the log's order (the simulator's definition), and its final models equal the
processes' bit for bit.

**Deaths.** A side of a pair that the log says was cut (its peer lost mid-exchange) keeps its
model; the other side averages unless cut too. A gone worker's row leaves the metrics at its gone
line (the engine's ``alive``); until then the replay holds the log's account of its model (what a
worker lost later computed after an exchange it was cut from is not in the log, and not read: a
survivor averaged only with models sent before). A pair cut on either side moved models partly,
and how much is not in the log: its exchange is not counted in the rows' bytes (the processes'
``wire_bytes_sent`` counts what each process that finished handed ``dist.send``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from ..engines.ledger import Transfer, row_bytes
from ..network import Speeds
from ..registry import ConfigError
from .asynchronous import pair_mixing
from .schedule import Schedule, StepIO, Stepped, begin_step


def average_(mine: torch.Tensor, theirs: torch.Tensor) -> None:
    """mine ← (mine + theirs)/2 (the same bits on both sides of a pair: addition commutes)."""
    mine.add_(theirs).mul_(0.5)


@dataclass
class PairWorker:
    """Worker i's side (module docstring): its one-row run (``run``), x_i (``model``; the run's X
    holds x̂_i, the model its gradients are taken at), its gradient count k, its last gradient."""

    run: object  # gossamer.train.Run on an engine holding row i
    worker: int
    lr: object  # η_k
    batches: object
    speeds: Speeds | None = None  # a process sleeps its extra compute (a replay does not)
    count: int = 0
    model: torch.Tensor | None = None  # x_i [1, d]
    gradient: torch.Tensor | None = None  # g_i [1, d]
    loss: float = 0.0

    def __post_init__(self):
        self.model = self.run.workers.X.clone()

    def compute(self) -> None:
        """g_i at x̂_i (the run's X), its k-th batch."""
        workers, n = self.run.workers, self.run.cfg.workers
        began = time.perf_counter()
        x, y = self.batches.of(self.count, self.count * n + self.worker)
        self.loss = float(workers.loss_and_grad(x, y)[0])
        self.gradient = workers.G.clone()
        if self.speeds is not None:
            extra = self.speeds.factor(self.count, self.worker) - 1
            if extra > 0:
                time.sleep(extra * (time.perf_counter() - began))

    def partner(self) -> int | None:
        """j for the k-th event: the simulator's draw."""
        return self.run.schedule.neighbour(self.worker, self.count)

    def event(self, theirs: torch.Tensor | None) -> None:
        """The pair average with j's model (None: no neighbour this round), the update, the read."""
        if theirs is not None:
            average_(self.model, theirs)
        self.run.workers.G.copy_(self.gradient)
        self.run.optimizer.step(self.model, self.run.workers.G, self.lr(self.count), None)
        self.count += 1
        self.run.workers.X.copy_(self.model)


@dataclass
class PairReplay(Schedule):
    """The events of a log (``entries``: {"event": s, "i": i, "j": j or None, "k": k}) applied by
    ``workers`` in order, n a loop step, less the sides ``cuts`` names ((s, worker)), each of
    ``gone`` ((after, w): w lost after ``after`` events) dropped at its place; X holds each
    worker's x_i after the step."""

    workers: list[PairWorker]
    entries: list[dict]
    where: str
    cuts: set[tuple[int, int]] = field(default_factory=set)
    gone: list[tuple[int, int]] = field(default_factory=list)
    taken: int = 0
    computed: list[int] = field(default_factory=list)  # the gradient count each worker's g_i is of (−1: none)

    def start(self, engine, X: torch.Tensor) -> None:
        self.computed = [-1] * len(self.workers)

    def step(self, io: StepIO) -> Stepped:
        n = len(self.workers)
        for _ in range(n):
            self._drop_gone(io)
            if self.taken == len(self.entries):
                raise ConfigError(f"--replay {self.where}: the event log ends after event {self.taken}")
            entry = self.entries[self.taken]
            self.taken += 1
            i, j = entry["i"], entry["j"]
            me = self.workers[i]
            if entry["k"] != me.count:
                raise ConfigError(f"--replay {self.where}: event {self.taken} is worker {i}'s gradient "
                                  f"{entry['k']}, the replay is at its {me.count}; the log is not this run's")
            if self.computed[i] != me.count:
                me.compute()
                self.computed[i] = me.count
            s = entry["event"]
            theirs = None if j is None or (s, i) in self.cuts else self.workers[j].model.clone()
            if j is not None and (s, j) not in self.cuts:
                average_(self.workers[j].model, me.model)
                if theirs is not None:
                    io.engine.comm.record(Transfer("gossip", row_bytes(io.X), "gossip",
                                                   mixing=pair_mixing(n, i, j), initiator=i))
            me.event(theirs)
            io.engine.comm.compute(np.array([i]), np.array([entry["k"]]))
        self._drop_gone(io)
        for w, worker in enumerate(self.workers):
            io.X[w] = worker.model[0]
            io.G[w] = 0 if worker.gradient is None else worker.gradient[0]
        losses = torch.tensor([w.loss for w in self.workers], dtype=io.X.dtype, device=io.X.device)
        step, ema = begin_step(self, io.engine, io.X, io.G, io.t, io.lr, io.grad_norm_sq_ema, io.measure,
                               average=False)
        return Stepped(losses, None, step, ema, {})

    def _drop_gone(self, io: StepIO) -> None:
        """The workers lost by now leave the metrics (the engine's ``alive``)."""
        lost = {w for after, w in self.gone if after <= self.taken}
        if lost:
            io.engine.set_alive(np.array([w not in lost for w in range(len(self.workers))]))
