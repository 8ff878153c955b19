"""Asynchronous local SGD on real processes, and its replay (``gossamer train --replay RUN_DIR``).

Under torchrun, P = n + 1 processes: rank ``server_rank`` runs the training loop with the server
schedule (:class:`~gossamer.algorithms.async_server.AsyncServer`) on its own view of the n
workers, writes the run directory and the event log ``events.jsonl``; every other rank is a
worker (:class:`~gossamer.algorithms.async_server.Worker`) that trains its own model alone.
Messages are point to point over gloo, staged through host memory: a push is
[loss, ‖∇f‖², g_w] (d + 2 values of the model's dtype), a pull [θ, v] (d + 1; v = −1: stop). The
server keeps one receive posted per worker and takes the pushes in the order it sees them
complete; the grace window is in wall seconds. After the last step it answers every worker with
a stop: a waiting one at once, a computing one after its next push (late: not applied).

The event log: a header line (the run's config, the processes, the server's rank), then one line
per event in the order the server took them (:mod:`gossamer.algorithms.async_server`), each with
its ``wall`` seconds since the server started. A replay trains the same config in this process:
the server's code on the logged order, each push computed by the worker's code on a one-row run
of its own, with the processes' intra-op threads (the header's ``threads``: a sum's order follows
the threads that share it); the rows equal the processes' bit for bit.

A run whose server died continues with ``--resume`` on new processes (:func:`cut_log`: the log
back to the server's checkpoint, then every worker rejoins). SIGINT or SIGTERM (torchrun sends
it to every process) stops the server after a step with a checkpoint, as any run; a worker waits
for the server's stop (a second signal interrupts it at once).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import threading
import time
from collections import deque
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from .algorithms import ALGORITHMS
from .algorithms.async_local import local_steps_of
from .algorithms.async_server import GONE, KINDS, PULL, PUSH, REJOIN, Event, Replay, Worker
from .checkpoint import config_differences
from .data import Dataset, load_dataset
from .engines import SimEngine
from .engines.dist import agree, attempt_store, first_line
from .engines.failures import PeerLost
from .network import Speeds
from .registry import ConfigError, short
from .rundir import RunDir, RunLock, write_atomic
from .runner import resumed_state, stop_on_signals, train_into
from .train import Batches, Run, build_run, lr_at

LOG = "events.jsonl"
LOG_FORMAT = "gossamer event log 1"
STOP = -1.0


def served(cfg) -> str | None:
    """How ``cfg`` runs on processes outside the lock-step loop: "push-pull" (a parameter server
    and its workers), "pairs" (workers in pairs a coordinator grants), None (the loop)."""
    return ALGORITHMS[cfg.algorithm].traits.get("server") if cfg.engine == "dist" else None


def worker(run: Run, w: int, sleeps: bool) -> Worker:
    """Worker w's side of ``run`` (a run whose engine holds row w alone)."""
    cfg = run.cfg
    return Worker(run, w, local_steps_of(cfg)[w], lambda k: lr_at(cfg, k, run.steps_per_epoch), Batches(run),
                  Speeds.of(cfg) if sleeps else None, cfg.inner_state == "reset")


def one_row_run(cfg, w: int, data: Dataset | None = None) -> Run:
    """Worker w's own run: its model, local optimizer and batches, on an engine holding its row
    (``data``: the data set as loaded, for a replay that builds every worker's; default: load it)."""
    return build_run(cfg, SimEngine(cfg.workers, rows=range(w, w + 1)), data=data)


def run_processes(cfg, out: Path, overwrite: bool, progress: bool, resume: bool, lock: RunLock | None) -> dict:
    """This process's part (module docstring): the summary on the server, {} on a worker."""
    with process_group(cfg) as ranks:
        if dist.get_rank() == cfg.server_rank:
            return _serve(cfg, out, overwrite, progress, lock, ranks, resume)
        with stop_on_signals():  # a signal stops the server after a step, and the server its workers
            _work(cfg, ranks.index(dist.get_rank()), resume)
        return {}


