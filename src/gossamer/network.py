"""Time: the α–β cost of every communication operator, and the simulated clock of a run.

A link has a latency α (seconds per message) and a bandwidth β (bytes per second); a message of
b bytes takes α + b/β. A worker sends its messages one after another on its link, and receives
on the same full-duplex link at the same time, so an operator costs the messages on its
critical path (m: the bytes of the vector or model, B: one member's message, g: the group):

- ring all-reduce (reduce-scatter, then all-gather):        2(g − 1)·(α + m/(g·β))
- ring all-gather of one B-byte message per member:          (g − 1)·(α + B/β)
- a gossip round, every worker's model to each worker that mixes it in:  k·(α + m/β),
  k the most messages one worker sends or receives in that round (W_t's largest degree).

**Clusters** (``workers_per_node`` w > 1): w consecutive workers share a node, joined by
intra-node links (α_i, β_i); a node reaches the others through one link (α, β) that its workers
share. For a group spanning N nodes with at most w_g of its members on one node:

- all-reduce, hierarchically (reduce-scatter inside each node, then an all-reduce across the N
  nodes of each member's 1/w_g shard — the w_g shards share the node's link —, then all-gather
  inside): 2(w_g − 1)·(α_i + m/(w_g·β_i)) + 2(N − 1)·(α + m/(N·β));
- all-gather: across nodes first (w_g rings share the node's link), then inside the node:
  (N − 1)·(α + w_g·B/β) + (w_g − 1)·(α_i + N·B/β_i);
- gossip: max(k_i·(α_i + m/β_i), K·(α + m/β)), k_i the most intra-node messages of a worker,
  K the most messages that cross one node's link in one direction.

With w = 1 (the default) every formula is the flat one above. Every message size is the one the
engine counted: d float32 values, or the exact bytes of a codec's message.

**A step** costs its compute c plus its communication, one after the other; with ``overlap``,
a step whose only communication is the gradient all-reduce (``Schedule.averages_gradients``)
hides up to the backward pass's share of c, 2/3 (backward ≈ twice the forward's FLOPs), as
DDP overlaps its bucketed all-reduce with backward: c + max(0, comm − 2c/3). An operator that
may run behind w steps of compute (``Event.behind``: Streaming DiLoCo's fragment, applied τ steps
after it was sent, w = min(τ, ⌊H/F⌋) so that two fragments never share the link) costs
max(0, comm − w·c), charged at the step that sends it. Measurement traffic (x̄, Ξ², scalar
means, control's probes) is priced apart, as ``sim_seconds_metrics``, and costs training time
only with ``count_metrics: true`` (a study of measurement's cost).
c is ``compute_ms``: ``measured`` (the simulator's own compute time per step divided by the
workers it ran), a number of milliseconds, or ``flops:TFLOPS`` (one worker's forward and
backward FLOPs on its batch, counted by ``torch.utils.flop_counter``, over TFLOPS·10¹²).

**Per-worker clocks.** Worker i has its own clock T_i and computes c_i(t) = c·s_i·ε_i(t): s_i = X
for the ⌈F·n⌉ workers that ``slow_workers: F@X`` draws once from the seed (else 1), ε_i(t) a
log-normal factor of mean 1, exp(σz − σ²/2) with z ~ N(0, 1) drawn from (seed, t, i), with
``compute_jitter: lognormal:σ`` (else 1). An operator waits only for the workers it needs, then
costs its time τ (the formulas above) on each of them:

- an all-reduce, all-gather or block mean of group g:  T_i ← max_{j∈g} T_j + τ;
- a gossip round W:  T_i ← max_{j : W_ij ≠ 0} T_j + τ (i's in-neighbours and itself);
- a local step: nobody.

With ``overlap``, the gradient all-reduce starts at the backward's start, T_i + c_i/3, and a
worker's step ends at max(T_i + c_i, the all-reduce's end). Measurement traffic is priced after
the step's operators. ``sim_seconds`` is max_i T_i; a worker is idle while it waits in an
operator and after its last step until the slowest ends: ``sim_seconds_idle_fraction`` is the
mean over workers of its idle time over ``sim_seconds``. With equal speeds every clock is the
same and the step costs c plus its operators, as above.
"""

