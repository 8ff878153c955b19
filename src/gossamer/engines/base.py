"""What every engine shares: the public operators, their ledger entries, and the metric maths.

An engine holds some rows of the worker matrix (``rows``: their global worker indices; all n in
the simulator, a block of n/P in each of P processes) and moves data between workers. A subclass
implements only the primitives, each the minimum a real network must do:

- ``_groups_mean_(X, groups)``: the rows of each group's members ← their mean (others unchanged);
- ``_mixed(X, mixing)``: W X for the rows held here (neighbours' rows exchanged, then
  combined by :func:`combine`), into a buffer, X unchanged;
- ``_exchange(payload, mixing)``: each local worker's messages from the workers in its slots of
  W (its neighbours; slot 0 itself), [m, K, ...]: what a worker needs to keep copies of them;
- ``_all_gather(payload, groups)``: every member's message of each group (consecutive blocks,
  their members seated) that holds rows here;
- ``_rows_mean(T, workers, over)``: the mean of the rows of the given workers (global indices;
  None: all), on every process, the workers ``over`` (a group) taking part; ``over`` None: a
  bookkeeping read that no network would carry (an omniscient attacker's);
- ``_gather_scalars(values, over)``: one value per worker of the group ``over`` (the others' 0),
  all n in worker order;
- ``gather_rows(T)``: the full [n, ...] tensor of a local [m, ...] one, where the run is written;
- ``_any(flag)``: whether any process's flag is set (to stop or checkpoint together).

The group mean and the all-gather also start in the background (``async_op=True``, as
torch.distributed's collectives): ``_start_groups_mean(X, groups)`` and
``_start_all_gather(payload, groups)`` return a :class:`Work` that completes them; an engine
whose primitives are tensor ops completes them at once (the default), the dist engine launches
the collectives and waits where the result is consumed.

This base turns them into the operators that schedules call, records each in the ledger
``comm`` (:mod:`gossamer.engines.ledger`: what moved, from the operator's real inputs — the
tensors' sizes, the participants; the algorithm's traffic by level, measurement traffic apart;
an operator whose result an algorithm consumes is given its level, e.g. consensus control's
probes ``control``) and computes Ξ² and the other metrics once for every engine. The workers
taking part in a step (``alive``, with faults) are honoured by every operator: means and
all-gathers over their members, gossip over W with the others' edges dropped (``repair``), a
neighbour exchange with their links dropped, metrics over them. With Byzantine workers (``adversary``, :mod:`gossamer.byzantine`)
the all-reduce family's means and gossip rounds run the attack and the robust aggregator over
the same primitives (``_all_gather`` of the rows, ``_exchange`` with the neighbours), and the
metrics are over the honest workers. Engines know nothing of algorithms, codecs or files.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from ..byzantine import Adversary
from ..groups import Groups
from ..topology import Mixing, from_rows, keep_living
from .ledger import METRICS, REJOIN, SERVER, Ledger, Transfer, row_bytes


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


def fetch_mixing(n: int, worker: int, peers: np.ndarray) -> Mixing:
    """The matrix of a returning worker's fetch: row ``worker`` the mean of its k ``peers``' rows
    (1/k each), every other row e_i."""
    share = 1.0 / len(peers)
    return from_rows(n, [{i: 1.0} if i != worker else {worker: 0.0, **{int(j): share for j in peers}}
                         for i in range(n)])


class Work:
    """An operator started with ``async_op=True`` (torch.distributed's convention), completed by ``wait()``.

    ``wait()`` returns the result (the tensor averaged in place, or the :class:`Gathered`
    messages); until then what the operator writes is not defined. Waiting again returns the
    same result. Engines return one from ``allreduce_mean_``, ``groups_mean_`` and ``all_gather``.

    Args:
        finish (Callable[[], object]): completes the operator and returns its result.

    Example::

        >>> import torch
        >>> from gossamer.extend import Work
        >>> X = torch.ones(2)
        >>> work = Work(lambda: X.mul_(2))  # as an engine hands it back: finished in wait()
        >>> work.wait(), work.wait()
        (tensor([2., 2.]), tensor([2., 2.]))
    """

    def __init__(self, finish: Callable[[], object]):
        self._finish, self._result = finish, None

    @classmethod
    def done(cls, result) -> Work:
        """A work already complete, with ``result``."""
        work = cls(lambda: result)
        work.wait()
        return work

    def wait(self):
        if self._finish is not None:
            self._result, self._finish = self._finish(), None
        return self._result


@dataclass
class Gathered:
    """What ``engine.all_gather`` gives: the messages of every group that holds rows here.

    Args:
        messages (Tensor): [g, size, B], each group's seats in worker order.
        row_group (Tensor): [m], the group of each local row.
        member (Tensor | None): [g, size], which seats hold a member who sent (None: every seat;
            a gone worker sends nothing: its seat is zeros).

    Example::

        >>> import torch
        >>> from gossamer.extend import Gathered
        >>> gathered = Gathered(torch.tensor([[[1.0], [3.0]]]), row_group=torch.tensor([0, 0]))  # one group of 2
        >>> gathered.mean(lambda messages: messages)  # per local row, its group's mean of the decoded messages
        tensor([[2.],
                [2.]])
    """

    messages: torch.Tensor
    row_group: torch.Tensor
    member: torch.Tensor | None = None

    def per_group(self, combine) -> torch.Tensor:
        """Per local row, its group's messages combined: ``combine`` [g, size, B] → [g, d]; [m, d].
        Every seat must hold a member (a combine of its own reads all of them)."""
        if self.member is not None and not bool(self.member.all()):
            raise ValueError("this aggregate combines every member's message: a group with a gone member has none "
                             "to give (use a mean over the members, Gathered.mean)")
        return combine(self.messages)[self.row_group]

    def mean(self, decode) -> torch.Tensor:
        """Per local row, the mean over its group's members of the decoded messages: [m, d]."""
        g, size = self.messages.shape[:2]
        decoded = decode(self.messages.flatten(0, 1)).view(g, size, -1)
        if self.member is None:
            return decoded.mean(1)[self.row_group]
        member = self.member.to(decoded.dtype).unsqueeze(-1)
        return (decoded * member).sum(1).div_(member.sum(1).clamp(min=1))[self.row_group]


class Engine:
    """The worker rows held here and the communication operators over them: what a schedule's hooks are handed.

    Its operators (module docstring) record what they move in ``engine.comm`` and run alike on
    the simulator and on real processes; a plugin never builds one (the run does).

    Args:
        n (int): the workers.
        rows (range): the global indices of the rows held here.

    Example::

        >>> import torch, gossamer
        >>> from gossamer.extend import ALGORITHMS, Engine, Groups, Schedule
        >>> class Pairs(Schedule):  # exact means within the pairs (0, 1), (2, 3), ...; Ξ² read back
        ...     def after_step(self, engine: Engine, X, step):
        ...         engine.groups_mean_(X, Groups.blocks(engine.n, 2))
        ...         return {"xi_sq": engine.consensus_distance_sq(X, level="control")}
        >>> _ = ALGORITHMS.register("pairs", help="means within pairs")(lambda cfg, ctx: Pairs())
        >>> x, y = torch.randn(80, 40), torch.randint(0, 10, (80,))
        >>> result = gossamer.run({"algorithm": "pairs", "model": "mlp", "workers": 4, "epochs": 1, "batch_size": 8},
        ...                       data=gossamer.Data(train=(x[:64], y[:64]), test=(x[64:], y[64:])))
        >>> result.summary["comm_rounds_block"], result.rows[-1]["xi_sq"] > 0
        (2, True)
    """

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
        self._measured_rows: dict = {}  # device → the ids of the workers the metrics are over
        self.adversary = None  # Byzantine workers, their attack and the robust aggregator
        self.wire = None  # a WireTap (engines.wire): what this process hands torch.distributed, checked per transfer

    @property
    def adversary(self) -> Adversary | None:
        """The Byzantine workers, their attack and the honest workers' aggregator (None: all honest)."""
        return self._adversary

    @adversary.setter
    def adversary(self, adversary: Adversary | None) -> None:
        self._adversary = adversary
        self._measured_rows.clear()

    def set_alive(self, alive: np.ndarray | None,
                  repair: Callable[[Mixing, np.ndarray], Mixing] = keep_living) -> None:
        """The workers taking part from now on (bool [n]; None: all): every operator runs over
        them, and a gossip round over ``repair(W, alive)`` (default: their edges dropped, each
        living worker keeping the weight it gave a gone one)."""
        alive = None if alive is None or alive.all() else np.asarray(alive, dtype=bool)
        if not (alive is None and self.alive is None) and not np.array_equal(alive, self.alive):
            self._among.clear()
            self._measured_rows.clear()
        self.alive, self.repair = alive, repair

    def living(self, source: Groups | Mixing, repair: Callable[[Mixing, np.ndarray], Mixing] | None = None
               ) -> Groups | Mixing:
        """``source`` among the living workers (what an operator on it runs over): groups' gone
        members unseated, W repaired (by ``repair``, default the run's); itself when all are alive."""
        if self.alive is None:
            return source
        repair = repair or self.repair
        key = (id(source), repair)
        if key not in self._among or self._among[key][0] is not source:
            while len(self._among) >= 16:  # a step's few operators; static sources come back every step
                self._among.pop(next(iter(self._among)))
            living = source.among(self.alive) if isinstance(source, Groups) else repair(source, self.alive)
            self._among[key] = (source, living)
            self._among[(id(living), repair)] = (living, living)  # an operator handed the result runs it as it is
        return self._among[key][1]

    def _record(self, transfer: Transfer) -> None:
        """Count ``transfer`` (its primitive has just moved the data) and, with a wire tap, check
        what that primitive handed to torch.distributed against it."""
        self.comm.record(transfer)
        if self.wire is not None:
            self.wire.check(transfer)

    def _measured(self) -> np.ndarray | None:
        """The workers the metrics are over (bool [n]): the living honest ones; None: all."""
        honest = self.adversary.honest if self.adversary is not None and self.adversary.f else None
        if self.alive is None or honest is None:
            return self.alive if honest is None else honest
        return self.alive & honest

    def _measured_ids(self, over: Sequence[int] | None) -> Sequence[int] | None:
        """The workers a metric's mean is over: ``over`` (None: all), of them the living honest ones."""
        measured = self._measured()
        if measured is None:
            return over
        chosen = np.arange(self.n) if over is None else np.asarray(over, dtype=np.int64)
        return chosen[measured[chosen]].tolist() or over

    @property
    def m(self) -> int:
        return len(self.rows)

    # ------------------------------------------------------------------ the algorithm's traffic

    def groups_mean_(self, X: torch.Tensor, groups: Groups, level: str = "block",
                     async_op: bool = False) -> Work | None:
        """Exact average within each group (in place): the rows of its (living) members ← their
        mean, every other row unchanged. A ring all-reduce of d values within each group.
        ``async_op``: started, not finished — returns the :class:`Work` whose ``wait()`` completes
        it (X must not be read or written until then)."""
        groups = self.living(groups)
        work = self._start_groups_mean(X, groups) if async_op else self._groups_mean_(X, groups)
        self._record(Transfer("allreduce", row_bytes(X), level, groups=groups))
        return work

    def server_message(self, op: str, nbytes: int, worker: int, queued: float = 0.0) -> None:
        """A ``push`` (worker → parameter server) or ``pull`` (server → worker) of ``nbytes``, that
        ``worker`` waited ``queued`` seconds to start: recorded, level ``server``. The simulator
        holds every row, so the schedule moves the data (asynchronous local SGD)."""
        self._record(Transfer(op, nbytes, SERVER, groups=self._everyone, initiator=worker, queued=queued))

    def allreduce_mean_(self, X: torch.Tensor, site: str = "rows", async_op: bool = False) -> Work | None:
        """Exact average: every (living) row becomes the mean of the (living) rows, in place. With
        an adversary, the robust aggregate instead (``site``: which quantity X is, for an
        aggregator with a memory). ``async_op``: as :meth:`groups_mean_`'s (not with an adversary)."""
        if self.adversary is not None:
            if async_op:
                raise ValueError("allreduce_mean_: a robust aggregate is not started in the background (async_op)")
            self._robust_mean_(X, self.n, "global", site)
            return None
        return self.groups_mean_(X, self._everyone, level="global", async_op=async_op)

    def block_mean_(self, X: torch.Tensor, block_size: int, site: str = "rows") -> None:
        """Exact average inside each block of ``block_size`` consecutive workers (in place); with an
        adversary, the robust aggregate of each block."""
        if self.adversary is not None:
            self._robust_mean_(X, block_size, "block", site)
            return
        self.groups_mean_(X, self._block_groups_of(block_size), level="block")

    def _block_groups_of(self, block_size: int) -> Groups:
        if block_size not in self._block_groups:
            self._block_groups[block_size] = Groups.blocks(self.n, block_size)
        return self._block_groups[block_size]

    def _robust_mean_(self, X: torch.Tensor, size: int, level: str, site: str) -> None:
        """Every row ← the adversary's aggregate of its block's messages, the Byzantine ones crafted.
        The mean is an all-reduce of the messages (the attacker reads the honest rows' moments
        without a network: it is omniscient); a robust rule needs every message: an all-gather."""
        adversary = self.adversary
        groups = self._everyone if size == self.n else self._block_groups_of(size)
        if adversary.plain_mean:
            if adversary.crafts:
                adversary.craft_rows_(X, self.rows, size, lambda T, workers: self._rows_mean(T, workers, None))
            self.groups_mean_(X, groups, level)
            return
        if self.alive is not None:
            raise ValueError("a robust aggregator reads every worker's message: Byzantine workers do not run with faults")
        gathered = self._all_gather(X.contiguous(), groups)
        local = torch.arange(self.m, device=X.device)
        first = torch.full((gathered.messages.shape[0],), self.m, device=X.device).scatter_reduce_(
            0, gathered.row_group, local, "amin")  # a local row of each gathered block
        members = ((self.rows.start + first) // size * size).unsqueeze(1) + torch.arange(size, device=X.device)
        site = f"{level}/{site}"
        values = adversary.aggregate(gathered.messages, members, site, first)[gathered.row_group]
        X.copy_(values)
        adversary.keep_center(site, X, values)
        self._record(Transfer("allgather", row_bytes(X), level, groups=groups))

    def recorded_allreduce(self, d: int, value_bytes: int) -> None:
        """An all-reduce of d values of ``value_bytes`` each that ran outside the engine (DDP's, of
        the gradients, during the backward pass), recorded as the one :meth:`allreduce_mean_` runs."""
        self.comm.record(Transfer("allreduce", d * value_bytes, "global", groups=self.living(self._everyone),
                                  backward=True))

    def gossip_(self, X: torch.Tensor, mixing: Mixing, measure: bool = False,
                initiator: int | None = None) -> torch.Tensor | None:
        """One gossip round X ← W X (in place), W the mixing matrix of this round (repaired for
        the living workers). ``initiator``: a one-sided exchange that only that worker waits for
        (AD-PSGD's pair average; the ledger tells the clock).

        With ``measure``, returns each local row's ‖Σ_j w_ij x_j − x_i‖² [m]: what worker i can
        compute from the models it received (their mean is Θ², see :meth:`mean_scalar`). A round
        that averages exactly within groups (``mixing.groups``: ``groups:G``) runs as
        :meth:`groups_mean_` (without an adversary: with one, as the gossip round it is)."""
        if mixing.groups is not None and self.adversary is None:
            before = X.clone() if measure else None
            groups = mixing.plan("groups", lambda: Groups(self.n, mixing.groups.ravel(), mixing.groups.shape[1]))
            self.groups_mean_(X, groups, level="gossip")
            return None if before is None else before.sub_(X).square_().sum(1)
        mixing = self.living(mixing)
        mixed = self._mixed(X, mixing) if self.adversary is None else self._robust_mixed(X, mixing)
        change = X.sub_(mixed).square_().sum(1) if measure else None  # (x_i − Σ w_ij x_j)², in X's own storage
        X.copy_(mixed)
        self._record(Transfer("gossip", row_bytes(X), "gossip", mixing=mixing, initiator=initiator))
        return change

    def _robust_mixed(self, X: torch.Tensor, mixing: Mixing) -> torch.Tensor:
        """W X with the adversary: each local worker receives its neighbours' rows (the Byzantine
        ones crafted for it) and combines them with the robust aggregator."""
        senders, weight, receivers = mixing.plan(("byzantine", X.dtype, X.device, self.rows), lambda: (
            torch.as_tensor(mixing.index[:, self.rows.start : self.rows.stop].T.copy(), device=X.device),
            torch.as_tensor(mixing.weight[:, self.rows.start : self.rows.stop].T.copy()).to(X),
            torch.arange(self.rows.start, self.rows.stop, device=X.device)))
        return self.adversary.gossip(X, self._exchange(X, mixing), senders, weight, receivers)

    def exchange(self, payload: torch.Tensor, mixing: Mixing, nbytes: int | None = None) -> torch.Tensor:
        """Every worker's message (its row of ``payload`` [m, ...]: its bytes are what travels) to
        each worker that has it in a slot of W with a weight ≠ 0. Returns, per local worker i, the
        messages of the workers in its slots, [m, K, ...] (slot k: worker ``mixing.index[k, i]``;
        slot 0: i's own; a slot of weight 0 — padding, a link to a gone worker, whose links are
        dropped — receives nothing: zeros). Recorded as a gossip round of one message to each peer.

        ``nbytes`` (optional) is checked, not trusted: it must be the bytes of a row of ``payload``."""
        sent = row_bytes(payload)
        if nbytes is not None and nbytes != sent:
            raise ValueError(f"engine.exchange: nbytes={nbytes} but each worker's message (its row of the payload) is "
                             f"{sent} bytes, {sent - nbytes:+} more; leave nbytes out: the engine counts the tensors "
                             f"that move")
        mixing = self.living(mixing, keep_living)
        received = self._exchange(payload, mixing)
        unused = mixing.plan(("unused slots", payload.device, self.rows), lambda: _unused_slots(mixing, self.rows,
                                                                                             payload.device))
        if unused is not None:
            received[unused] = 0
        self._record(Transfer("gossip", sent, "gossip", mixing=mixing))
        return received

    def all_gather(self, payload: torch.Tensor, block_size: int | None = None,
                   async_op: bool = False) -> Gathered | Work:
        """Every (living) worker's message (its row of ``payload`` [m, B], e.g. a codec's bytes) to
        every (living) member of its group: all n workers, or its block of ``block_size``
        consecutive workers. A ring all-gather of one row's bytes. A gone worker receives nothing:
        what its rows of a combination of the messages hold is not defined. ``async_op``: started,
        not finished — returns the :class:`Work` whose ``wait()`` returns the messages."""
        size = block_size or self.n
        groups = self.living(self._everyone if size == self.n else self._block_groups_of(size))
        payload = payload.contiguous()
        gathered = self._start_all_gather(payload, groups) if async_op else self._all_gather(payload, groups)
        self._record(Transfer("allgather", row_bytes(payload), "block" if block_size else "global", groups=groups))
        return gathered

    def fetch_(self, tensors: list[torch.Tensor], worker: int, peers: np.ndarray) -> None:
        """A returning worker's fetch (faults' ``rejoin: neighbours``): its row of each of
        ``tensors`` (local rows [m, ...], one dtype) ← the mean of the rows of its ``peers`` (global
        indices), every peer sending it one message of all of them: a gossip round of
        :func:`fetch_mixing`, level ``rejoin``. Every process takes part."""
        tensors = [T for T in tensors if T[0].numel()]  # a model without buffers has none to send
        if len({T.dtype for T in tensors}) > 1:
            raise ValueError(f"fetch_: the tensors travel as one message of one dtype, got "
                             f"{sorted({str(T.dtype) for T in tensors})}")
        mixing = fetch_mixing(self.n, worker, peers)
        flat = [T.reshape(T.shape[0], -1) for T in tensors]
        joined = torch.cat(flat, 1)
        mixed = self._mixed(joined, mixing)
        if worker in self.rows:
            here = worker - self.rows.start
            for T, part in zip(tensors, mixed[here].split([f.shape[1] for f in flat])):
                T[here] = part.view(T.shape[1:])
        self._record(Transfer("gossip", row_bytes(joined), REJOIN, mixing=mixing))

    # ------------------------------------------------------------------ measurement (counted apart unless an algorithm reads it)

    def mean_row(self, X: torch.Tensor, level: str = METRICS) -> torch.Tensor:
        """x̄ = (1/n) Σ_i x_i over all (living, honest) workers, without changing X: an all-reduce of
        d values among the living (``level``: measurement, unless an algorithm reads it)."""
        everyone = self.living(self._everyone)
        measured = self._measured()
        if measured is not None and X.device not in self._measured_rows:
            self._measured_rows[X.device] = torch.as_tensor(np.flatnonzero(measured), device=X.device)
        mean = self._rows_mean(X, None if measured is None else self._measured_rows[X.device], everyone)
        self._record(Transfer("allreduce", row_bytes(X), level, groups=everyone))
        return mean

    def mean_scalar(self, values: torch.Tensor, over: Sequence[int] | None = None, level: str = METRICS) -> float:
        """Mean over all n workers (or the workers ``over``, global indices) of a per-worker scalar
        (local values [m]; a worker outside ``over`` gives any value), in worker order; of them,
        only the living honest ones. An all-gather of one value per living worker (``level``:
        measurement, unless an algorithm decides from it: consensus control's ``control``)."""
        everyone = self.living(self._everyone)
        gathered = self._gather_scalars(values, everyone)
        self._record(Transfer("allgather", values.element_size(), level, groups=everyone))
        over = self._measured_ids(over)
        return (gathered if over is None else gathered[list(over)]).mean().item()

    def consensus_distance_sq(self, X: torch.Tensor, level: str = METRICS) -> float:
        """Ξ² = (1/n) Σ_i ‖x_i − x̄‖² (over the living honest workers): x̄'s all-reduce and a scalar
        all-gather, at ``level`` (measurement, unless an algorithm decides from it)."""
        diff = torch.sub(X, self.mean_row(X, level), out=self._scratch_like(X))
        return self.mean_scalar(diff.square_().sum(1), level=level)

    def row_norms_sq(self, T: torch.Tensor) -> torch.Tensor:
        """‖t_i‖² of each local row of T [m, d] → [m], no traffic: squared in the scratch rows, not
        in an n × d temporary of its own."""
        return torch.square(T, out=self._scratch_like(T)).sum(1)

    def distance_sq_per_tensor(self, X: torch.Tensor, slots) -> dict[str, float]:
        """Ξ² restricted to each parameter tensor (the per-layer consensus distance)."""
        per_coordinate = self.mean_row(torch.sub(X, self.mean_row(X), out=self._scratch_like(X)).square_())
        return {s.name: per_coordinate[s.offset : s.offset + s.numel].sum().item() for s in slots}

    # ------------------------------------------------------------------ bookkeeping (not counted)

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

    def _all_gather(self, payload: torch.Tensor, groups: Groups) -> Gathered:
        raise NotImplementedError

    def _start_groups_mean(self, X: torch.Tensor, groups: Groups) -> Work:
        """``_groups_mean_`` started in the background; here: done at once."""
        self._groups_mean_(X, groups)
        return Work.done(X)

    def _start_all_gather(self, payload: torch.Tensor, groups: Groups) -> Work:
        """``_all_gather`` started in the background; here: done at once."""
        return Work.done(self._all_gather(payload, groups))

    def _rows_mean(self, T: torch.Tensor, workers: torch.Tensor | None, over: Groups | None) -> torch.Tensor:
        raise NotImplementedError

    def _gather_scalars(self, values: torch.Tensor, over: Groups) -> torch.Tensor:
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


def _unused_slots(mixing: Mixing, rows: range, device: torch.device) -> torch.Tensor | None:
    """Which of the local workers' slots but their own have weight 0 (bool [m, K]; None: none)."""
    unused = mixing.weight[:, rows.start : rows.stop].T == 0
    unused[:, 0] = False
    return torch.as_tensor(unused, device=device) if unused.any() else None