@contextlib.contextmanager
def process_group(cfg):
    """Within: the gloo group of the n workers and the server (or coordinator) at ``server_rank``;
    yields the workers' ranks (worker w is rank ranks[w]). The process count and the rank are
    checked first, the same way on every process."""
    world = int(os.environ.get("WORLD_SIZE", 1))
    if world != cfg.workers + 1:
        raise ConfigError(f"{cfg.algorithm} on engine dist runs workers + 1 processes (the workers and a "
                          f"{'server' if served(cfg) == 'push-pull' else 'coordinator'}): workers={cfg.workers} "
                          f"needs {cfg.workers + 1}, got {world}")
    if cfg.server_rank >= world:
        raise ConfigError(f"server_rank {cfg.server_rank} is out of range: the run has {world} processes "
                          f"(ranks 0-{world - 1})")
    timeout = timedelta(seconds=cfg.dist_timeout)
    dist.init_process_group("gloo", timeout=timeout, **attempt_store(timeout))
    try:
        yield [r for r in range(world) if r != cfg.server_rank]
    finally:
        dist.destroy_process_group()


def gather_errors(error: str | None) -> list:
    errors: list = [None] * dist.get_world_size()
    dist.all_gather_object(errors, error)
    return errors


def _serve(cfg, out: Path, overwrite: bool, progress: bool, lock: RunLock | None, ranks: list[int],
           resume: bool) -> dict:
    def build():
        run = build_run(cfg, SimEngine(cfg.workers))
        state = resumed_state(cfg, run, out) if resume else None
        return run, state, RunDir(out, overwrite, cfg.logger, resume_step=state and state["step"], lock=lock,
                                  extra=(LOG,))
    run, state, run_dir = agree(build, gather_errors)
    X = run.workers.X
    if state is not None:
        cut_log(run_dir.dir / LOG, state["schedule"]["recorded"], state["step"])
    with open(run_dir.dir / LOG, "a" if state else "w", buffering=1) as log:  # a line reaches the file at once
        if state is None:
            log.write(json.dumps({"log": LOG_FORMAT, "config": cfg.to_dict(), "processes": len(ranks) + 1,
                                  "server_rank": cfg.server_rank, "threads": torch.get_num_threads()}) + "\n")
        network = Network(ranks, cfg.grace_window, X.shape[1], X.dtype, X.device, cfg.dist_timeout, log,
                          rejoining=state is not None)
        run.schedule.events = network
        try:
            summary = train_into(cfg, run, run_dir, out, progress, state)
        except BaseException:
            with contextlib.suppress(Exception):  # the workers stop too; the run's own error is the one told
                network.finish()
            raise
        network.finish()
        return summary


def cut_log(path: Path, events: int, step: int) -> None:
    """The event log of a run resumed at ``step`` back to its header and the ``events`` its
    checkpoint had taken (what came after died with the server), then ``{"resume": step}``."""
    lines, kept, taken = path.read_text().splitlines(), [], 0
    for line in lines:
        entry = json.loads(line)
        if taken == events and (any(k in entry for k in KINDS) or "end" in entry):
            break
        taken += any(k in entry for k in KINDS)
        kept.append(line)
    kept.append(json.dumps({"resume": step}))
    write_atomic(path, lambda f: f.write("".join(line + "\n" for line in kept).encode()))


def _work(cfg, w: int, resume: bool) -> None:
    """Worker w's loop: a round, its push, its pull, until the server says stop (resumed: first
    its rejoin, θ and its step count)."""
    me = worker(agree(lambda: one_row_run(cfg, w), gather_errors), w, sleeps=True)
    X = me.run.workers.X
    push = torch.empty(X.shape[1] + 2, dtype=X.dtype)
    pull = torch.empty(X.shape[1] + 1, dtype=X.dtype)
    server = cfg.server_rank
    if resume:
        count = torch.empty(1, dtype=torch.float64)
        _exchange(lambda: (dist.recv(pull, server), dist.recv(count, server)), w, server)
        me.pull(pull[:-1].to(X.device).view(1, -1), rejoin=int(count[0]))
    while True:
        event = me.round()
        push[0], push[1] = event.loss, event.grad_norm_sq
        push[2:] = event.gradient[0]
        _exchange(lambda: (dist.send(push, server), dist.recv(pull, server)), w, server)
        if pull[-1] == STOP:
            return
        me.pull(pull[:-1].to(X.device).view(1, -1))


def _exchange(messages, w: int, server: int) -> None:
    """``messages()`` with the server; its death → :class:`PeerLost`, one line."""
    try:
        messages()
    except RuntimeError as e:
        raise PeerLost(f"worker {w} (rank {dist.get_rank()}): lost the server (rank {server}): {first_line(e)}; "
                       f"stopping", [server]) from None


