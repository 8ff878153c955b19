"""What every engine shares: the public operators, their counting, and the metric maths.

An engine holds some rows of the worker matrix (``rows``: their global worker indices; all n in
the simulator, a block of n/P in each of P processes) and moves data between workers. A subclass
implements only the primitives, each the minimum a real network must do:

- ``_group_mean_(X, size)``: rows of each group of ``size`` consecutive workers ← their mean;
- ``_mixed(X, mixing)``: W X for the rows held here (neighbours' rows exchanged, then
  combined by :func:`combine`), into a buffer, X unchanged;
- ``_exchange(payload, mixing)``: each local worker's messages from the workers in its slots of
  W (its neighbours; slot 0 itself), [m, K, ...]: what a worker needs to keep copies of them;
- ``_all_gather(payload, size)``: every member's byte message of each group that holds rows here;
- ``_row_mean(X)``: x̄ = (1/n) Σ_i x_i over all workers (X unchanged);
- ``_gather_scalars(values)``: one value per worker, all n of them in worker order;
- ``gather_rows(T)``: the full [n, ...] tensor of a local [m, ...] one, where the run is written;
- ``_any(flag)``: whether any process's flag is set (to stop or checkpoint together);
- ``_living_mean_(X, size)``: the group mean over each group's living rows only (``alive``,
  with faults; gone rows unchanged);
- ``_rows_mean(T, workers)``: the mean of the rows of the given workers (global indices), on
  every process: x̄ over the living, and what a rejoining worker fetches from its neighbours.

This base turns them into the operators that schedules call, counts each in ``comm`` (the
algorithm's traffic by level, measurement traffic apart), and computes Ξ² and the other metrics
once for every engine. Engines know nothing of algorithms, codecs or files.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ..topology import Mixing
from .stats import BYTES_PER_VALUE, METRICS, CommStats


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
        self.comm = CommStats()
        self._scratch: torch.Tensor | None = None
        self.alive: np.ndarray | None = None  # bool [n]: the living workers (faults); None: all of them
        self._living: torch.Tensor | None = None  # bool [m, 1]: which local rows are alive
        self._alive_ids: torch.Tensor | None = None  # the living workers' global indices

    def set_alive(self, alive: np.ndarray, device: torch.device) -> None:
        """The workers alive at this step (bool [n]): the averages and metrics are over them."""
        self.alive = None if alive.all() else alive
        if self.alive is not None:
            local = alive[self.rows.start : self.rows.stop]
            self._living = torch.as_tensor(local, device=device).unsqueeze(1)
            self._alive_ids = torch.as_tensor(np.flatnonzero(alive), device=device)

    def _living_ids(self, over: Sequence[int] | None) -> Sequence[int] | None:
        """The workers a mean is over: ``over`` (None: all) less the gone ones."""
        if self.alive is None:
            return over
        return [i for i in (range(self.n) if over is None else over) if self.alive[i]] or over

    @property
    def m(self) -> int:
        return len(self.rows)

    # ------------------------------------------------------------------ the algorithm's traffic

    def allreduce_mean_(self, X: torch.Tensor) -> None:
        """Exact average: every row becomes mean_i X_i (in place). A ring all-reduce of d values.
        With gone workers, the living rows become the mean of the living rows (a quorum of q)."""
        if self.alive is None:
            self._group_mean_(X, self.n)
        else:
            self._living_mean_(X, self.n)
        self.comm.allreduce(X.shape[1], self.n if self.alive is None else int(self.alive.sum()), level="global")

    def block_mean_(self, X: torch.Tensor, block_size: int) -> None:
        """Exact average inside each block of ``block_size`` consecutive workers (in place); with
        gone workers, over the block's living rows."""
        self._group_mean_(X, block_size) if self.alive is None else self._living_mean_(X, block_size)
        self.comm.allreduce(X.shape[1], block_size, level="block")

    def gossip_(self, X: torch.Tensor, mixing: Mixing, measure: bool = False) -> torch.Tensor | None:
        """One gossip round X ← W X (in place), W the mixing matrix of this round.

        With ``measure``, returns each local row's ‖Σ_j w_ij x_j − x_i‖² [m]: what worker i can
        compute from the models it received (their mean is Θ², see :meth:`mean_scalar`)."""
        mixed = self._mixed(X, mixing)
        change = (mixed - X).square().sum(1) if measure else None
        X.copy_(mixed)
        self.comm.gossip(X.shape[1], mixing)
        return change

    def exchange(self, payload: torch.Tensor, mixing: Mixing, nbytes: int) -> torch.Tensor:
        """Every worker's message (its row of ``payload`` [m, ...], ``nbytes`` on the wire) to each
        worker that has it in a slot of W. Returns, per local worker i, the messages of the
        workers in its slots, [m, K, ...] (slot k: worker ``mixing.index[k, i]``; slot 0: i's own).
        Counted as a gossip round of ``nbytes`` to each peer."""
        received = self._exchange(payload, mixing)
        self.comm.exchange(nbytes, mixing)
        return received

    def all_gather(self, payload: torch.Tensor, block_size: int | None = None) -> Gathered:
        """Every worker's byte message (uint8 [m, B]) to every member of its group: all n workers,
        or its block of ``block_size`` consecutive workers. Counted as a ring all-gather of B bytes."""
        size = block_size or self.n
        gathered = self._all_gather(payload.contiguous(), size)
        self.comm.allgather(payload.shape[1], size, level="block" if block_size else "global")
        return gathered

    # ------------------------------------------------------------------ measurement (counted apart)

    def mean_row(self, X: torch.Tensor) -> torch.Tensor:
        """x̄ = (1/n) Σ_i x_i over all (living) workers, without changing X: an all-reduce of d values."""
        self.comm.allreduce(X.shape[1], self.n, level=METRICS)
        return self._row_mean(X) if self.alive is None else self._rows_mean(X, self._alive_ids)

    def mean_scalar(self, values: torch.Tensor, over: Sequence[int] | None = None) -> float:
        """Mean over all n workers (or the workers ``over``, global indices) of a per-worker scalar
        (local values [m]; a worker outside ``over`` gives any value), in worker order; of them,
        only the living ones."""
        self.comm.allgather(BYTES_PER_VALUE, self.n, level=METRICS)
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
        process: what a rejoining worker fetches from its neighbours (faults; not counted)."""
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

    def _group_mean_(self, X: torch.Tensor, size: int) -> None:
        raise NotImplementedError

    def _mixed(self, X: torch.Tensor, mixing: Mixing) -> torch.Tensor:
        raise NotImplementedError

    def _exchange(self, payload: torch.Tensor, mixing: Mixing) -> torch.Tensor:
        raise NotImplementedError

    def _all_gather(self, payload: torch.Tensor, size: int) -> Gathered:
        raise NotImplementedError

    def _row_mean(self, X: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _living_mean_(self, X: torch.Tensor, size: int) -> None:
        raise NotImplementedError

    def _rows_mean(self, T: torch.Tensor, workers: torch.Tensor) -> torch.Tensor:
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
