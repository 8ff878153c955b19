"""The torch.distributed engine: P processes, each holding a contiguous block of n/P worker rows.

Process r holds the global workers ``rows = range(r·m, (r+1)·m)``, m = n/P, as the local rows
[m, d] of X. The primitives have the simulator's semantics (``engines/sim.py``), so the operators,
counts and metrics of :class:`~gossamer.engines.base.Engine` are the simulator's (and
``summary.json`` matches), and move only what a real network must move:

- group mean (consecutive blocks, Moshpit's grid lines, ``groups:G``'s partitions, any
  :class:`~gossamer.groups.Groups`): for each group, one ``all_reduce`` of the sum of its members'
  local rows (d values) among the processes that hold members, divided by the members; a group
  inside one process needs nothing. The process subgroups are made once per set of processes,
  every rank asking for the same ones in the same order, as ``dist.new_group`` requires;
- gossip: the rows that neighbours need, point to point (``batch_isend_irecv``, one message per
  peer process), then the simulator's :func:`~gossamer.engines.base.combine` over own rows followed by the
  received rows; ``sent`` counts what this process actually sent; a neighbour exchange of
  messages (CHOCO-SGD's compressed changes) moves the same rows of its payload instead, and a
  returning worker's fetch is such a round;
- all-gather of messages: one ``all_gather`` per block among the processes that hold its
  members, each process's share padded to the largest;
- x̄ and scalar means: an all-reduce of the row sum and an all-gather of one scalar per worker,
  averaged in global worker order (as the simulator does).

With faults (``alive``), every process knows who is alive (the fault state is drawn from the
seed alike everywhere), and only the processes that hold living members of a group take part in
its collective: a mean over the living is an all-reduce of the sum of the local living rows
among them, divided by the group's living count, written to the living rows only. A process
whose workers are all gone still needs x̄ and the metrics (it writes or evaluates the run): it
gets them by a broadcast that is bookkeeping, not traffic. A gone worker's row of a repaired W
is e_i and no living worker reads it, so gossip sends it nothing and it sends nothing.

What each call site hands torch.distributed passes through :meth:`_hand` to the wire tap
(:mod:`gossamer.engines.wire`), where it is checked against each transfer the ledger records.

With ``timed``, the wall time spent in the collectives of the algorithm's operators and of
measurement is kept apart (:meth:`take_comm_seconds`, by the level of the transfer each
collective belongs to): the communication a real network took, next to what the time model of
:mod:`gossamer.network` predicts. Bookkeeping is not timed.

Failures (:mod:`gossamer.engines.failures`): every collective waits at most ``timeout`` seconds;
a lost peer raises :class:`PeerLost` with one line naming it.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Callable

import numpy as np
import torch
import torch.distributed as dist

from ..groups import Groups
from ..topology import Mixing
from .base import Engine, Gathered, Work, combine
from .failures import PeerLost, Watchdog
from .ledger import METRICS, Transfer
from .wire import WireTap
from .works import release_works, retain


@dataclass
class WireStats:
    """What this process actually sent point to point (gossip): messages, values, bytes."""

    messages: int = 0
    values: int = 0
    bytes: int = 0


def env_world_size(group=None) -> int:
    """Processes in ``group`` (default: all), or torchrun's WORLD_SIZE before a group exists."""
    return dist.get_world_size(group) if dist.is_initialized() else int(os.environ.get("WORLD_SIZE", 1))


def resolve_backend(name: str, device: torch.device) -> str:
    """auto: NCCL for CUDA tensors, gloo otherwise."""
    if name == "auto":
        return "nccl" if device.type == "cuda" else "gloo"
    if name == "nccl" and device.type != "cuda":
        raise ValueError("dist_backend 'nccl' needs device=cuda; use dist_backend=gloo (or auto) on CPU")
    return name