def listen(arrivals: queue.Queue, w: int, inbox: torch.Tensor, src: int, tag: int = 0) -> None:
    """A thread receives ``inbox`` from rank ``src`` on ``tag`` and queues (w, tag, None), or (w,
    tag, the error) where the receive failed: gloo's receives complete only in ``wait``, so a
    process that waits on several workers at once waits in a thread per receive."""
    def receive():
        try:
            dist.recv(inbox, src=src, tag=tag)
            arrivals.put((w, tag, None))
        except RuntimeError as e:
            arrivals.put((w, tag, e))
    threading.Thread(target=receive, name=f"receive of worker {w}, tag {tag}", daemon=True).start()


class Network:
    """The server's events from real processes (module docstring); ``log`` gets every event. A
    thread per computing worker waits for its push (gloo's receives complete only in ``wait``) and
    queues it: the queue's order is the order of arrival."""

    def __init__(self, ranks: list[int], grace: float, d: int, dtype: torch.dtype, device: torch.device,
                 timeout: float, log, rejoining: bool = False):
        self.ranks, self.grace, self.device, self.timeout, self.log = ranks, grace, device, timeout, log
        self.inbox = [torch.empty(d + 2, dtype=dtype) for _ in ranks]
        self.outbox = torch.empty(d + 1, dtype=dtype)
        self.arrivals: queue.Queue = queue.Queue()
        self.listening: set[int] = set()  # the workers whose next push is awaited
        self.window: float | None = None  # when the open grace window closes (time.monotonic)
        self.waiting: list[int] = []  # the workers whose pushes it holds, in arrival order
        self.due: deque[int] = deque()  # the workers to pull now
        self.lost: deque[int] = deque()  # the workers whose process died, not yet told
        self.gone: set[int] = set()
        self.started = time.perf_counter()
        self.wire = {"wire_bytes_received": 0, "wire_bytes_sent": 0, "late_pushes": 0}
        self.rejoining: deque[int] = deque(range(len(ranks)) if rejoining else ())  # a resumed run's workers
        for w in range(0 if rejoining else len(ranks)):
            self._listen(w)

    def _listen(self, w: int) -> None:
        self.listening.add(w)
        listen(self.arrivals, w, self.inbox[w], self.ranks[w])

    def next(self) -> Event:
        deadline = time.monotonic() + self.timeout
        while True:
            if self.rejoining:
                return Event(REJOIN, self.rejoining.popleft())
            if self.lost:
                return Event(GONE, self.lost.popleft())
            if self.due:
                return Event(PULL, self.due.popleft())
            if self.window is not None and time.monotonic() >= self.window:
                self.due.extend(self.waiting)
                self.window, self.waiting = None, []
                continue
            until = deadline if self.window is None else min(self.window, deadline)
            try:
                w, error = self._take(until - time.monotonic())
            except queue.Empty:
                if self.window is not None and time.monotonic() >= self.window:
                    continue
                raise PeerLost(f"server (rank {dist.get_rank()}): no push arrived from any worker within "
                               f"dist_timeout={self.timeout:g} s; stopping", []) from None
            if error is not None:
                self._lose(w, error)
                continue
            if self.window is None:
                self.window = time.monotonic() + self.grace
            self.waiting.append(w)
            message = self.inbox[w]
            return Event(PUSH, w, message[2:].to(self.device, copy=True).view(1, -1), float(message[0]),
                         float(message[1]))

    def _take(self, seconds: float) -> tuple[int, RuntimeError | None]:
        """The next worker whose push arrived or whose receive failed (its error), waiting at most
        ``seconds`` (queue.Empty after)."""
        w, _, error = self.arrivals.get(timeout=max(seconds, 1e-6))
        self.listening.discard(w)
        if error is None:
            self.wire["wire_bytes_received"] += self.inbox[w].numel() * self.inbox[w].element_size()
        return w, error

    def _lose(self, w: int, error: RuntimeError) -> None:
        """Worker w's process died: it is dropped (told as a GONE event); none left stops the run."""
        self.gone.add(w)
        self.lost.append(w)
        if len(self.gone) == len(self.ranks):
            raise PeerLost(f"server (rank {dist.get_rank()}): every worker is gone, the last worker {w} (rank "
                           f"{self.ranks[w]}): {first_line(error)}; stopping", [self.ranks[w]])

    def pull(self, w: int, theta: torch.Tensor, version: int, rejoin: int | None = None) -> None:
        """[θ, v] to w (and, where it rejoins a resumed run, its step count), then await its push."""
        self.outbox[:-1] = theta[0]
        self.outbox[-1] = version
        count = None if rejoin is None else torch.tensor([float(rejoin)], dtype=torch.float64)
        if self._send(w, self.outbox) and (count is None or self._send(w, count)):
            self._listen(w)

    def _send(self, w: int, message: torch.Tensor) -> bool:
        """``message`` to worker w; False (and w dropped) where its process died."""
        try:
            dist.send(message, self.ranks[w])
        except RuntimeError as e:
            self._lose(w, e)
            return False
        self.wire["wire_bytes_sent"] += message.numel() * message.element_size()
        return True

    def record(self, entry: dict) -> None:
        self.log.write(json.dumps({**entry, "wall": round(time.perf_counter() - self.started, 6)}) + "\n")

    def counters(self) -> dict:
        return dict(self.wire)

    def finish(self) -> None:
        """Stop every worker: a waiting one at once, a computing one after its next (late) push."""
        self.outbox[-1] = STOP
        for w in [*self.waiting, *self.due]:
            self._send(w, self.outbox)
        while self.listening:
            try:
                w, error = self._take(self.timeout)
            except queue.Empty:
                raise PeerLost(f"server (rank {dist.get_rank()}): workers {sorted(self.listening)} did not push "
                               f"within dist_timeout={self.timeout:g} s after the last step; stopping",
                               [self.ranks[w] for w in sorted(self.listening)]) from None
            if error is None:
                self.wire["late_pushes"] += 1
                self._send(w, self.outbox)
        self.log.write(json.dumps({"end": True, **self.wire}) + "\n")


