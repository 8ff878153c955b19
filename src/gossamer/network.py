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
ledger counted from the tensors that travel: d values of the run's dtype (4 bytes in float32, 8
in float64), or the exact bytes of a codec's message.

**A step** costs its compute c plus its communication, one after the other. What a transfer may
overlap is the ledger's (:class:`~gossamer.engines.ledger.Transfer`), not the clock's guess:
with ``overlap``, the transfers that run behind the backward pass (``backward``: the gradient
all-reduce, bucketed as DDP does it) start with it and hide up to its share of c, 2/3 (backward ≈
twice the forward's FLOPs): c + max(0, comm − 2c/3), the step's other transfers after. An
operator that may run behind w steps of compute (``behind``: Streaming DiLoCo's fragment, applied τ steps
after it was sent, w = min(τ, ⌊H/F⌋) so that two fragments never share the link) costs
max(0, comm − w·c), charged at the step that sends it. The algorithm's traffic includes what it
decides from (consensus control's probes of Ξ², Θ² and φ²) and a returning worker's fetch.
Measurement traffic (x̄, Ξ² and scalar means for the rows and evaluations) is priced apart, as
``sim_seconds_metrics``, and costs training time only with ``count_metrics: true`` (a study of
measurement's cost). ``sim_seconds_comm`` adds each
operator's τ (a one-sided one's as τ/n, the mean over workers of what it costs).
c is ``compute_ms``: ``measured`` (the simulator's own compute time per step divided by the
workers it ran), a number of milliseconds, or ``flops:TFLOPS`` (one worker's forward and
backward FLOPs on its batch, counted by ``torch.utils.flop_counter``, over TFLOPS·10¹²).

**Per-worker clocks.** Worker i has its own clock T_i and computes c_i(t) = c·s_i·ε_i(t): s_i = X
for the ⌈F·n⌉ workers that ``slow_workers: F@X`` draws once from the seed (else 1), or s_i the
i-th of ``worker_speeds`` (one per worker), ε_i(t) a
log-normal factor of mean 1, exp(σz − σ²/2) with z ~ N(0, 1) worker i's row of row stream ``jitter`` (seed, t), with
``compute_jitter: lognormal:σ`` (else 1). The clock reads the step's ledger
(:mod:`gossamer.engines.ledger`) in order: a computation costs c_i(t) on the workers that
computed (a worker that sat the step out, or is gone, spends nothing); an operator waits only for
the workers it needs, then costs its time τ (the formulas above) on each worker taking part:

- an all-reduce or all-gather within groups: each member T_i ← max_{j ∈ its group} T_j + τ;
- a gossip round W: each worker that sends or receives a message T_i ← max_{j : W_ij ≠ 0} T_j + τ
  (i's in-neighbours and itself); a worker with no link that round waits for nobody;
- a one-sided exchange (AD-PSGD's pair average): its initiator T_i ← T_i + τ, nobody waits;
- a push or pull between worker i and a parameter server (asynchronous local SGD): T_i ← T_i + q + τ,
  τ = α + b/β of the inter-node link, q the wait the schedule decided for the server's shared
  link or its grace window (:mod:`gossamer.algorithms.async_local`), idle time;
- a local step: nobody.

With ``overlap``, the transfers behind the backward pass start at its start, T_i + c_i/3, a
worker's compute ends at max(T_i + c_i, their end), and the step's other operators follow.
Measurement traffic is priced after the step's operators. ``sim_seconds`` is max_i T_i; a worker is idle while it waits in an
operator and after its last step until the slowest ends: ``sim_seconds_idle_fraction`` is the
mean over workers of its idle time over ``sim_seconds``, ``idle_seconds`` the mean idle time;
``compute_utilization`` is the fraction of ``sim_seconds`` a worker spends computing (its mean
over workers, and ``compute_utilization_min`` the least). With equal speeds every clock is the
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
from .engines.ledger import METRICS, Compute, Transfer
from .groups import Groups
from .registry import ConfigError, short
from .rng import host_stream, row_normals

BACKWARD_SHARE = 2 / 3  # of a step's compute: backward ≈ 2 × forward FLOPs
TIME_KEYS = ("compute_ms", "slow_workers", "worker_speeds", "compute_jitter")  # the clock's compute: need a network
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
    overlap: bool = False  # hide what runs behind the backward pass (the gradient all-reduce), as DDP does
    count_metrics: bool = False  # true: measurement traffic (the rows' x̄, Ξ², scalar means) costs time too

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

    def check_finite(self, nbytes: float, workers: int, compute: float, slowdown: float, steps: int) -> None:
        """Refuse a time model whose simulated time overflows: ``steps`` steps of ``compute``
        seconds (the slowest worker's: × ``slowdown``), each with an all-reduce of ``nbytes`` and one
        such message to every other worker, with room (:data:`HORIZON_ROOM`) for extra gossip
        rounds and measurement traffic; the key that makes it overflow is named (Python floats:
        an overflow is inf, without numpy's warnings)."""
        compute, slowdown = float(compute), float(slowdown)
        if not math.isfinite(compute * steps * HORIZON_ROOM):
            raise ConfigError(f"compute_ms of {compute * 1000:.4g} ms makes the {steps:,} steps of this run take "
                              f"{compute * steps:.4g} s: the simulated time would not be finite; give a smaller one")
        if not math.isfinite(compute * slowdown * steps * HORIZON_ROOM):
            raise ConfigError(f"slow_workers with a slowdown of {slowdown:.4g} makes the slowest worker's {steps:,} "
                              f"steps of {compute * 1000:.4g} ms take {compute * slowdown * steps:.4g} s: the "
                              f"simulated time would not be finite; give a smaller slowdown")
        slowest = max(self.link.message(nbytes), self.intra_link.message(nbytes))
        everyone = Groups.blocks(workers, workers)
        comm = self.seconds(Transfer("allreduce", nbytes, "global", groups=everyone)) + (workers - 1) * slowest
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

    def seconds(self, transfer: Transfer) -> float:
        """The time of one operator on this network (the formulas of the module docstring)."""
        inter, intra, w = self.link, self.intra_link, self.workers_per_node
        if transfer.nbytes == 0:  # nothing to send (the buffers of a model without any)
            return 0.0
        if transfer.op in ("push", "pull"):  # the server is on no worker's node
            return inter.message(transfer.nbytes)
        if transfer.op == "gossip":
            k_intra, k_inter = gossip_degrees(transfer.mixing, w)
            return max(k_intra * intra.message(transfer.nbytes), k_inter * inter.message(transfer.nbytes))
        nodes, per_node = span(transfer.groups, w)
        if transfer.op == "allreduce":
            return (2 * (per_node - 1) * intra.message(transfer.nbytes / per_node)
                    + 2 * (nodes - 1) * inter.message(transfer.nbytes / nodes))
        if transfer.op == "allgather":
            return ((nodes - 1) * inter.message(per_node * transfer.nbytes)
                    + (per_node - 1) * intra.message(nodes * transfer.nbytes))
        raise ValueError(f"no cost for operator '{transfer.op}'")


def span(groups: Groups, workers_per_node: int) -> tuple[int, int]:
    """(N, w_g) of a set of groups: the most nodes one group spans and the most members a group
    has on one node (over every group). Kept on the groups."""
    if groups.consecutive and groups.member is None:
        return _aligned_span(groups.size, workers_per_node)

    def build() -> tuple[int, int]:
        nodes, per_node = 1, 1
        for r in range(groups.count):
            counts = np.unique(groups.members(r) // workers_per_node, return_counts=True)[1]
            if len(counts):
                nodes, per_node = max(nodes, len(counts)), max(per_node, int(counts.max()))
        return nodes, per_node
    return groups.plan(("span", workers_per_node), build)


@lru_cache(maxsize=None)
def _aligned_span(group: int, workers_per_node: int) -> tuple[int, int]:
    """:func:`span` of groups of ``group`` consecutive workers aligned to multiples of ``group``
    (the placement repeats every lcm(group, workers_per_node) workers)."""
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


def check_worker_speeds(speeds, workers: int, slow_workers: str | None) -> None:
    """``worker_speeds``: one finite s_i > 0 per worker, not with ``slow_workers``."""
    if slow_workers is not None:
        raise ConfigError("give slow_workers or worker_speeds, not both: both set the workers' speeds")
    if not isinstance(speeds, list) or len(speeds) != workers or not all(
            isinstance(s, (int, float)) and not isinstance(s, bool) and 0 < s < math.inf for s in speeds):
        raise ConfigError(f"worker_speeds must be a list of {workers} numbers > 0 (each worker's compute time as a "
                          f"multiple of compute_ms), got {short(speeds)}")


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
        slow = np.ones(cfg.workers) if cfg.worker_speeds is None else np.array(cfg.worker_speeds, dtype=np.float64)
        if cfg.slow_workers is not None:
            fraction, factor = parse_slow_workers(cfg.slow_workers)
            chosen = host_stream("slow-workers", cfg.seed).permutation(cfg.workers)
            slow[chosen[: math.ceil(fraction * cfg.workers - 1e-9)]] = factor
        return cls(slow, parse_jitter(cfg.compute_jitter) if cfg.compute_jitter is not None else None, cfg.seed)

    def factor(self, t: int, i: int) -> float:
        """s_i·ε_i(t) of worker i's step (or gradient) t."""
        return float(self.of_workers(t, [i])[0])

    def factors(self, t: int) -> np.ndarray:
        """[n] factors of step t."""
        return self.of_workers(t, range(len(self.slow)))

    def of_workers(self, t: int, workers) -> np.ndarray:
        """s_i·ε_i(t) of each of ``workers`` in step t, ε from row stream ``jitter`` (seed, t): one draw."""
        slow = self.slow[np.asarray(workers, dtype=np.int64)]
        if self.sigma is None:
            return slow
        z = row_normals("jitter", self.seed, t, rows=workers, width=1)[:, 0]
        return slow * np.exp(self.sigma * z - self.sigma**2 / 2)


def taking_part(transfer: Transfer) -> np.ndarray:
    """The workers an operator costs time (bool [n]): its groups' members; a gossip round's
    workers that send or receive a message; a one-sided exchange's initiator. Kept on it."""
    n = transfer.n
    if transfer.initiator is not None:
        part = np.zeros(n, dtype=bool)
        part[transfer.initiator] = True
        return part
    if transfer.groups is not None:
        return transfer.groups.of_worker >= 0
    mixing = transfer.mixing

    def build() -> np.ndarray:
        rows = np.broadcast_to(np.arange(n), mixing.index.shape)
        used = (mixing.weight != 0) & (mixing.index != rows)
        part = np.zeros(n, dtype=bool)
        part[rows[used]] = part[mixing.index[used]] = True
        return part
    return mixing.plan(("taking part",), build)


def wait(clocks: np.ndarray, transfer: Transfer) -> np.ndarray:
    """When each worker can start ``transfer`` (those not taking part: now): the latest clock of
    the workers it waits for; a one-sided one's initiator after its ``queued`` wait."""
    if transfer.initiator is not None:
        if not transfer.queued:
            return clocks
        start = clocks.copy()
        start[transfer.initiator] += transfer.queued
        return start
    if transfer.op == "gossip":
        mixing = transfer.mixing
        senders = mixing.plan(("in-neighbours",), lambda: np.where(mixing.weight != 0, mixing.index,
                                                                   np.arange(mixing.n)))
        return clocks[senders].max(0)
    group = transfer.groups.of_worker
    latest = np.full(transfer.groups.count, -np.inf)
    np.maximum.at(latest, group[group >= 0], clocks[group >= 0])
    return np.where(group >= 0, latest[group], clocks)


@dataclass
class Clock:
    """The simulated time of a run: each worker's compute, then the communication on ``network``,
    on per-worker clocks ``times`` (module docstring); ``idle``: each worker's waits so far,
    ``busy`` its compute so far.

    ``step_seconds``: one worker's compute per step at speed 1 (None: measured by :meth:`timed`)."""

    network: NetworkConfig
    step_seconds: float | None
    speeds: Speeds
    sync: Callable[[], None] = lambda: None  # waits for the device (measured compute on a GPU)
    sleeps: bool = False  # real processes (engine dist): sleep for the modelled extra compute
    times: np.ndarray = None  # T_i [n]
    idle: np.ndarray = None  # each worker's waits [n]
    busy: np.ndarray = None  # each worker's compute [n]
    _measured: float = field(default=0.0, init=False, repr=False)  # this step's, until tick()

    def __post_init__(self) -> None:
        n = len(self.speeds.slow)
        self.times = np.zeros(n) if self.times is None else self.times
        self.idle = np.zeros(n) if self.idle is None else self.idle
        self.busy = np.zeros(n) if self.busy is None else self.busy

    @property
    def now(self) -> float:
        """``sim_seconds``: the slowest worker's clock."""
        return float(self.times.max())

    def waits(self) -> float:
        """The mean over workers of the time spent waiting: in operators, and after its last step
        until the slowest worker's."""
        return float((self.idle + self.now - self.times).mean())

    def idle_fraction(self) -> float:
        """The mean over workers of the fraction of ``sim_seconds`` spent waiting."""
        now = self.now
        return self.waits() / now if now else 0.0

    def utilization(self) -> dict[str, float]:
        """``compute_utilization`` (mean over workers of the share of ``sim_seconds`` spent
        computing), its minimum, and ``idle_seconds`` (:meth:`waits`)."""
        now = self.now
        share = self.busy / now if now else np.zeros_like(self.busy)
        return {"compute_utilization": float(share.mean()), "compute_utilization_min": float(share.min()),
                "idle_seconds": self.waits()}

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

    def straggle(self, t: int, workers) -> None:
        """On real processes (``sleeps``), after step t's compute: sleep for the extra time the
        model gives the slowest of this process's computing ``workers``, max(0, s_i·ε_i(t) − 1)·c (a
        worker faster than c cannot be made faster)."""
        if self.sleeps and len(workers):
            c = self.step_seconds if self.step_seconds is not None else self._measured / len(workers)
            extra = self.speeds.of_workers(t, workers).max() - 1
            if extra > 0:
                time.sleep(extra * c)

    def compute(self, workers: int) -> float:
        """c: one worker's compute per step at speed 1 (``workers``: those :meth:`timed` measured)."""
        c = self.step_seconds if self.step_seconds is not None else self._measured / max(workers, 1)
        self._measured = 0.0
        return c

    def tick(self, entries: list, workers: int) -> float:
        """Advance the per-worker clocks and idle times by a step's ledger ``entries`` (in order;
        measurement after the rest); ``workers``: those whose compute :meth:`timed` measured.
        Returns the step's communication not hidden by compute (at speed 1)."""
        c, net, n = self.compute(workers), self.network, len(self.times)
        steps = [(e, None) if isinstance(e, Compute) else (e, max(0.0, net.seconds(e) - e.behind * c))
                 for e in entries if isinstance(e, Compute) or e.level != METRICS]
        metrics = self.measurement(entries)
        comm = sum(cost / (n if e.initiator is not None else 1) for e, cost in steps if cost is not None)
        backward = [(e, cost) for e, cost in steps if cost is not None and e.backward] if net.overlap else []
        behind = sum(cost for _, cost in backward)
        hidden = min(behind, BACKWARD_SHARE * c)
        if hidden:  # those transfers start with the backward pass; the step's others follow
            compute = sum(self._compute_times(e, c) for e, cost in steps if cost is None)
            self.busy += compute
            now = np.maximum(self.times + compute, self._operate(self.times + compute / 3, backward, None, c))
            self.idle += now - self.times - np.maximum(compute, compute / 3 + behind)
            now = self._operate(now, [(e, cost) for e, cost in steps if cost is not None and not e.backward],
                                self.idle, c)
        else:
            now = self._operate(self.times, steps, self.idle, c)
        self.times = self._operate(now, metrics, self.idle, c)
        return comm - hidden + sum(cost for _, cost in metrics)

    def _compute_times(self, entry: Compute, c: float) -> np.ndarray:
        """c·s_i·ε_i(k) of each worker of a computation [n] (0 for the others)."""
        n = len(self.times)
        if entry.workers is None:
            return c * self.speeds.factors(entry.counts)
        counts = np.broadcast_to(entry.counts, entry.workers.shape)
        out = np.zeros(n)
        for k in np.unique(counts):  # one draw per step count
            workers = entry.workers[counts == k]
            out[workers] = c * self.speeds.of_workers(int(k), workers)
        return out

    def _operate(self, clocks: np.ndarray, priced: list, idle: np.ndarray | None, c: float) -> np.ndarray:
        """The clocks after the entries ``priced`` (computations, and operators with their time τ),
        one after the other; each worker's waits added to ``idle``."""
        for entry, cost in priced:
            if cost is None:
                computed = self._compute_times(entry, c)
                self.busy += computed
                clocks = clocks + computed
                continue
            part = taking_part(entry)
            start = wait(clocks, entry)
            if idle is not None:
                idle += np.where(part, start - clocks, 0.0)
            clocks = np.where(part, start + cost, clocks)
        return clocks

    def measurement(self, entries: list) -> list[tuple[Transfer, float]]:
        """The measurement operators among ``entries``, each with its time (none unless they count)."""
        return [(e, cost) for e, cost in self.measurement_seconds(entries) if self.network.count_metrics]

    def measurement_seconds(self, entries: list) -> list[tuple[Transfer, float]]:
        """The measurement operators among ``entries``, each with the time it takes on the network
        (whether or not it counts): ``sim_seconds_metrics`` sums them."""
        return [(e, self.network.seconds(e)) for e in entries if isinstance(e, Transfer) and e.level == METRICS]

    def state_dict(self) -> dict:
        return {"times": self.times.tolist(), "idle": self.idle.tolist(), "busy": self.busy.tolist()}

    def load_state_dict(self, state: dict) -> None:
        """The clocks of :meth:`state_dict` (a checkpoint from before ``busy`` was kept: the
        compute is counted from the resumed step on)."""
        self.times, self.idle = np.array(state["times"], dtype=np.float64), np.array(state["idle"], dtype=np.float64)
        self.busy = np.array(state.get("busy", np.zeros_like(self.times)), dtype=np.float64)


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
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    speeds = Speeds.of(cfg)
    cfg.network.check_finite(nbytes, cfg.workers, step or 0.0, speeds.slow.max(), steps)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    return Clock(cfg.network, step, speeds, sync, sleeps=cfg.engine == "dist")


