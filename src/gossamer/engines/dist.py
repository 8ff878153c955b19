"""The torch.distributed engine: P processes, each holding a contiguous block of n/P worker rows.

Process r holds the global workers ``rows = range(r·m, (r+1)·m)``, m = n/P, as the local rows
[m, d] of X. Every operator has the simulator's semantics (``engines/sim.py``) and the simulator's
communication accounting in ``comm`` (so ``summary.json`` matches), and moves only what a real
network must move:

- ``allreduce_mean_``: one ``all_reduce`` of the local row sum (d values), divided by n;
- ``block_mean_``: a block inside one process needs nothing; a block spanning processes is an
  ``all_reduce`` over a process subgroup (created once per block size, in the same order on every
  rank, as ``dist.new_group`` requires);
- ``gossip_``: the rows that neighbours need, point to point (``batch_isend_irecv``, one message
  per peer process), then the simulator's combine ``mix_rows`` with source = own rows followed by
  the received rows; ``sent`` counts what this process actually sent;
- ``sign_mean``: packed 1-bit signs plus per-tensor scales, all-gathered in the group;
- ``consensus_distance_sq``, ``mean_row``, ``mean_scalar``: an all-reduce of the row sum (x̄) and
  an all-gather of one scalar per worker, averaged in global worker order (as the simulator does).

Failures: every collective waits at most ``timeout`` seconds. A heartbeat thread writes to the
rendezvous store, so that when a collective fails (a peer died: its connections close at once;
or it stopped answering: the wait times out) the engine raises :class:`PeerLost` with one line
naming the rank that is gone.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from dataclasses import dataclass
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from ..topology import Mixing
from .comm import CommStats, mix_rows


class PeerLost(RuntimeError):
    """A process died or stopped answering; ``str(e)`` is one line naming the lost rank."""

    def __init__(self, message: str, ranks: list[int]):
        super().__init__(message)
        self.ranks = ranks


class Terminated(BaseException):
    """SIGTERM arrived (torchrun stops the other processes when one fails)."""


@contextlib.contextmanager
def on_sigterm_raise():
    """Within the block, SIGTERM raises :class:`Terminated` in the main thread (instead of dying
    silently), so the process can still say which peer was lost. A no-op outside the main thread."""
    def handler(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: the verdict must not be interrupted
        raise Terminated()
    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@dataclass
class WireStats:
    """What this process actually sent point to point (gossip): messages, values, bytes."""

    messages: int = 0
    values: int = 0
    bytes: int = 0

    def per_worker(self, m: int) -> dict[str, float]:
        return {"messages": self.messages / m, "values": self.values / m, "bytes": self.bytes / m}


def env_rank() -> int:
    """This process's rank: from the process group if there is one, else torchrun's RANK (0)."""
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else int(os.environ.get("RANK", 0))


def env_world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else int(os.environ.get("WORLD_SIZE", 1))


def resolve_backend(name: str, device: torch.device) -> str:
    """auto: NCCL for CUDA tensors, gloo otherwise."""
    if name == "auto":
        return "nccl" if device.type == "cuda" else "gloo"
    if name == "nccl" and device.type != "cuda":
        raise ValueError("dist_backend 'nccl' needs device=cuda; use dist_backend=gloo (or auto) on CPU")
    return name


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0][:200] if text else type(e).__name__


class DistEngine:
    """The worker rows of this process (n/P of n) and the operators of :class:`SimEngine` over P processes.

    Joins the default process group if one exists (library use), else creates it from torchrun's
    environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) with ``backend`` and ``timeout``;
    :meth:`close` destroys only a group it created.
    """

    def __init__(self, n: int, backend: str = "auto", timeout: float = 60.0, device: torch.device | str = "cpu"):
        world = env_world_size()
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
                dist.init_process_group(resolve_backend(backend, self.device), timeout=self._op_timeout)
            except (RuntimeError, ValueError) as e:  # rendezvous failed or timed out
                raise PeerLost(f"could not form the process group of {world} processes within "
                               f"{self.timeout:g} s: {_first_line(e)}", []) from None
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.n, self.m = n, n // self.world
        self.rows = range(self.rank * self.m, (self.rank + 1) * self.m)
        self.comm = CommStats()  # what the simulator counts: summary.json is the same on both engines
        self.sent = WireStats()  # what this process actually sent point to point
        self._gossip_plans: dict[tuple, tuple] = {}
        self._block_plans: dict[int, list] = {}
        self._broken = False
        self._watch = _Watchdog(self.rank, self.world, self._beat_interval, self._window)

    # ------------------------------------------------------------------ operators (SimEngine's)

    def allreduce_mean_(self, X: torch.Tensor) -> None:
        """Exact average: every row becomes mean_i X_i (in place)."""
        total = X.sum(0)
        self._run("all-reduce", lambda: dist.all_reduce(total, async_op=True))
        X.copy_((total / self.n).expand_as(X))
        self.comm.allreduce(X.shape[1], self.n, level="global")

    def block_mean_(self, X: torch.Tensor, block_size: int) -> None:
        """Exact average inside each block of ``block_size`` consecutive global workers (in place)."""
        for local, group in self._blocks(block_size):
            part = X[local]
            if group is None:  # the whole block is here
                part.copy_(part.mean(0, keepdim=True).expand_as(part))
            else:
                total = part.sum(0)
                self._run("block all-reduce", lambda: dist.all_reduce(total, group=group, async_op=True))
                part.copy_((total / block_size).expand_as(part))
        self.comm.allreduce(X.shape[1], block_size, level="block")

    def gossip_(self, X: torch.Tensor, mixing: Mixing, measure: bool = False) -> float | None:
        """One gossip round X ← W X (in place): receive the rows this block's workers mix in.

        With ``measure``, returns Θ² = (1/n) Σ_i ‖Σ_j w_ij x_j − x_i‖² (one scalar per worker gathered)."""
        index, weight, send, recv, peers = self._gossip_plan(mixing, X)
        received = [torch.empty(len(rows), X.shape[1], dtype=X.dtype, device=X.device) for _, rows in recv]
        outgoing = [X.index_select(0, rows) for _, rows in send]
        ops = [dist.P2POp(dist.isend, buf, peer) for (peer, _), buf in zip(send, outgoing)]
        ops += [dist.P2POp(dist.irecv, buf, peer) for (peer, _), buf in zip(recv, received)]
        if ops:
            self._run("gossip exchange", lambda: dist.batch_isend_irecv(ops),
                      peers=sorted({p for p, _ in send} | {p for p, _ in recv}))
        mixed = mix_rows(torch.cat([X, *received]) if received else X, index, weight)
        theta_sq = self.mean_scalar((mixed - X).square().sum(1)) if measure else None
        X.copy_(mixed)
        self.comm.gossip(X.shape[1], peers)
        self.sent.messages += len(outgoing)
        self.sent.values += sum(b.numel() for b in outgoing)
        self.sent.bytes += sum(b.numel() * b.element_size() for b in outgoing)
        return theta_sq

    def sign_mean(self, message, numels: list[int], block_size: int | None = None) -> torch.Tensor:
        """Rows of this process ← mean of the decompressed sign messages of each row's group
        (all n workers, or its block). Signs travel packed, 8 to a byte, with the scales."""
        from ..compression import SignMessage, pack_bits, sign_decompress, unpack_bits

        size = block_size or self.n
        d, T = message.positive.shape[1], message.scales.shape[1]
        packed = pack_bits(message.positive)
        scales = message.scales.contiguous()
        payload = torch.cat([packed, scales.view(torch.uint8).view(self.m, -1)], 1)
        out = torch.empty(self.m, d, dtype=scales.dtype, device=scales.device)
        for local, group, counts in self._blocks(size, with_counts=True):
            if group is None:
                rows = payload[local]
            else:  # gather every member's rows of this block (padded to the largest share)
                pad = max(counts)
                mine = torch.zeros(pad, payload.shape[1], dtype=torch.uint8, device=payload.device)
                mine[: local.stop - local.start] = payload[local]
                parts = [torch.empty_like(mine) for _ in counts]
                self._run("sign all-gather", lambda: dist.all_gather(parts, mine, group=group, async_op=True))
                rows = torch.cat([p[:c] for p, c in zip(parts, counts)])
            k = rows.shape[0]
            nb = packed.shape[1]
            got = SignMessage(unpack_bits(rows[:, :nb].contiguous(), d),
                              rows[:, nb:].contiguous().view(scales.dtype).view(k, T))
            out[local] = sign_decompress(got, numels).mean(0, keepdim=True)
        self.comm.allgather(message.nbytes, size, level="block" if block_size else "global")
        return out

    def mean_row(self, X: torch.Tensor) -> torch.Tensor:
        """x̄ = (1/n) Σ_i x_i over all processes, without changing X."""
        total = X.sum(0)
        if total.numel():
            self._run("all-reduce", lambda: dist.all_reduce(total, async_op=True))
        return total / self.n

    def consensus_distance_sq(self, X: torch.Tensor) -> float:
        """Ξ² = (1/n) Σ_i ‖x_i − x̄‖²: an all-reduce of d values and one scalar per worker."""
        return self.mean_scalar((X - self.mean_row(X)).square().sum(1))

    def distance_sq_per_tensor(self, X: torch.Tensor, slots) -> dict[str, float]:
        """Ξ² restricted to each parameter tensor (the per-layer consensus distance): one more all-reduce."""
        per_coordinate = (X - self.mean_row(X)).square().sum(0)
        self._run("all-reduce", lambda: dist.all_reduce(per_coordinate, async_op=True))
        per_coordinate /= self.n
        return {s.name: per_coordinate[s.offset : s.offset + s.numel].sum().item() for s in slots}

    def mean_scalar(self, values: torch.Tensor) -> float:
        """Mean over all n workers of a per-worker scalar (local values [m]), summed in worker order."""
        return self.gather_rows(values.to(self.device), everywhere=True).mean().item()

    # ------------------------------------------------------------------ helpers for the CLI and the library

    def gather_rows(self, T: torch.Tensor, everywhere: bool = False) -> torch.Tensor | None:
        """The full [n, ...] tensor of a local [m, ...] one, in worker order: on rank 0 (or every rank)."""
        T = T.contiguous()
        parts = [torch.empty_like(T) for _ in range(self.world)]
        if everywhere:
            self._run("all-gather", lambda: dist.all_gather(parts, T, async_op=True))
            return torch.cat(parts)
        gather_list = parts if self.rank == 0 else None
        self._run("gather", lambda: dist.gather(T, gather_list, dst=0, async_op=True))
        return torch.cat(parts) if self.rank == 0 else None

    def gather_state(self, state):
        """A checkpoint state with every local-row tensor [m, ...] gathered to the full [n, ...] on rank 0
        (None elsewhere); other values are kept. Every rank must call it."""
        def walk(value):
            if isinstance(value, torch.Tensor) and value.dim() >= 1 and value.shape[0] == self.m:
                return self.gather_rows(value)
            if isinstance(value, dict):
                return {k: walk(v) for k, v in value.items()}
            if isinstance(value, (list, tuple)):
                return type(value)(walk(v) for v in value)
            return value
        full = walk(state)
        return full if self.rank == 0 else None

    def agree(self, build):
        """Run ``build()`` on every rank; if it raised a ValueError on any rank, raise the first such
        error on every rank (so all ranks fail alike, exit 2). Returns build()'s result."""
        try:
            result, error = build(), None
        except ValueError as e:
            result, error = None, str(e)
        errors: list = [None] * self.world
        self._run("agreement", lambda: dist.all_gather_object(errors, error))
        first = next((e for e in errors if e), None)
        if first:
            raise ValueError(first)
        return result

    def broadcast_(self, X: torch.Tensor, src: int = 0) -> None:
        """Every rank's X ← rank src's X (in place)."""
        self._run("broadcast", lambda: dist.broadcast(X, src, async_op=True))

    def lost(self, what: str, peers: list[int] | None = None) -> PeerLost:
        """The :class:`PeerLost` for a failed operation: which rank is gone, in one line."""
        self._broken = True
        ranks = self._watch.verdict(peers, self.timeout)
        who = (f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}") if ranks \
            else "a peer (could not tell which)"
        return PeerLost(f"rank {self.rank}: lost {who} of {self.world} ({what}): the process died or did not "
                        f"answer within dist_timeout={self.timeout:g} s; stopping", ranks)

    def close(self) -> None:
        """Stop the heartbeat; destroy the process group if this engine created it (and it is healthy)."""
        self._watch.stop(orderly=not self._broken)
        if self._owns_group and not self._broken and dist.is_initialized():
            dist.destroy_process_group()

    # ------------------------------------------------------------------ internals

    def _run(self, what: str, start, peers: list[int] | None = None) -> None:
        """Start a communication op and wait for it at most the op timeout; failures → PeerLost."""
        self._watch.ops += 1
        try:
            work = start()
            works = work if isinstance(work, list) else [work] if work is not None else []
            for w in works:
                w.wait(self._op_timeout)
        except PeerLost:
            raise
        except RuntimeError as e:  # DistBackendError, timeouts, closed connections
            if os.environ.get("GOSSAMER_DEBUG"):
                raise
            raise self.lost(f"{what} failed", peers) from e

    def _blocks(self, size: int, with_counts: bool = False) -> list:
        """For each block of ``size`` consecutive workers that holds rows of this process:
        (local slice, process subgroup or None when the block lies inside this process[, rows per member]).

        Every rank creates the subgroups of all spanning blocks, in block order, on first use."""
        if size not in self._block_plans:
            if self.n % size:
                raise ValueError(f"block_size {size} must divide workers {self.n}")
            plan = []
            for first in range(0, self.n, size):
                last = first + size - 1
                owners = list(range(first // self.m, last // self.m + 1))
                counts = [min(last, (p + 1) * self.m - 1) - max(first, p * self.m) + 1 for p in owners]
                group = None
                if len(owners) > 1:
                    group = dist.group.WORLD if len(owners) == self.world else self._new_group(owners)
                if self.rank in owners:
                    lo, hi = max(first, self.rows.start), min(last + 1, self.rows.stop)
                    plan.append((slice(lo - self.rows.start, hi - self.rows.start), group, counts))
            self._block_plans[size] = plan
        plan = self._block_plans[size]
        return plan if with_counts else [(s, g) for s, g, _ in plan]

    def _new_group(self, ranks: list[int]):
        try:
            return dist.new_group(ranks, timeout=self._op_timeout)
        except RuntimeError as e:
            raise self.lost("creating a process subgroup failed") from e

    def _gossip_plan(self, mixing: Mixing, like: torch.Tensor) -> tuple:
        """(index into [own rows; received rows], weight, [(peer, rows to send)], [(peer, rows to receive)],
        the simulator's messages per worker), cached per mixing."""
        key = (id(mixing), like.dtype, like.device)
        if key not in self._gossip_plans:
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
                        send.append((q, torch.tensor(rows, device=like.device) - lo))
            recv = [(int(p), [j for j in needed if owner[j] == p]) for p in sorted({int(owner[j]) for j in needed})]
            position = np.full(self.n, -1, dtype=np.int64)
            position[lo:hi] = np.arange(m)
            position[needed] = m + np.arange(len(needed))  # peers ascending, rows ascending: recv's order
            local = position[index[:, lo:hi]]
            local = np.where(local < 0, np.arange(m)[None, :], local)  # weight-0 slots: any row, use self
            self._gossip_plans[key] = (torch.tensor(local, device=like.device),
                                       torch.tensor(weight[:, lo:hi]).to(like).unsqueeze(-1),
                                       send, recv, mixing.messages_per_worker(), mixing)
        return self._gossip_plans[key][:5]


class _Watchdog:
    """Heartbeats in the rendezvous store: when an operation fails, whose heartbeat stopped names the lost rank.

    Each rank's thread writes ``hb/RANK = "beat ops"`` every ``interval`` seconds through its own
    store connection. The verdict of the first rank to judge is stored, so every survivor names the
    same rank; ranks that stop deliberately mark ``exit/RANK`` so that they are not blamed.
    """

    def __init__(self, rank: int, world: int, interval: float, window: float):
        self.rank, self.world, self.interval, self.window = rank, world, interval, window
        self.ops = 0
        self.store = self._connect()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = None
        if self.store is not None and world > 1:
            self._beat(0)
            self._thread = threading.Thread(target=self._loop, name="gossamer-heartbeat", daemon=True)
            self._thread.start()

    def _connect(self):
        host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
        if not (host and port):
            try:  # a group initialised some other way: the TCPStore it was built from
                base = dist.distributed_c10d._get_default_store()
                while hasattr(base, "underlying_store"):
                    base = base.underlying_store
                host, port = base.host, base.port
            except Exception:
                return None
        try:
            store = dist.TCPStore(host, int(port), is_master=False, wait_for_workers=False,
                                  timeout=timedelta(seconds=max(2.0, 2 * self.window)))
        except Exception:
            return None
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        return dist.PrefixStore(f"gossamer/{attempt}/", store)

    def _beat(self, beat: int) -> None:
        with self._lock:
            self.store.set(f"hb/{self.rank}", f"{beat} {self.ops}")

    def _loop(self) -> None:
        beat = 0
        while not self._stop.wait(self.interval):
            beat += 1
            try:
                self._beat(beat)
            except Exception:
                return  # the store is gone; the main thread will find out

    def _read(self, key: str) -> str | None:
        with self._lock:
            return self.store.get(key).decode() if self.store.check([key]) else None

    def verdict(self, peers: list[int] | None, timeout: float) -> list[int]:
        """The ranks that are gone: agreed with the other survivors through the store."""
        if self.store is None:
            return list(peers or [])
        others = [r for r in range(self.world) if r != self.rank]
        try:
            decided = self._read("lost")
            if decided is None:
                first = {r: self._read(f"hb/{r}") for r in others}
                time.sleep(self.window)
                decided = self._read("lost")
            if decided is None:
                last = {r: self._read(f"hb/{r}") for r in others}
                exited = {r for r in others if self._read(f"exit/{r}") is not None}
                silent = [r for r in others if first[r] == last[r] and r not in exited]
                if not silent:  # all alive: blame whoever is behind us in the sequence of operations
                    behind = [r for r in others if last[r] and int(last[r].split()[1]) < self.ops]
                    silent = behind or [r for r in (peers or []) if r not in exited]
                with self._lock:
                    decided = self.store.compare_set("lost", "", ",".join(map(str, silent))).decode()
            self._stop.set()  # no more heartbeats: the store may go away once every survivor has judged
            if self._thread is not None:
                self._thread.join(timeout=2 * self.interval + 1)
            with self._lock:
                self.store.set(f"exit/{self.rank}", "lost")
            lost = [int(r) for r in decided.split(",") if r]
            if self.rank == 0:  # the store may live here: wait until the other survivors have read the verdict
                waiting = [r for r in others if r not in lost]
                deadline = time.monotonic() + timeout
                while waiting and time.monotonic() < deadline:
                    waiting = [r for r in waiting if self._read(f"exit/{r}") is None]
                    time.sleep(0.05)
            return lost
        except Exception:  # the store itself is gone: it lived with rank 0 (or the torchrun agent)
            return [0] if self.rank != 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" else []

    def stop(self, orderly: bool = True) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * self.interval + 1)