def event_log(path: Path) -> Path:
    """The event log of run directory ``path``, refused in one line where there is none."""
    file = Path(path) / LOG
    if not file.is_file():
        raise ConfigError(f"--replay '{short(str(path))}': no {LOG} there; replay reads the event log that an "
                          f"async-local-sgd run on engine dist writes")
    return file


def log_lines(path: Path, cfg) -> list[dict]:
    """The lines of the event log in run directory ``path`` (its header first), refused unless it
    is a log of a run of ``cfg`` (the same config in everything that changes training)."""
    file, where = event_log(path), short(str(path))
    try:
        lines = [json.loads(line) for line in file.read_text().splitlines() if line]
    except ValueError:
        raise ConfigError(f"--replay '{where}': {LOG} is damaged (a line is not JSON)") from None
    if not lines or not isinstance(lines[0], dict) or lines[0].get("log") != LOG_FORMAT:
        raise ConfigError(f"--replay '{where}': {LOG} does not start with a gossamer event log header")
    changed = config_differences(lines[0]["config"], cfg.to_dict())
    if changed:
        raise ConfigError(f"--replay '{where}': its event log is of another run: the config differs in {changed}")
    return lines


def read_log(path: Path, cfg, steps_per_epoch: int) -> tuple[dict, list[dict]]:
    """The header and the events of the log in run directory ``path`` (:func:`log_lines`) that
    reach the run's last step (refused where the log ends before it)."""
    lines, where = log_lines(path, cfg), short(str(path))
    events = [e for e in lines[1:] if any(k in e for k in KINDS)]
    steps, need = local_steps_of(cfg), cfg.workers * cfg.epochs * steps_per_epoch
    pushed = 0
    for number, e in enumerate(events, start=1):
        pushed += steps[e[PUSH]] if PUSH in e else 0
        if pushed >= need:
            return lines[0], events[:number]
    raise ConfigError(f"--replay '{where}': the event log ends after event {len(events)}, at inner step {pushed} of "
                      f"the {need} the run takes (step {pushed // cfg.workers} of {need // cfg.workers}): the run "
                      f"stopped early")


def replay(cfg, source: Path, out: Path, overwrite: bool, progress: bool) -> dict:
    """Train ``cfg`` in this process on the events logged in run directory ``source`` into ``out``."""
    data = load_dataset(cfg)  # once: the server's run and every worker's are built from it
    run = build_run(cfg, SimEngine(cfg.workers), data=data)
    header, events = read_log(source, cfg, run.steps_per_epoch)
    workers = [worker(one_row_run(cfg, w, data), w, sleeps=False) for w in range(cfg.workers)]
    run.schedule.events = Replay(events, workers, short(str(source)))
    with threads_of(header):
        return train_into(cfg, run, RunDir(out, overwrite, cfg.logger), out, progress, None)


@contextlib.contextmanager
def threads_of(header: dict):
    """Within: the intra-op threads the processes of a log computed with (a sum's order follows
    the threads that share it)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(header["threads"])
    try:
        yield
    finally:
        torch.set_num_threads(threads)
