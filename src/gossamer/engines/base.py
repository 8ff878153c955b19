"""What every engine shares: the public operators, their ledger entries, and the metric maths.

An engine holds some rows of the worker matrix (``rows``: their global worker indices; all n in
the simulator, a block of n/P in each of P processes) and moves data between workers. A subclass
implements only the primitives, each the minimum a real network must do:

- ``_groups_mean_(X, groups)``: the rows of each group's members ← their mean (others unchanged);
- ``_mixed(X, mixing)``: W X for the rows held here (neighbours' rows exchanged, then
  combined by :func:`combine`), into a buffer, X unchanged;
- ``_exchange(payload, mixing)``: each local worker's messages from the workers in its slots of
  W (its neighbours; slot 0 itself), [m, K, ...]: what a worker needs to keep copies of them;
- ``_all_gather(payload, size)``: every member's byte message of each group that holds rows here;
- ``_rows_mean(T, workers)``: the mean of the rows of the given workers (global indices; None:
  all), on every process: x̄, and what a rejoining worker fetches from its neighbours;
- ``_gather_scalars(values)``: one value per worker, all n of them in worker order;
- ``gather_rows(T)``: the full [n, ...] tensor of a local [m, ...] one, where the run is written;
- ``_any(flag)``: whether any process's flag is set (to stop or checkpoint together).

This base turns them into the operators that schedules call, records each in the ledger
``comm`` (:mod:`gossamer.engines.ledger`: what moved, from the operator's real inputs; the
algorithm's traffic by level, measurement traffic apart) and computes Ξ² and the other metrics
once for every engine. The workers taking part in a step (``alive``, with faults) are honoured
by every operator: means over their members, gossip over W with the others' edges dropped
(``repair``), metrics over them. Engines know nothing of algorithms, codecs or files.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from ..groups import Groups
from ..topology import Mixing, keep_living
from .ledger import BYTES_PER_VALUE, METRICS, Ledger, Transfer


def combine(parts: Iterable[torch.Tensor], weight: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """The gossip combine in neighbour-slot form: Σ_k weight[k] ⊙ parts[k], in slot order.

    ``parts`` are K tensors [m, d] (slot 0: the worker itself), taken one at a time (a generator
    may fill one buffer for each); ``weight`` is [K, m, 1]. Every engine and CHOCO-SGD's copies
    use it, so their products and sums are the same, in the same order."""
    parts = iter(parts)
    out = torch.mul(next(parts), weight[0], out=out)
    for k, part in enumerate(parts, 1):
        out.addcmul_(part, weight[k])
    return out


@dataclass
class Gathered:
    """The byte messages of every group that holds rows here: ``messages`` [g, size, B] (each
    group's members in worker order) and ``row_group`` [m], the group of each local row."""

    messages: torch.Tensor
    row_group: torch.Tensor

    def mean(self, decode) -> torch.Tensor:
        """Per local row, the mean over its group of the decoded messages: [m, d]."""
        g, size, _ = self.messages.shape
        decoded = decode(self.messages.flatten(0, 1))
        return decoded.view(g, size, -1).mean(1)[self.row_group]


class Engine:
    """The worker rows held here (``rows``, of ``n``) and the communication operators over them."""

    is_root = True  # the process that writes the run directory
    timed = False  # whether the engine measures its communication time (take_comm_seconds)

    def __init__(self, n: int, rows: range):
        self.n, self.rows = n, rows
        self.comm = Ledger(n)
        self._scratch: torch.Tensor | None = None
        self.alive: np.ndarray | None = None  # bool [n]: the workers taking part (faults); None: all of them
        self.repair: Callable[[Mixing, np.ndarray], Mixing] = keep_living
        self._everyone = Groups.blocks(n, n)
        self._block_groups: dict[int, Groups] = {}
        self._among: dict = {}  # the groups and mixings of this step's living workers, by source

    def set_alive(self, alive: np.ndarray | None,
                  repair: Callable[[Mixing, np.ndarray], Mixing] = keep_living) -> None:
        """The workers taking part from now on (bool [n]; None: all): every operator runs over
        them, and a gossip round over ``repair(W, alive)`` (default: their edges dropped, each
        living worker keeping the weight it gave a gone one)."""
        alive = None if alive is None or alive.all() else np.asarray(alive, dtype=bool)
        if not (alive is None and self.alive is None) and not np.array_equal(alive, self.alive):
            self._among.clear()
        self.alive, self.repair = alive, repair

    def living(self, source: Groups | Mixing) -> Groups | Mixing:
        """``source`` among the living workers (what an operator on it runs over): groups' gone
        members unseated, W repaired; itself when all are alive."""
        if self.alive is None:
            return source
        key = id(source)
        if key not in self._among or self._among[key][0] is not source:
            while len(self._among) >= 16:  # a step's few operators; static sources come back every step
                self._among.pop(next(iter(self._among)))
            living = source.among(self.alive) if isinstance(source, Groups) else self.repair(source, self.alive)
            self._among[key] = (source, living)
            self._among[id(living)] = (living, living)  # an operator handed the result runs it as it is
        return self._among[key][1]

    def _living_ids(self, over: Sequence[int] | None) -> Sequence[int] | None:
        """The workers a mean is over: ``over`` (None: all) less the gone ones."""
        if self.alive is None:
            return over
        return [i for i in (range(self.n) if over is None else over) if self.alive[i]] or over

    @property
    def m(self) -> int:
        return len(self.rows)

    # ------------------------------------------------------------------ the algorithm's traffic

    def groups_mean_(self, X: torch.Tensor, groups: Groups, level: str = "block") -> None:
        """Exact average within each group (in place): the rows of its (living) members ← their
        mean, every other row unchanged. A ring all-reduce of d values within each group."""
        groups = self.living(groups)
        self._groups_mean_(X, groups)
        self.comm.record(Transfer("allreduce", X.shape[1] * BYTES_PER_VALUE, level, groups=groups))

    def allreduce_mean_(self, X: torch.Tensor) -> None:
        """Exact average: every (living) row becomes the mean of the (living) rows, in place."""
        self.groups_mean_(X, self._everyone, level="global")

    def block_mean_(self, X: torch.Tensor, block_size: int) -> None:
        """Exact average inside each block of ``block_size`` consecutive workers (in place)."""
        if block_size not in self._block_groups:
            self._block_groups[block_size] = Groups.blocks(self.n, block_size)
        self.groups_mean_(X, self._block_groups[block_size], level="block")

    def recorded_allreduce(self, d: int) -> None:
        """An all-reduce of d values that ran outside the engine (DDP's, of the gradients), recorded
        as the one :meth:`allreduce_mean_` runs."""
        self.comm.record(Transfer("allreduce", d * BYTES_PER_VALUE, "global", groups=self.living(self._everyone)))

    def gossip_(self, X: torch.Tensor, mixing: Mixing, measure: bool = False,
                initiator: int | None = None) -> torch.Tensor | None:
        """One gossip round X ← W X (in place), W the mixing matrix of this round (repaired for
        the living workers). ``initiator``: a one-sided exchange that only that worker waits for
        (AD-PSGD's pair average; the ledger tells the clock).

        With ``measure``, returns each local row's ‖Σ_j w_ij x_j − x_i‖² [m]: what worker i can
        compute from the models it received (their mean is Θ², see :meth:`mean_scalar`). A round
        that averages exactly within groups (``mixing.groups``: ``groups:G``) runs as
        :meth:`groups_mean_`."""
        if mixing.groups is not None:
            before = X.clone() if measure else None
            groups = mixing.plan("groups", lambda: Groups(self.n, mixing.groups.ravel(), mixing.groups.shape[1]))
            self.groups_mean_(X, groups, level="gossip")
            return None if before is None else before.sub_(X).square_().sum(1)
        mixing = self.living(mixing)
        mixed = self._mixed(X, mixing)
        change = (mixed - X).square().sum(1) if measure else None
        X.copy_(mixed)
        self.comm.record(Transfer("gossip", X.shape[1] * BYTES_PER_VALUE, "gossip", mixing=mixing,
                                  initiator=initiator))
        return change

    def exchange(self, payload: torch.Tensor, mixing: Mixing, nbytes: int) -> torch.Tensor:
        """Every worker's message (its row of ``payload`` [m, ...], ``nbytes`` on the wire) to each
        worker that has it in a slot of W. Returns, per local worker i, the messages of the
        workers in its slots, [m, K, ...] (slot k: worker ``mixing.index[k, i]``; slot 0: i's own).
        Recorded as a gossip round of ``nbytes`` to each peer."""
        received = self._exchange(payload, mixing)
        self.comm.record(Transfer("gossip", nbytes, "gossip", mixing=mixing))
        return received

    def all_gather(self, payload: torch.Tensor, block_size: int | None = None) -> Gathered:
        """Every worker's byte message (uint8 [m, B]) to every member of its group: all n workers,
        or its block of ``block_size`` consecutive workers. A ring all-gather of B bytes."""
        size = block_size or self.n
        gathered = self._all_gather(payload.contiguous(), size)
        groups = self._everyone if size == self.n else Groups.blocks(self.n, size)
        self.comm.record(Transfer("allgather", payload.shape[1], "block" if block_size else "global", groups=groups))
        return gathered

    # ------------------------------------------------------------------ measurement (counted apart)

    def mean_row(self, X: torch.Tensor) -> torch.Tensor:
        """x̄ = (1/n) Σ_i x_i over all (living) workers, without changing X: an all-reduce of d values."""
        everyone = self.living(self._everyone)
        self.comm.record(Transfer("allreduce", X.shape[1] * BYTES_PER_VALUE, METRICS, groups=everyone))
        living = None if self.alive is None else everyone.plan(("ids", X.device), lambda: torch.as_tensor(
            np.flatnonzero(self.alive), device=X.device))
        return self._rows_mean(X, living)

    def mean_scalar(self, values: torch.Tensor, over: Sequence[int] | None = None) -> float:
        """Mean over all n workers (or the workers ``over``, global indices) of a per-worker scalar
        (local values [m]; a worker outside ``over`` gives any value), in worker order; of them,
        only the living ones. An all-gather of one value per worker."""
        self.comm.record(Transfer("allgather", BYTES_PER_VALUE, METRICS, groups=self.living(self._everyone)))
        gathered = self._gather_scalars(values)
        over = self._living_ids(over)
        return (gathered if over is None else gathered[list(over)]).mean().item()

    def consensus_distance_sq(self, X: torch.Tensor) -> float:
        """Ξ² = (1/n) Σ_i ‖x_i − x̄‖² (over the living workers)."""
        diff = torch.sub(X, self.mean_row(X), out=self._scratch_like(X))
        return self.mean_scalar(diff.square_().sum(1))

    def distance_sq_per_tensor(self, X: torch.Tensor, slots) -> dict[str, float]:
        """Ξ² restricted to each parameter tensor (the per-layer consensus distance)."""
        per_coordinate = self.mean_row((X - self.mean_row(X)).square())
        return {s.name: per_coordinate[s.offset : s.offset + s.numel].sum().item() for s in slots}

    # ------------------------------------------------------------------ bookkeeping (not counted)

    def rows_mean(self, T: torch.Tensor, workers: torch.Tensor) -> torch.Tensor:
        """The mean of the rows of ``workers`` (global indices) of a local [m, ...] tensor, on every
        process: what a rejoining worker fetches from its neighbours (faults; not recorded)."""
        return self._rows_mean(T, workers)

    def any_worker(self, flags: torch.Tensor) -> bool:
        """Whether any worker of any process raised its flag (local bools [m]): every process
        gets the same answer, so all stop, or checkpoint, at the same step."""
        return bool(self._any(flags.any().reshape(1)))

    def take_comm_seconds(self) -> tuple[float, float]:
        """Wall seconds this process waited on the network since the last call: (the algorithm's
        operators, measurement). Only engines that move data over a network measure (``timed``)."""
        raise NotImplementedError

    def gather_state(self, state):
        """A state with every tensor under a ``rows`` key (one row per local worker) gathered to
        all n rows where the run is written (None elsewhere); other values are kept as they are."""
        def walk(value, rows: bool = False):
            if rows and isinstance(value, torch.Tensor):
                return self.gather_rows(value)
            if isinstance(value, dict):
                return {k: walk(v, rows or k == "rows") for k, v in value.items()}
            return value
        full = walk(state)
        return full if self.is_root else None

    # ------------------------------------------------------------------ primitives (subclasses)

    def _groups_mean_(self, X: torch.Tensor, groups: Groups) -> None:
        raise NotImplementedError

    def _mixed(self, X: torch.Tensor, mixing: Mixing) -> torch.Tensor:
        raise NotImplementedError

    def _exchange(self, payload: torch.Tensor, mixing: Mixing) -> torch.Tensor:
        raise NotImplementedError

    def _all_gather(self, payload: torch.Tensor, size: int) -> Gathered:
        raise NotImplementedError

    def _rows_mean(self, T: torch.Tensor, workers: torch.Tensor | None) -> torch.Tensor:
        raise NotImplementedError

    def _gather_scalars(self, values: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def gather_rows(self, T: torch.Tensor) -> torch.Tensor | None:
        raise NotImplementedError

    def _any(self, flag: torch.Tensor) -> bool:
        raise NotImplementedError

    def _scratch_like(self, X: torch.Tensor) -> torch.Tensor:
        """An uninitialised buffer shaped like X, allocated once (not every step)."""
        s = self._scratch
        if s is None or s.shape != X.shape or s.dtype != X.dtype or s.device != X.device:
            self._scratch = torch.empty_like(X)
        return self._scratch
