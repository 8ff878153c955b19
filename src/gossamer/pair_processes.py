"""AD-PSGD on real processes, and its replay (the rules: :mod:`gossamer.algorithms.pair_events`).

Under torchrun, P = n + 1 processes: rank ``server_rank`` is the coordinator, the others workers.
Messages, point to point over gloo, each on its own tag:

- worker → coordinator (``REQUEST``): [0, j (−1: no neighbour), k] asks for the pair (i, j) of its
  k-th event; [1, 0, 0] says its event is done (the pair is released);
- coordinator → worker (``GRANT``): [s] the pair is granted as event s, [−1] stop;
- coordinator → the passive worker's thread (``PASSIVE``): [i] average with i, [−1] stop;
- i → j (``MODEL``) and j → i (``REPLY``): the models x_i, x_j (d values each), both taken before
  either averages;
- worker → coordinator (``FINAL``): its model when the run ends, then the bytes it sent.

Every process counts the bytes it hands ``dist.send``; the summary's ``wire_bytes_sent`` is their
sum (the coordinator's and every worker's, the final models and counts left out).

The coordinator grants the first n·T requests (T loop steps of n events) and answers the rest
with a stop; then it stops the passive threads, collects the final models and writes the run
directory: config.yaml, ``events.jsonl`` (a header as async-local-sgd's, then one line per
granted event: ``{"event": s, "i": i, "j": j, "k": k, "wall": seconds}``), ``models.pt`` (the final
x_i, [n, d]) and summary.json (x̄'s test metrics and Ξ² of the final models; the rows come from
``gossamer train --replay``, whose final models equal ``models.pt`` bit for bit).
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections import deque
from pathlib import Path

import torch
import torch.distributed as dist

from .algorithms.pair_events import PairReplay, PairWorker, average_
from .async_processes import LOG, LOG_FORMAT, gather_errors, log_lines, one_row_run, process_group, threads_of
from .data import load_dataset
from .engines import SimEngine
from .engines.dist import agree, first_line
from .engines.failures import PeerLost
from .network import Speeds
from .registry import ConfigError, short
from .rundir import RunDir, RunLock
from .runner import train_into
from .train import Batches, Run, build_run, evaluate, lr_at

REQUEST, GRANT, PASSIVE, MODEL, REPLY, FINAL = range(1, 7)  # the tags
MODELS = "models.pt"
STOP = -1


def pair_worker(run: Run, w: int, sleeps: bool) -> PairWorker:
    cfg = run.cfg
    return PairWorker(run, w, lambda k: lr_at(cfg, k, run.steps_per_epoch), Batches(run),
                      Speeds.of(cfg) if sleeps else None)


def run_pairs(cfg, out: Path, overwrite: bool, progress: bool, resume: bool, lock: RunLock | None) -> dict:
    """This process's part: the summary on the coordinator, {} on a worker."""
    if resume:
        raise ConfigError("--resume: ad-psgd on processes does not continue a run (its workers' state lives in "
                          "their processes); train it again")
    with process_group(cfg) as ranks:
        if dist.get_rank() == cfg.server_rank:
            return _coordinate(cfg, out, overwrite, lock, ranks)
        _work(cfg, ranks.index(dist.get_rank()), ranks)
        return {}


def _lost(who: str, e: BaseException, ranks: list[int]) -> PeerLost:
    return PeerLost(f"rank {dist.get_rank()}: lost {who}: {first_line(e)}; stopping", ranks)