from __future__ import annotations

import copy
import math
import sys
import time
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Callable

import numpy as np
import torch

from .data.partition import steps_per_epoch
from .engines.stats import BYTES_PER_VALUE, METRICS, Event
from .registry import ConfigError, short
from .rng import generator, host_generator

BACKWARD_SHARE = 2 / 3  # of a step's compute: backward ≈ 2 × forward FLOPs
HORIZON_ROOM = 1e3  # a run's simulated time must stay finite with this much more communication per step


@dataclass(frozen=True)
class Preset:
    bandwidth: float  # Gbit/s per link and direction
    latency: float  # µs per message
    what: str


PRESETS: dict[str, Preset] = {
    "nvlink": Preset(2400.0, 2.0, "NVLink 3 (A100 SXM): 300 GB/s per direction"),
    "infiniband-100g": Preset(100.0, 2.0, "EDR InfiniBand, 100 Gbit/s"),
    "ethernet-10g": Preset(10.0, 25.0, "10 Gbit/s Ethernet, TCP"),
    "ethernet-1g": Preset(1.0, 50.0, "1 Gbit/s Ethernet, TCP"),
    "wan-100m": Preset(0.1, 20_000.0, "100 Mbit/s between data centres, 20 ms one way"),
}
INTRA_NODE_DEFAULT = "nvlink"  # intra-node links of a cluster unless given


@dataclass(frozen=True)
class Link:
    """α (seconds per message) and β (bytes per second)."""

    latency: float
    bandwidth: float

    @classmethod
    def of(cls, gbit_per_s: float, microseconds: float) -> Link:
        return cls(microseconds / 1e6, gbit_per_s * 1e9 / 8)

    def message(self, nbytes: float) -> float:
        """α + b/β: one message of ``nbytes``."""
        return self.latency + nbytes / self.bandwidth