def attempt_store(timeout: timedelta) -> dict:
    """``init_process_group``'s store under torchrun with restarts: the agent's store outlives a
    failed attempt, so the next attempt's processes could read the addresses the dead ones
    published ("Connection refused" in gloo's connectFullMesh); a store prefixed by the attempt
    (TORCHELASTIC_RESTART_COUNT) keeps them apart. Outside torchrun's agent store: {} (env://)."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return {}
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timeout)
    return {"store": dist.PrefixStore(f"gossamer/attempt_{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", store),
            "rank": int(os.environ["RANK"]), "world_size": int(os.environ["WORLD_SIZE"])}


def _destroy_group() -> None:
    """At exit: destroy the default group that an engine created (registered by close)."""
    if dist.is_initialized():
        dist.destroy_process_group()


def agree(build, gather: Callable[[str | None], list]):
    """``build()`` on every process; if it raised a ValueError on any, raise the first such error
    on every process. ``gather(error)``: every process's error (None: none), in rank order."""
    try:
        result, error = build(), None
    except ValueError as e:
        result, error = None, str(e)
    first = next((e for e in gather(error) if e), None)
    if first:
        raise ValueError(first)
    return result


def first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0][:200] if text else type(e).__name__


class DistEngine(Engine):
    """The worker rows of this process (n/P of n) and the engine primitives over P processes.

    Joins the default process group if one exists (library use), else creates it from torchrun's
    environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) with ``backend`` and ``timeout``;
    a group it created lives until the process exits (:meth:`close`). ``group``: the processes that hold the n
    workers (default: all); ranks here (``rank``, ``world``, peers) are ranks in that group.
    ``timed``: measure the wall time of the counted collectives (:meth:`take_comm_seconds`).
    """

    def __init__(self, n: int, backend: str = "auto", timeout: float = 60.0, device: torch.device | str = "cpu",
                 group=None, timed: bool = False):
        if group is not None and dist.get_rank(group) < 0:
            raise ValueError(f"this process (rank {dist.get_rank()}) is not a member of the given group")
        world = env_world_size(group)
        if n % world:
            raise ValueError(f"workers ({n}) must be a multiple of the number of processes ({world}) for engine "
                             f"'dist'; use workers={world * max(1, n // world)} or another multiple of {world}")
        self.device = torch.device(device)
        self.timeout = float(timeout)
        # the heartbeat must notice a silent peer, and the verdict must be out, within `timeout`
        self._beat_interval = min(0.5, self.timeout / 40)
        self._window = 4 * self._beat_interval
        self._op_timeout = timedelta(seconds=max(self.timeout - self._window - max(1.5, 0.15 * self.timeout),
                                                 self.timeout / 2))
        self._owns_group = not dist.is_initialized()
        missing = [v for v in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if v not in os.environ]
        if self._owns_group and missing:
            raise ValueError(f"engine 'dist' runs under torchrun ({', '.join(missing)} not set): "
                             f"torchrun --standalone --nproc-per-node P -m gossamer train ..., or use engine=sim")
        if self.device.type == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
            if self.device.index is None:
                self.device = torch.device("cuda", torch.cuda.current_device())
        if self._owns_group:
            try:
                dist.init_process_group(resolve_backend(backend, self.device), timeout=self._op_timeout,
                                        **attempt_store(self._op_timeout))
            except (RuntimeError, ValueError) as e:  # rendezvous failed or timed out
                raise PeerLost(f"could not form the process group of {world} processes within "
                               f"{self.timeout:g} s: {first_line(e)}", []) from None
        self.group = group  # None: the default group
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        m = n // self.world
        super().__init__(n, range(self.rank * m, (self.rank + 1) * m))
        self.is_root = self.rank == 0
        self.sent = WireStats()  # what this process actually sent point to point
        self._block_plans: dict[int, list] = {}
        self._subgroups: dict[tuple[int, ...], object] = {}  # process subgroups by their ranks
        self._plans = object()  # the key of this engine's plans kept on groups
        self._broken = False
        self.timed = timed
        self._seconds = {"algorithm": 0.0, METRICS: 0.0}
        self._pending = 0.0  # seconds of the collectives since the last transfer was recorded
        self.wire = WireTap.from_env(n, self.world, self.rank)
        self._watch = Watchdog(self.rank, self.world, self._beat_interval, self._window)

    # ------------------------------------------------------------------ primitives

    def _groups_mean_(self, X: torch.Tensor, groups: Groups) -> None:
        self._groups_mean(X, groups, deferred=False)()

    def _start_groups_mean(self, X: torch.Tensor, groups: Groups) -> Work:
        finish = self._groups_mean(X, groups, deferred=True)
        return Work(lambda: finish() or X)

    def _groups_mean(self, X: torch.Tensor, groups: Groups, deferred: bool) -> Callable[[], None]:
        """Each group's members' rows ← their mean: the sum of the local members' rows, all-reduced
        among the processes holding members (nothing when one holds them all), over the members.
        Consecutive blocks of all workers (nodes) as views of the rows. Returns what completes it:
        the waits for the all-reduces (``deferred``: still in flight) and the writes of the means."""
        writes = []
        if groups.consecutive and groups.member is None:
            for local, group, ranks in self._blocks(groups.size):
                part = X[local]
                if group is None:  # the whole block is here
                    part.copy_(part.mean(0, keepdim=True).expand_as(part))
                    continue
                total = part.sum(0)
                writes.append((self._all_reduce(total, group, ranks, deferred),
                               lambda part=part, total=total: part.copy_((total / groups.size).expand_as(part))))
        else:
            for members, ranks, group in self._shares(groups):
                if self.rank in ranks:
                    local = self._local(members, X.device)
                    total = X.index_select(0, local).sum(0)
                    wait = self._all_reduce(total, group, ranks, deferred) if group is not None else lambda: None
                    writes.append((wait, lambda local=local, total=total, k=len(members): X.index_copy_(
                        0, local, (total / k).expand(len(local), -1).contiguous())))

        def finish() -> None:
            for wait, write in writes:
                wait()
                write()
        return finish

    def _rows_mean(self, T: torch.Tensor, workers: torch.Tensor | None, over: Groups | None) -> torch.Tensor:
        lo, hi = self.rows.start, self.rows.stop
        total = T.sum(0) if workers is None else T.index_select(0, workers[(workers >= lo) & (workers < hi)] - lo).sum(0)
        count = self.n if workers is None else len(workers)
        if not total.numel():
            return total
        if over is None:  # bookkeeping: every process
            self._run("all-reduce", lambda: dist.all_reduce(total, group=self.group, async_op=True))
            return total / count
        ((_, ranks, group),) = self._shares(over)
        if group is not None and self.rank in ranks:
            self._all_reduce(total, group, ranks)
        self._share(total, ranks)
        return total / count

    def _mixed(self, X: torch.Tensor, mixing: Mixing) -> torch.Tensor:
        """Receive the rows this block's workers mix in, then combine: W X for the local rows."""
        index, weight = self._gossip_plan(mixing, X)
        source = self._with_neighbours(X, mixing)
        return combine((source[index[k]] for k in range(index.shape[0])), weight)

    def _exchange(self, payload: torch.Tensor, mixing: Mixing) -> torch.Tensor:
        """Receive the messages of the workers in the local workers' slots; each worker's, in slot order."""
        local, _, _ = self._neighbour_plan(mixing, payload.device)
        return self._with_neighbours(payload, mixing)[local.T]

    def _with_neighbours(self, rows: torch.Tensor, mixing: Mixing) -> torch.Tensor:
        """The local rows [m, ...] followed by the rows of other processes' workers that the local
        workers have in their slots of W (one message per peer process, point to point)."""
        _, send, recv = self._neighbour_plan(mixing, rows.device)
        received = [torch.empty(len(r), *rows.shape[1:], dtype=rows.dtype, device=rows.device) for _, r in recv]
        outgoing = [rows.index_select(0, r) for _, r in send]
        ops = [dist.P2POp(dist.isend, buf, self._global(peer), self.group) for (peer, _), buf in zip(send, outgoing)]
        ops += [dist.P2POp(dist.irecv, buf, self._global(peer), self.group) for (peer, _), buf in zip(recv, received)]
        for (peer, _), buf in zip(send, outgoing):
            self._hand("send", (peer,), buf)
        for (peer, _), buf in zip(recv, received):
            self._hand("recv", (peer,), buf)
        if ops:
            self._run("gossip exchange", lambda: dist.batch_isend_irecv(ops),
                      peers=sorted({p for p, _ in send} | {p for p, _ in recv}), timed=True)
        self.sent.messages += len(outgoing)
        self.sent.values += sum(b.numel() for b in outgoing)
        self.sent.bytes += sum(b.numel() * b.element_size() for b in outgoing)
        return torch.cat([rows, *received]) if received else rows

    def _all_gather(self, payload: torch.Tensor, groups: Groups) -> Gathered:
        return self._all_gathered(payload, groups, deferred=False)()

    def _start_all_gather(self, payload: torch.Tensor, groups: Groups) -> Work:
        return Work(self._all_gathered(payload, groups, deferred=True))

    def _all_gathered(self, payload: torch.Tensor, groups: Groups, deferred: bool) -> Callable[[], Gathered]:
        """Per block holding rows here: its members' rows, gathered among the processes that hold
        members (each share padded to the largest); a gone member's seat zeros. Returns what
        completes it (``deferred``: the all-gathers still in flight) and gives the messages."""
        size = groups.size
        shares = {int(share[0][0]) // size: share for share in self._shares(groups)}  # by block
        first, last = self.rows.start // size, (self.rows.stop - 1) // size
        messages = torch.zeros(last - first + 1, size, payload.shape[1], dtype=payload.dtype, device=payload.device)
        blocks = []
        for b in range(first, last + 1):
            members, ranks, group = shares.get(b, (None, (), None))
            if self.rank in ranks:  # else its rows here are gone: they receive nothing
                blocks.append((b, self._gathered(payload, members, ranks, group, deferred)))
        row_group = (torch.arange(self.rows.start, self.rows.stop, device=payload.device) // size) - first
        member = None if groups.member is None else torch.tensor(
            groups.member[first * size : (last + 1) * size], device=payload.device).view(-1, size)

        def finish() -> Gathered:
            for b, parts in blocks:
                for ids, part in parts():
                    messages[b - first, torch.as_tensor(ids - b * size, device=payload.device)] = part
            return Gathered(messages, row_group, member)
        return finish

    def _gather_scalars(self, values: torch.Tensor, over: Groups) -> torch.Tensor:
        """One value per member of ``over`` (a gone worker's 0), all n in worker order: an all-gather
        among the processes that hold members (each share padded to the largest)."""
        values = values.to(self.device)
        ((members, ranks, group),) = self._shares(over)
        full = torch.zeros(self.n, dtype=values.dtype, device=self.device)
        if self.rank in ranks:
            for ids, part in self._gathered(values, members, ranks, group)():
                full[torch.as_tensor(ids, device=self.device)] = part
        self._share(full, ranks)
        return full

    def _gathered(self, rows: torch.Tensor, members: np.ndarray, ranks: tuple[int, ...], group,
                  deferred: bool = False) -> Callable[[], list]:
        """(global ids, their rows) of each process's ``members`` of one group: this process's rows
        of ``rows`` [m, ...] all-gathered among the processes ``ranks`` that hold members, each
        share padded to the largest (nothing moves when this process holds them all). Returns
        the function that gives them (``deferred``: once the all-gather, still in flight, is done)."""
        held = [members[members // self.m == q] for q in ranks]
        mine = rows.new_zeros(max(map(len, held)), *rows.shape[1:])
        mine[: len(held[ranks.index(self.rank)])] = rows[self._local(members, rows.device)]
        parts, wait = [mine], lambda: None
        if group is not None:
            parts = [torch.empty_like(mine) for _ in ranks]
            self._hand("all_gather", ranks, mine)
            wait = self._launch("all-gather", lambda: dist.all_gather(parts, mine, group=group, async_op=True),
                                timed=True, deferred=deferred)
            if not deferred:
                wait()

        def given() -> list:
            wait()
            return [(ids, part[: len(ids)]) for ids, part in zip(held, parts)]
        return given

    def gather_rows(self, T: torch.Tensor) -> torch.Tensor | None:
        """The full [n, ...] tensor of a local [m, ...] one, in worker order, on rank 0 (bookkeeping)."""
        T = T.contiguous()
        parts = [torch.empty_like(T) for _ in range(self.world)]
        gather_list = parts if self.rank == 0 else None
        self._run("gather", lambda: dist.gather(T, gather_list, dst=self._global(0), group=self.group,
                                                async_op=True))
        return torch.cat(parts) if self.rank == 0 else None

    def _any(self, flag: torch.Tensor) -> bool:
        total = flag.to(self.device, torch.int32)
        self._run("agreement", lambda: dist.all_reduce(total, op=dist.ReduceOp.MAX, async_op=True))
        return bool(total.item())

    # ------------------------------------------------------------------ for the CLI and the library

    def agree(self, build):
        """Run ``build()`` on every rank; if it raised a ValueError on any rank, raise the first such
        error on every rank (so all ranks fail alike, exit 2). Returns build()'s result."""
        def gather(error: str | None) -> list:
            errors: list = [None] * self.world
            self._run("agreement", lambda: dist.all_gather_object(errors, error, group=self.group))
            return errors
        return agree(build, gather)

    def broadcast_(self, X: torch.Tensor, src: int = 0) -> None:
        """Every rank's X ← rank src's X (in place)."""
        self._run("broadcast", lambda: dist.broadcast(X, self._global(src), group=self.group, async_op=True))

    def lost(self, what: str, peers: list[int] | None = None) -> PeerLost:
        """The :class:`PeerLost` for a failed operation: which rank is gone, in one line."""
        self._broken = True
        ranks = self._watch.verdict(peers and [self._global(p) for p in peers], self.timeout)
        who = (f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}") if ranks \
            else "a peer (could not tell which)"
        return PeerLost(f"rank {self.rank}: lost {who} of {self.world} ({what}): the process died or did not "
                        f"answer within dist_timeout={self.timeout:g} s; stopping", ranks)

    def close(self) -> None:
        """Stop the heartbeat and hold no process group (subgroups and the default one in the block
        plans). A group this engine created stays for the next engine of this process (a second
        synchroniser joins it: forming a new one would rendezvous on the old store) and is
        destroyed at exit."""
        self._watch.stop()
        self._block_plans.clear()
        self._subgroups.clear()
        self._plans = object()
        if self.wire is not None:
            self.wire.write()
        if self._owns_group and not self._broken:
            atexit.unregister(_destroy_group)  # once
            atexit.register(_destroy_group)

    # ------------------------------------------------------------------ internals

    def take_comm_seconds(self) -> tuple[float, float]:
        seconds = (self._seconds["algorithm"], self._seconds[METRICS])
        self._seconds = dict.fromkeys(self._seconds, 0.0)
        return seconds

    def _record(self, transfer: Transfer) -> None:
        """The ledger's record, and the wall time of the transfer's collectives by its level."""
        super()._record(transfer)
        self._seconds[METRICS if transfer.level == METRICS else "algorithm"] += self._pending
        self._pending = 0.0

    def _hand(self, kind: str, ranks: tuple[int, ...], tensor: torch.Tensor) -> None:
        """What a call site hands torch.distributed: ``kind`` (all_reduce, all_gather, send, recv)
        with the processes ``ranks`` (a collective's group, a message's peer), to the wire tap."""
        if self.wire is not None:
            self.wire.hand(kind, ranks, tensor.nbytes)

    def _all_reduce(self, total: torch.Tensor, group, ranks: tuple[int, ...],
                    deferred: bool = False) -> Callable[[], None]:
        """Sum ``total`` (in place) over the processes ``ranks`` (their subgroup ``group``): started,
        and waited for now, or by the returned function where ``deferred``."""
        if not total.numel():
            return lambda: None
        self._hand("all_reduce", ranks, total)
        wait = self._launch("all-reduce", lambda: dist.all_reduce(total, group=group, async_op=True), timed=True,
                            deferred=deferred)
        if not deferred:
            wait()
        return wait

    def _share(self, result: torch.Tensor, ranks: tuple[int, ...]) -> None:
        """Every process ← ``result`` of the processes ``ranks`` that computed it, where some did
        not take part (all their workers are gone): bookkeeping, not traffic."""
        if len(ranks) < self.world:
            self.broadcast_(result, src=ranks[0])

    def _run(self, what: str, start, peers: list[int] | None = None, timed: bool = False) -> None:
        """Start a communication op and wait for it (:meth:`_launch`)."""
        self._launch(what, start, peers, timed)()

    def _launch(self, what: str, start, peers: list[int] | None = None, timed: bool = False,
                deferred: bool = False) -> Callable[[], None]:
        """Start a communication op (``start()`` returns its works); returns the function that
        waits for it (once: a second call returns at once), at most the op timeout each;
        failures → PeerLost. ``timed``: its wall time counts, by the level of the transfer it belongs to, when the engine is timed — for a
        ``deferred`` op (waited where its result is consumed, after its transfer is recorded) the
        time spent waiting for it, which is the algorithm's."""
        self._watch.ops += 1
        release_works()  # the earlier collectives' works, finished: freed here, before this one starts
        clock = self.timed and timed
        if clock and not deferred:
            self._sync()
        began = time.perf_counter()
        with self._failures(what, peers):
            work = start()
        works = list(work) if isinstance(work, list) else [work] if work is not None else []
        for w in works:
            retain(w)
        waited = []

        def wait() -> None:
            if waited:
                return
            waited.append(True)
            waiting = time.perf_counter()
            with self._failures(what, peers):
                for w in works:
                    w.wait(self._op_timeout)
            if clock:
                self._sync()
                if deferred:
                    self._seconds["algorithm"] += time.perf_counter() - waiting
                else:
                    self._pending += time.perf_counter() - began
        return wait

    @contextlib.contextmanager
    def _failures(self, what: str, peers: list[int] | None):
        """A failed op (DistBackendError, a timeout, a closed connection) → PeerLost."""
        try:
            yield
        except PeerLost:
            raise
        except RuntimeError as e:
            if os.environ.get("GOSSAMER_DEBUG"):
                raise
            raise self.lost(f"{what} failed", peers) from e

    def _sync(self) -> None:
        """Wait for the device's queued work (CUDA ops are asynchronous), so a timer measures the op."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _global(self, rank: int) -> int:
        """The default group's rank of this group's ``rank``."""
        return rank if self.group is None else dist.get_global_rank(self.group, rank)

    def _blocks(self, size: int) -> list:
        """For each block of ``size`` consecutive workers that holds rows of this process:
        (local slice, process subgroup or None when the block lies inside this process, its ranks).

        Every rank makes the subgroups of all spanning blocks, in block order, on first use."""
        if size not in self._block_plans:
            if self.n % size:
                raise ValueError(f"block_size {size} must divide workers {self.n}")
            plan = []
            for first in range(0, self.n, size):
                last = first + size - 1
                ranks = tuple(range(first // self.m, last // self.m + 1))
                group = self._subgroup(ranks) if len(ranks) > 1 else None
                if self.rank in ranks:
                    lo, hi = max(first, self.rows.start), min(last + 1, self.rows.stop)
                    plan.append((slice(lo - self.rows.start, hi - self.rows.start), group, ranks))
            self._block_plans[size] = plan
        return self._block_plans[size]

    def _shares(self, groups: Groups) -> list[tuple[np.ndarray, tuple[int, ...], object]]:
        """Per group with a member, in group order: (its members, ascending; the ranks of the
        processes that hold them; their subgroup, None for one process). Every rank makes the
        subgroups of all groups, in order, once per groups (kept on them)."""
        def build():
            shares = []
            for r in range(groups.count):
                members = np.sort(groups.members(r))
                if len(members):
                    ranks = tuple(np.unique(members // self.m).tolist())
                    shares.append((members, ranks, self._subgroup(ranks) if len(ranks) > 1 else None))
            return shares
        return groups.plan(("dist shares", self._plans), build)

    def _local(self, members: np.ndarray, device: torch.device) -> torch.Tensor:
        """The local rows of the ``members`` held here."""
        mine = members[(members >= self.rows.start) & (members < self.rows.stop)] - self.rows.start
        return torch.as_tensor(mine, device=device)

    def _subgroup(self, ranks: tuple[int, ...]):
        """The process group of ``ranks`` (ranks of this engine's group), made on first use."""
        if ranks not in self._subgroups:
            whole = self.group if self.group is not None else dist.group.WORLD
            self._subgroups[ranks] = whole if len(ranks) == self.world else self._new_group(list(ranks))
        return self._subgroups[ranks]

    def _new_group(self, ranks: list[int]):
        try:
            # inside a given group only its members create subgroups (the rest of the world never calls)
            return dist.new_group([self._global(r) for r in ranks], timeout=self._op_timeout,
                                  use_local_synchronization=self.group is not None)
        except RuntimeError as e:
            raise self.lost("creating a process subgroup failed") from e

    def _neighbour_plan(self, mixing: Mixing, device: torch.device) -> tuple:
        """(index [K, m] into [own rows; received rows], [(peer, rows to send)], [(peer, rows to
        receive)]) for this process, built once per matrix (kept on it)."""
        def build():
            lo, hi, m = self.rows.start, self.rows.stop, self.m
            index, weight = mixing.index, mixing.weight
            owner = np.arange(self.n) // m
            used = weight != 0
            # rows other processes need from me, and rows I need from them (one message per peer)
            send, needed = [], sorted({int(j) for j in index[:, lo:hi][used[:, lo:hi]] if not lo <= j < hi})
            for q in range(self.world):
                if q != self.rank:
                    cols = slice(q * m, (q + 1) * m)
                    rows = sorted({int(j) for j in index[:, cols][used[:, cols]] if lo <= j < hi})
                    if rows:
                        send.append((q, torch.tensor(rows, device=device) - lo))
            recv = [(int(p), [j for j in needed if owner[j] == p]) for p in sorted({int(owner[j]) for j in needed})]
            position = np.full(self.n, -1, dtype=np.int64)
            position[lo:hi] = np.arange(m)
            position[needed] = m + np.arange(len(needed))  # peers ascending, rows ascending: recv's order
            local = position[index[:, lo:hi]]
            local = np.where(local < 0, np.arange(m)[None, :], local)  # weight-0 slots: any row, use self
            return torch.tensor(local, device=device), send, recv
        return mixing.plan(("dist", self.rank, self.world, device), build)

    def _gossip_plan(self, mixing: Mixing, like: torch.Tensor) -> tuple:
        """(index into [own rows; received rows], weight [K, m, 1] in like's dtype)."""
        def build():
            local, _, _ = self._neighbour_plan(mixing, like.device)
            lo, hi = self.rows.start, self.rows.stop
            return local, torch.tensor(mixing.weight[:, lo:hi]).to(like).unsqueeze(-1)
        return mixing.plan(("dist", self.rank, self.world, like.dtype, like.device), build)