def _work(cfg, w: int, ranks: list[int]) -> None:
    """Worker w: its gradients and events (main thread), its passive averages (a thread)."""
    me = pair_worker(agree(lambda: one_row_run(cfg, w), gather_errors), w, sleeps=True)
    coordinator, guard = cfg.server_rank, threading.Lock()
    sent, failed = [0, 0], []  # bytes sent by the main thread and by the passive one; a failure of the latter

    def send(tensor: torch.Tensor, dst: int, tag: int, by: int) -> None:
        dist.send(tensor, dst, tag=tag)
        sent[by] += tensor.numel() * tensor.element_size()

    def passive() -> None:
        notice = torch.empty(1, dtype=torch.float64)
        theirs = torch.empty_like(me.model)
        try:
            while True:
                dist.recv(notice, coordinator, tag=PASSIVE)
                if notice[0] == STOP:
                    return
                peer = ranks[int(notice[0])]
                with guard:
                    dist.recv(theirs, peer, tag=MODEL)
                    send(me.model.contiguous(), peer, REPLY, by=1)
                    average_(me.model, theirs)
        except RuntimeError as e:  # a peer died: the main thread tells it, in one line
            failed.append(e)

    thread = threading.Thread(target=passive, name="passive averages", daemon=True)
    thread.start()
    message, grant = torch.zeros(3, dtype=torch.float64), torch.empty(1, dtype=torch.float64)
    theirs = torch.empty_like(me.model)
    try:
        while not failed:
            me.compute()
            j = me.partner()
            message[:] = torch.tensor([0.0, -1.0 if j is None else j, me.count])
            send(message, coordinator, REQUEST, by=0)
            dist.recv(grant, coordinator, tag=GRANT)
            if grant[0] == STOP:
                break
            with guard:
                if j is not None:
                    send(me.model.contiguous(), ranks[j], MODEL, by=0)
                    dist.recv(theirs, ranks[j], tag=REPLY)
                me.event(None if j is None else theirs)
            message[:] = torch.tensor([1.0, 0.0, 0.0])
            send(message, coordinator, REQUEST, by=0)
        thread.join()
        if failed:
            raise failed[0]
        dist.send(me.model.contiguous(), coordinator, tag=FINAL)
        dist.send(torch.tensor([float(sum(sent))], dtype=torch.float64), coordinator, tag=FINAL)
    except RuntimeError as e:
        raise _lost(f"a peer of worker {w}", e, []) from None


class Coordinator:
    """The grants (module docstring): which workers are in a pair, the requests waiting, the log."""

    def __init__(self, cfg, ranks: list[int], total: int, log):
        self.ranks, self.total, self.log, self.timeout = ranks, total, log, cfg.dist_timeout
        n = len(ranks)
        self.busy, self.partner = [False] * n, [None] * n
        self.waiting: deque[tuple[int, int | None, int]] = deque()
        self.stopped: set[int] = set()
        self.granted = self.pairs = 0  # events, and those with a pair average
        self.sent = 0  # bytes the coordinator sent
        self.arrivals: queue.Queue = queue.Queue()
        self.started = time.perf_counter()
        for w in range(n):
            self._listen(w)

    def _listen(self, w: int) -> None:
        """A thread receives w's next message."""
        def receive():
            message = torch.empty(3, dtype=torch.float64)
            try:
                dist.recv(message, self.ranks[w], tag=REQUEST)
                self.arrivals.put((w, message, None))
            except RuntimeError as e:
                self.arrivals.put((w, None, e))
        threading.Thread(target=receive, name=f"requests of worker {w}", daemon=True).start()

    def run(self) -> None:
        """Grant until every worker is stopped and no pair is open."""
        while len(self.stopped) < len(self.ranks) or any(self.busy):
            try:
                w, message, error = self.arrivals.get(timeout=self.timeout)
            except queue.Empty:
                raise PeerLost(f"coordinator (rank {dist.get_rank()}): no worker spoke within "
                               f"dist_timeout={self.timeout:g} s; stopping", []) from None
            if error is not None:
                raise _lost(f"worker {w} (rank {self.ranks[w]})", error, [self.ranks[w]])
            if message[0] == 1:  # done: the pair is released
                j = self.partner[w]
                self.busy[w] = False
                if j is not None:
                    self.busy[j] = False
                self._listen(w)
            else:
                self.waiting.append((w, None if message[1] < 0 else int(message[1]), int(message[2])))
            self._grant()

    def _grant(self) -> None:
        """Every waiting request that can go, in arrival order (both workers free); past the run's
        events, a stop."""
        for request in list(self.waiting):
            i, j, k = request
            if self.granted >= self.total:
                self.waiting.remove(request)
                self._send(i, STOP, GRANT)
                self.stopped.add(i)
            elif not self.busy[i] and (j is None or not self.busy[j]):
                self.waiting.remove(request)
                self.busy[i], self.partner[i] = True, j
                self.log.write(json.dumps({"event": self.granted, "i": i, "j": j, "k": k,
                                           "wall": round(time.perf_counter() - self.started, 6)}) + "\n")
                self.granted += 1
                if j is not None:
                    self.busy[j] = True
                    self.pairs += 1
                    self._send(j, i, PASSIVE)
                self._send(i, self.granted - 1, GRANT)
                self._listen(i)

    def _send(self, w: int, value: float, tag: int) -> None:
        message = torch.tensor([float(value)], dtype=torch.float64)
        try:
            dist.send(message, self.ranks[w], tag=tag)
        except RuntimeError as e:
            raise _lost(f"worker {w} (rank {self.ranks[w]})", e, [self.ranks[w]]) from None
        self.sent += message.numel() * message.element_size()

    def finish(self, like: torch.Tensor) -> tuple[torch.Tensor, int]:
        """Stop the passive threads; the final models [n, d] and the bytes every process sent."""
        for w in range(len(self.ranks)):
            self._send(w, STOP, PASSIVE)
        models = torch.empty(len(self.ranks), *like.shape[1:], dtype=like.dtype)
        sent, count = self.sent, torch.empty(1, dtype=torch.float64)
        for w, r in enumerate(self.ranks):
            try:
                dist.recv(models[w : w + 1], r, tag=FINAL)
                dist.recv(count, r, tag=FINAL)
            except RuntimeError as e:
                raise _lost(f"worker {w} (rank {r})", e, [r]) from None
            sent += int(count[0])
        return models, sent


