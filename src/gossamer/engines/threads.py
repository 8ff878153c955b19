"""n one-row engines over one simulator, for n threads of one process.

What the hooks of :mod:`gossamer.integrations` need from an engine is one worker's row per model;
:class:`ThreadedSim` hands each of n threads such an engine (:meth:`ThreadedSim.engine`), so a
training loop with one model per thread runs the hooks' logic without processes (tests,
notebooks). Every primitive is a collective of the n threads: each puts its row in, one thread
applies the simulator's primitive (:class:`~gossamer.engines.sim.SimEngine`) to the stacked
[n, ...] rows, each takes its row back — the simulator's results, bit for bit.
"""

from __future__ import annotations

import threading
from typing import Callable

import torch

from ..groups import Groups
from ..topology import Mixing
from .base import Engine, Gathered
from .sim import SimEngine


class ThreadedSim:
    """The shared simulator and the meeting point of n threads, one model each.

    The hooks of :mod:`gossamer.integrations` run over it without processes (tests, notebooks).

    Args:
        n: the workers, one thread each.
        timeout: seconds a thread waits for the others at a collective before it fails.

    Example::

        >>> import threading, torch
        >>> from gossamer.integrations import LocalSGD, ThreadedSim
        >>> hub, final = ThreadedSim(2), [None, None]
        >>> def worker(rank):
        ...     model = torch.nn.Linear(3, 1)
        ...     torch.nn.init.constant_(model.weight, 0.5), torch.nn.init.zeros_(model.bias)  # alike on every rank
        ...     optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        ...     sync = LocalSGD(model, optimizer, local_steps=2, engine=hub.engine(rank))
        ...     for _ in range(2):
        ...         optimizer.zero_grad()
        ...         model(torch.full((4, 3), rank + 1.0)).sum().backward()
        ...         optimizer.step()
        ...     final[rank] = sync.X.clone()
        >>> threads = [threading.Thread(target=worker, args=(r,)) for r in range(2)]
        >>> for t in threads: t.start()
        >>> for t in threads: t.join()
        >>> torch.equal(final[0], final[1])  # averaged after the second step
        True
    """

    def __init__(self, n: int, timeout: float = 60.0):
        self.sim = SimEngine(n)
        self.barrier = threading.Barrier(n, timeout=timeout)
        self.inputs: list[torch.Tensor | None] = [None] * n
        self.result = None

    def engine(self, rank: int) -> ThreadEngine:
        """Worker ``rank``'s engine (for the thread that trains that worker)."""
        return ThreadEngine(self, rank)

    def collective(self, rank: int, value: torch.Tensor, op: Callable[[torch.Tensor], object]):
        """Every thread's ``value`` stacked in rank order, ``op`` applied once; its result to all."""
        self.inputs[rank] = value
        self.barrier.wait()
        if rank == 0:
            self.result = op(torch.cat(self.inputs))
        self.barrier.wait()
        result = self.result
        self.barrier.wait()  # nobody starts the next collective before everyone has this result
        return result


class ThreadEngine(Engine):
    """Worker ``rank``'s row of a :class:`ThreadedSim` (``rows = range(rank, rank + 1)``)."""

    def __init__(self, hub: ThreadedSim, rank: int):
        super().__init__(hub.sim.n, range(rank, rank + 1))
        self.hub, self.rank, self.world = hub, rank, hub.sim.n
        self.is_root = rank == 0

    def _mine(self, full: torch.Tensor) -> torch.Tensor:
        return full[self.rank : self.rank + 1]

    def _groups_mean_(self, X: torch.Tensor, groups: Groups) -> None:
        def mean(full):
            self.hub.sim._groups_mean_(full, groups)
            return full
        X.copy_(self._mine(self.hub.collective(self.rank, X, mean)))

    def _mixed(self, X: torch.Tensor, mixing: Mixing) -> torch.Tensor:
        return self._mine(self.hub.collective(self.rank, X, lambda full: self.hub.sim._mixed(full, mixing).clone()))

    def _exchange(self, payload: torch.Tensor, mixing: Mixing) -> torch.Tensor:
        return self._mine(self.hub.collective(self.rank, payload, lambda full: self.hub.sim._exchange(full, mixing)))

    def _all_gather(self, payload: torch.Tensor, groups: Groups) -> Gathered:
        gathered = self.hub.collective(self.rank, payload, lambda full: self.hub.sim._all_gather(full, groups))
        group = self.rank // groups.size
        return Gathered(gathered.messages[group : group + 1], torch.zeros(1, dtype=torch.long, device=payload.device),
                        None if gathered.member is None else gathered.member[group : group + 1])

    def _rows_mean(self, T: torch.Tensor, workers: torch.Tensor | None, over: Groups | None) -> torch.Tensor:
        return self.hub.collective(self.rank, T, lambda full: self.hub.sim._rows_mean(full, workers, over))

    def _gather_scalars(self, values: torch.Tensor, over: Groups) -> torch.Tensor:
        return self.hub.collective(self.rank, values.reshape(1), lambda full: self.hub.sim._gather_scalars(full, over))

    def gather_rows(self, T: torch.Tensor) -> torch.Tensor:
        return self.hub.collective(self.rank, T, lambda full: full)

    def _any(self, flag: torch.Tensor) -> bool:
        return bool(self.hub.collective(self.rank, flag.reshape(1), lambda full: full.any()))

    def broadcast_(self, X: torch.Tensor, src: int = 0) -> None:
        """Every row ← worker ``src``'s (not counted: set-up, as the dist engine's)."""
        X.copy_(self.hub.collective(self.rank, X, lambda full: full[src : src + 1].clone()))

    def close(self) -> None:
        pass