@dataclass
class NetworkConfig:
    """The ``network`` section (or ``network: PRESET``): links, cluster shape, what costs time."""

    preset: str | None = None  # nvlink, infiniband-100g, ethernet-10g, ethernet-1g, wan-100m
    bandwidth: float | None = None  # Gbit/s per link and direction (default: the preset's)
    latency: float | None = None  # µs per message (default: the preset's)
    workers_per_node: int = 1  # consecutive workers sharing a node
    intra_node_bandwidth: float | None = None  # Gbit/s between workers of a node (default: nvlink's)
    intra_node_latency: float | None = None  # µs (default: nvlink's)
    overlap: bool = False  # hide the gradient all-reduce behind the backward pass, as DDP does
    count_metrics: bool = False  # true: measurement traffic (x̄, Ξ², scalar means, probes) costs time too

    def validate(self, cfg) -> None:
        """Check the values and fill in the preset's (so config.yaml holds the numbers used)."""
        if self.preset is not None:
            if self.preset not in PRESETS:
                raise ConfigError(f"unknown network preset '{short(self.preset)}'; choose one of: "
                                  f"{', '.join(PRESETS)} (or give network.bandwidth and network.latency)")
            preset = PRESETS[self.preset]
            self.bandwidth = preset.bandwidth if self.bandwidth is None else self.bandwidth
            self.latency = preset.latency if self.latency is None else self.latency
        if self.bandwidth is None or self.latency is None:
            raise ConfigError(f"network needs bandwidth (Gbit/s) and latency (µs), or a preset: "
                              f"network: {' | '.join(PRESETS)}")
        if self.workers_per_node < 1 or cfg.workers % self.workers_per_node:
            raise ConfigError(f"network.workers_per_node must be a positive divisor of workers ({cfg.workers}), "
                              f"got {self.workers_per_node}")
        intra = (self.intra_node_bandwidth, self.intra_node_latency)
        if self.workers_per_node == 1 and intra != (None, None):
            raise ConfigError("network.intra_node_bandwidth and intra_node_latency apply only with "
                              "network.workers_per_node > 1")
        if self.workers_per_node > 1:
            default = PRESETS[INTRA_NODE_DEFAULT]
            self.intra_node_bandwidth = default.bandwidth if intra[0] is None else intra[0]
            self.intra_node_latency = default.latency if intra[1] is None else intra[1]
        for prefix in ("", "intra_node_"):
            bandwidth, latency = getattr(self, prefix + "bandwidth"), getattr(self, prefix + "latency")
            if bandwidth is not None and not bandwidth > 0:
                raise ConfigError(f"network.{prefix}bandwidth must be > 0 Gbit/s, got {bandwidth}")
            if bandwidth is not None and bandwidth < sys.float_info.min:  # subnormal: b/β overflows
                raise ConfigError(f"network.{prefix}bandwidth must be a normal float >= {sys.float_info.min:.4g} "
                                  f"Gbit/s, got {bandwidth:.4g}")
            if latency is not None and not latency >= 0:
                raise ConfigError(f"network.{prefix}latency must be >= 0 µs, got {latency}")

    def check_finite(self, nbytes: float, workers: int, compute: float, steps: int) -> None:
        """Refuse a time model whose simulated time overflows: ``steps`` steps of ``compute``
        seconds, each with an all-reduce of ``nbytes`` and one such message to every other worker,
        with room (:data:`HORIZON_ROOM`) for extra gossip rounds and measurement traffic."""
        if not math.isfinite(compute * steps * HORIZON_ROOM):
            raise ConfigError(f"compute_ms of {compute * 1000:.4g} ms makes the {steps:,} steps of this run take "
                              f"{compute * steps:.4g} s: the simulated time would not be finite; give a smaller one")
        slowest = max(self.link.message(nbytes), self.intra_link.message(nbytes))
        comm = self.seconds(Event("allreduce", workers, nbytes, "global")) + (workers - 1) * slowest
        if not math.isfinite(comm * steps * HORIZON_ROOM):
            raise ConfigError(f"network.bandwidth {self.bandwidth:.4g} Gbit/s and network.latency {self.latency:.4g} "
                              f"µs make a step of the {nbytes:,.0f}-byte model take up to {comm:.4g} s: the simulated "
                              f"time of {steps:,} steps would not be finite; give a larger bandwidth or a smaller latency")

    @property
    def link(self) -> Link:
        return Link.of(self.bandwidth, self.latency)

    @property
    def intra_link(self) -> Link:
        return Link.of(self.intra_node_bandwidth, self.intra_node_latency) if self.workers_per_node > 1 else self.link

    def pair_seconds(self, i: int, j: int, nbytes: float) -> float:
        """α + b/β of one message between workers i and j (on their node's link if they share one)."""
        w = self.workers_per_node
        return (self.intra_link if i // w == j // w else self.link).message(nbytes)

    def seconds(self, event: Event) -> float:
        """The time of one operator on this network (the formulas of the module docstring)."""
        inter, intra, w = self.link, self.intra_link, self.workers_per_node
        if event.nbytes == 0:  # nothing to send (the buffers of a model without any)
            return 0.0
        if event.op == "gossip":
            k_intra, k_inter = gossip_degrees(event.mixing, w)
            return max(k_intra * intra.message(event.nbytes), k_inter * inter.message(event.nbytes))
        nodes, per_node = span(event.group, w)
        if event.op == "allreduce":
            return (2 * (per_node - 1) * intra.message(event.nbytes / per_node)
                    + 2 * (nodes - 1) * inter.message(event.nbytes / nodes))
        if event.op == "allgather":
            return (nodes - 1) * inter.message(per_node * event.nbytes) + (per_node - 1) * intra.message(nodes * event.nbytes)
        raise ValueError(f"no cost for operator '{event.op}'")


@lru_cache(maxsize=None)
def span(group: int, workers_per_node: int) -> tuple[int, int]:
    """(N, w_g) of groups of ``group`` consecutive workers aligned to multiples of ``group``: the
    most nodes one group spans and the most members it has on one node (over every group; the
    placement repeats every lcm(group, workers_per_node) workers)."""
    nodes, per_node = 1, 1
    for start in range(0, math.lcm(group, workers_per_node), group):
        node_of = np.arange(start, start + group) // workers_per_node
        counts = np.unique(node_of, return_counts=True)[1]
        nodes, per_node = max(nodes, len(counts)), max(per_node, int(counts.max()))
    return nodes, per_node


def gossip_degrees(mixing, workers_per_node: int) -> tuple[int, int]:
    """(k_i, K) of a gossip round W: the most messages a worker sends or receives inside its node,
    and the most that cross one node's link in one direction. Worker j sends its model to i
    when W[i, j] ≠ 0, i ≠ j. Kept on the Mixing."""
    def build():
        rows = np.broadcast_to(np.arange(mixing.n), mixing.index.shape)
        used = (mixing.weight != 0) & (mixing.index != rows)
        pairs = np.unique(np.stack([rows[used], mixing.index[used]], 1), axis=0).reshape(-1, 2)
        receiver, sender = pairs[:, 0], pairs[:, 1]
        inside = receiver // workers_per_node == sender // workers_per_node
        n, nodes = mixing.n, mixing.n // workers_per_node

        def most(ids, size) -> int:
            return int(np.bincount(ids, minlength=size).max()) if len(ids) else 0
        k_intra = max(most(receiver[inside], n), most(sender[inside], n))
        k_inter = max(most(receiver[~inside] // workers_per_node, nodes), most(sender[~inside] // workers_per_node, nodes))
        return k_intra, k_inter
    return mixing.plan(("network", workers_per_node), build)


# ---------------------------------------------------------------- compute time


MEASURED = "measured"
FLOPS = "flops:"


def check_compute(value) -> None:
    """``compute_ms``: ``measured``, a number of milliseconds >= 0, or ``flops:TFLOPS`` (> 0)."""
    if isinstance(value, str) and value.startswith(FLOPS):
        try:
            tflops = float(value[len(FLOPS):])
        except ValueError:
            tflops = math.nan
        if not (tflops > 0 and math.isfinite(tflops)):
            raise ConfigError(f"compute_ms flops:TFLOPS needs a device throughput > 0 in TFLOPS, got '{short(value)}'")
    elif isinstance(value, str):
        if value != MEASURED:
            raise ConfigError(f"compute_ms must be measured, a number of milliseconds or flops:TFLOPS, "
                              f"got '{short(value)}'")
    elif not value >= 0:
        raise ConfigError(f"compute_ms must be >= 0 milliseconds, got {value}")


def step_flops(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, loss) -> float:
    """FLOPs of one forward and backward pass of ``model`` on the batch (x, y), counted by
    ``torch.utils.flop_counter`` (matrix products and convolutions) on a copy of the model."""
    from torch.utils.flop_counter import FlopCounterMode

    replica = copy.deepcopy(model)
    with FlopCounterMode(display=False) as counter:
        loss(replica(x), y).backward()
    return float(counter.get_total_flops())


SLOW, JITTER = "F@X", "lognormal:"
JITTER_STREAM = 21  # the key that sets the jitter draws of (seed, t, i) apart from the other streams
MAX_SIGMA = 10.0  # exp(σz) stays finite in float64 for any z torch.randn draws


def parse_slow_workers(value: str) -> tuple[float, float]:
    """``slow_workers: F@X`` → (F, X): F ∈ (0, 1] of the workers compute X ≥ 1 times slower."""
    try:
        fraction, factor = (float(v) for v in str(value).split("@"))
    except ValueError:
        fraction = factor = math.nan
    if not (0 < fraction <= 1 and 1 <= factor < math.inf):
        raise ConfigError(f"slow_workers must be F@X with a fraction F in (0, 1] of the workers and a slowdown "
                          f"X in [1, inf), e.g. 0.1@4; got '{short(value)}'")
    return fraction, factor


def parse_jitter(value: str) -> float:
    """``compute_jitter: lognormal:σ`` → σ ∈ (0, MAX_SIGMA]."""
    text = str(value)
    try:
        sigma = float(text[len(JITTER):]) if text.startswith(JITTER) else math.nan
    except ValueError:
        sigma = math.nan
    if not 0 < sigma <= MAX_SIGMA:
        raise ConfigError(f"compute_jitter must be lognormal:S with a log-normal σ = S in (0, {MAX_SIGMA:g}], "
                          f"e.g. lognormal:0.5; got '{short(value)}'")
    return sigma


@dataclass(frozen=True)
class Speeds:
    """Each worker's compute time relative to ``compute_ms``: s_i·ε_i(t) (module docstring)."""

    slow: np.ndarray  # s_i [n]
    sigma: float | None  # σ of ε_i(t); None: ε = 1
    seed: int

    @classmethod
    def of(cls, cfg) -> Speeds:
        slow = np.ones(cfg.workers)
        if cfg.slow_workers is not None:
            fraction, factor = parse_slow_workers(cfg.slow_workers)
            chosen = torch.randperm(cfg.workers, generator=generator(cfg.seed, JITTER_STREAM))
            slow[chosen[: math.ceil(fraction * cfg.workers - 1e-9)].numpy()] = factor
        return cls(slow, parse_jitter(cfg.compute_jitter) if cfg.compute_jitter is not None else None, cfg.seed)

    def factor(self, t: int, i: int) -> float:
        """s_i·ε_i(t) of worker i's step (or gradient) t."""
        if self.sigma is None:
            return float(self.slow[i])
        z = host_generator(self.seed, JITTER_STREAM, t, i).standard_normal()
        return float(self.slow[i] * math.exp(self.sigma * z - self.sigma**2 / 2))

    def factors(self, t: int) -> np.ndarray:
        """[n] factors of step t."""
        return self.slow if self.sigma is None else np.array([self.factor(t, i) for i in range(len(self.slow))])


def wait(clocks: np.ndarray, event: Event) -> np.ndarray:
    """When each worker can start ``event``: the latest clock of the workers it waits for."""
    if event.op == "gossip":
        senders = event.mixing.plan(("in-neighbours",), lambda: np.where(event.mixing.weight != 0, event.mixing.index,
                                                                           np.arange(event.mixing.n)))
        return clocks[senders].max(0)
    return np.repeat(clocks.reshape(-1, event.group).max(1), event.group)


@dataclass
class Clock:
    """The simulated time of a run: each worker's compute, then the communication on ``network``,
    on per-worker clocks (module docstring).

    ``step_seconds``: one worker's compute per step at speed 1 (None: measured by :meth:`timed`)."""

    network: NetworkConfig
    step_seconds: float | None
    speeds: Speeds
    sync: Callable[[], None] = lambda: None  # waits for the device (measured compute on a GPU)
    sleeps: bool = False  # real processes (engine dist): sleep for the modelled extra compute
    _measured: float = field(default=0.0, init=False, repr=False)  # this step's, until tick()

    def timed(self, fn: Callable, *args):
        """``fn(*args)``, its wall time added to the step's compute when it is measured."""
        if self.step_seconds is not None:
            return fn(*args)
        self.sync()
        start = time.perf_counter()
        out = fn(*args)
        self.sync()
        self._measured += time.perf_counter() - start
        return out

    def straggle(self, t: int, rows: range) -> None:
        """On real processes (``sleeps``), after step t's compute: sleep for the extra time the
        model gives the slowest of this process's workers, max(0, s_i·ε_i(t) − 1)·c (a worker
        faster than c cannot be made faster)."""
        if self.sleeps:
            c = self.step_seconds if self.step_seconds is not None else self._measured / len(rows)
            extra = max(self.speeds.factor(t, i) for i in rows) - 1
            if extra > 0:
                time.sleep(extra * c)

    def compute(self, workers: int) -> float:
        """c: one worker's compute per step at speed 1 (``workers``: those :meth:`timed` measured)."""
        c = self.step_seconds if self.step_seconds is not None else self._measured / workers
        self._measured = 0.0
        return c

    def tick(self, clocks: np.ndarray, idle: np.ndarray, t: int, events: list[Event], averages_gradients: bool,
             workers: int) -> float:
        """Advance the per-worker ``clocks`` and ``idle`` times (in place) by step t, whose
        operators are ``events``; ``workers``: those whose compute :meth:`timed` measured.
        Returns the step's communication not hidden by compute (at speed 1)."""
        c, net = self.compute(workers), self.network
        algorithm = [(e, max(0.0, net.seconds(e) - e.behind * c)) for e in events if e.level != METRICS]
        metrics = self.measurement(events)
        compute = c * self.speeds.factors(t)
        comm = sum(cost for _, cost in algorithm)
        hidden = min(comm, BACKWARD_SHARE * c) if net.overlap and averages_gradients else 0.0
        if hidden:  # the all-reduce starts with the backward pass
            now = np.maximum(clocks + compute, _operate(clocks + compute / 3, algorithm))
            idle += now - clocks - np.maximum(compute, compute / 3 + comm)
        else:
            now = _operate(clocks + compute, algorithm, idle)
        clocks[:] = _operate(now, metrics, idle)
        return comm - hidden + sum(cost for _, cost in metrics)


    def measurement(self, events: list[Event]) -> list[tuple[Event, float]]:
        """The measurement operators among ``events``, each with its time (none unless they count)."""
        return [(e, cost) for e, cost in self.measurement_seconds(events) if self.network.count_metrics]

    def measurement_seconds(self, events: list[Event]) -> list[tuple[Event, float]]:
        """The measurement operators among ``events``, each with the time it takes on the network
        (whether or not it counts): ``sim_seconds_metrics`` sums them."""
        return [(e, self.network.seconds(e)) for e in events if e.level == METRICS]


def _operate(clocks: np.ndarray, priced: list[tuple[Event, float]], idle: np.ndarray | None = None) -> np.ndarray:
    """The clocks after the operators ``priced`` (each with its time τ), one after the other;
    each worker's waits added to ``idle``."""
    for event, cost in priced:
        start = wait(clocks, event)
        if idle is not None:
            idle += start - clocks
        clocks = start + cost
    return clocks


def build_clock(cfg, model: torch.nn.Module, data, loss, device: torch.device) -> Clock | None:
    """The clock of a run with a ``network`` section (None without one)."""
    if cfg.network is None:
        return None
    value = MEASURED if cfg.compute_ms is None else cfg.compute_ms
    if value == MEASURED:
        step = None
    elif isinstance(value, str):
        batch = slice(0, cfg.batch_size)
        flops = step_flops(model, data.x_train[batch], data.y_train[batch], loss)
        step = flops / (float(value[len(FLOPS):]) * 1e12)
    else:
        step = value / 1000
    steps = cfg.epochs * steps_per_epoch(len(data.y_train), cfg.workers, cfg.batch_size)
    nbytes = sum(p.numel() for p in model.parameters()) * BYTES_PER_VALUE
    speeds = Speeds.of(cfg)
    cfg.network.check_finite(nbytes, cfg.workers, (step or 0.0) * speeds.slow.max(), steps)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    return Clock(cfg.network, step, speeds, sync, sleeps=cfg.engine == "dist")