def _coordinate(cfg, out: Path, overwrite: bool, lock: RunLock | None, ranks: list[int]) -> dict:
    def build():
        run = build_run(cfg, SimEngine(cfg.workers))
        return run, RunDir(out, overwrite, cfg.logger, lock=lock, extra=(LOG, MODELS))
    run, run_dir = agree(build, gather_errors)
    start, total = time.perf_counter(), cfg.epochs * run.steps_per_epoch
    try:
        run_dir.write_config(cfg)
        with open(run_dir.dir / LOG, "w", buffering=1) as log:
            log.write(json.dumps({"log": LOG_FORMAT, "config": cfg.to_dict(), "processes": len(ranks) + 1,
                                  "server_rank": cfg.server_rank, "threads": torch.get_num_threads()}) + "\n")
            coordinator = Coordinator(cfg, ranks, cfg.workers * total, log)
            coordinator.run()
        X = run.workers.X
        models, sent = coordinator.finish(X)
        X.copy_(models.to(X.device))
        torch.save(X.cpu(), run_dir.dir / MODELS)
        summary = {**evaluate(run, total - 1), "final_consensus_distance_sq": run.engine.consensus_distance_sq(X),
                   "events": coordinator.granted, "comm_rounds": coordinator.pairs, "wire_bytes_sent": sent,
                   "steps": total,
                   "parameters": X.shape[1],
                   "wall_seconds": time.perf_counter() - start}
        run_dir.write_summary(summary)
        run_dir.publish()  # it writes no checkpoint: a run that replaces another one takes its place here
        return summary
    finally:
        run_dir.close()


def replay_pairs(cfg, source: Path, out: Path, overwrite: bool, progress: bool) -> dict:
    """Train ``cfg`` in this process on the events logged in run directory ``source`` into ``out``:
    the rows, and the final models, which must equal the processes' (``models.pt``)."""
    lines, where = log_lines(source, cfg), short(str(source))
    data = load_dataset(cfg)  # once: the run and every worker's are built from it
    run = build_run(cfg, SimEngine(cfg.workers), data=data)
    events = [e for e in lines[1:] if "event" in e]
    if len(events) < cfg.workers * cfg.epochs * run.steps_per_epoch:
        raise ConfigError(f"--replay '{where}': the event log ends after event {len(events)} of the "
                          f"{cfg.workers * cfg.epochs * run.steps_per_epoch} the run takes: the run stopped early")
    workers = [pair_worker(one_row_run(cfg, w, data), w, sleeps=False) for w in range(cfg.workers)]
    run.schedule = PairReplay(workers, events, where)
    with threads_of(lines[0]):
        summary = train_into(cfg, run, RunDir(out, overwrite, cfg.logger), out, progress, None)
    final = Path(source) / MODELS
    if final.is_file() and not torch.equal(torch.load(final, weights_only=True), run.workers.X.cpu()):
        raise ConfigError(f"--replay '{where}': the replay's final models differ from the processes' ({MODELS}): "
                          f"the log is not this run's")
    return summary
