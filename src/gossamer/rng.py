"""Named random streams: every random draw of a run comes from the generator of (stream, seed, keys),
never from a global generator, so every engine and a resumed run draw exactly alike, and no two
streams draw the same numbers.

:data:`STREAMS` is the one table of stream names, each with what it draws and the keys it is drawn
with; a module added later (an algorithm, a plugin) adds its own with :func:`declare`, next to
where it draws. A stream's generator is numpy's PCG64 seeded with ``SeedSequence(seed,
spawn_key=(stream id, *keys))``: the stream id (a hash of its name) separates the domains, the
keys the draws within one — SeedSequence's hashing, whose outputs are independent for different
spawn keys, into a 128-bit state. Draws that end on a device are made on the host and copied
(torch's CPU generator would keep only 32 bits of a seed: two draws in a long run would share
one). One stream keeps its first derivation so that runs keep their numbers: ``epoch``, the
i.i.d. partition's shuffle, is torch's generator seeded with seed·1000003 + epoch. The model's
initialisation is PyTorch's own: its initialisers draw from torch's global generator, seeded with
the run's seed before the model is built (at seed 0 that is epoch 0's generator; the two draw for
different purposes, and changing either would change every recorded run).

**Row streams** draw for many workers at once. A stream declared with a ``row`` key (``worker``)
gives worker i's draws of one set of keys (a round, a step) at a position of that keys' one
generator instead of a generator of its own: row i of width w is the generator's values
i·w … (i+1)·w − 1, reached by PCG64's jump-ahead (``advance``, O(log) in the distance). The
rows of n workers are then one generator and one draw, not n SeedSequence hashings (tens of µs
each, before anything is drawn); any process draws any rows and gets the same numbers, in
any order, since a row's draws depend on its keys alone. A row stream is drawn with
:func:`row_uniforms` and :func:`row_normals`, never with :func:`host_stream`.

- :func:`host_stream`: the numpy generator of a stream;
- :func:`row_uniforms`, :func:`row_normals`: rows of a row stream;
- :func:`stream_seed`: its seed as one integer (for a library that takes one: networkx);
- :func:`epoch_generator`: the torch generator of the ``epoch`` stream.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import Iterable

import numpy as np
import torch


@dataclass(frozen=True)
class Stream:
    """One entry of :data:`STREAMS`."""

    what: str  # what it draws
    keys: tuple[str, ...]  # the keys of its generator besides the seed
    row: str | None = None  # a row stream: the key that picks a row (the worker); None: a plain stream


def _streams(table: dict) -> dict[str, Stream]:
    return {name: Stream(*entry) for name, entry in table.items()}


STREAMS: dict[str, Stream] = _streams({
    "epoch": ("the i.i.d. partition's shuffle of an epoch's training set", ("epoch",)),
    "shard-shuffle": ("a Dirichlet shard's reshuffle in an epoch", ("epoch", "worker")),
    "dirichlet": ("the Dirichlet split of each class among the workers", ("attempt",)),
    "validation": ("the validation split held out of the training set", ()),
    "augment": ("every worker's augmentation of a step's batch (an event-driven schedule: of a batched call)",
                ("draw",)),
    "recompute": ("bn_eval recompute's training batches before an evaluation", ("step",)),
    "recompute-augment": ("their augmentation", ("step", "batch")),
    "eval-local": ("the local models eval_local: K evaluates", ()),
    "sharpness-subset": ("the training samples sharpness is taken on", ()),
    "sharpness-start": ("the start vector of sharpness's power iteration", ("step",)),
    "sign": ("sign's fair coin for a coordinate that did not move", ("round",), "worker"),
    "qsgd": ("qsgd's stochastic rounding", ("round",), "worker"),
    "quant": ("quant's stochastic rounding", ("round",), "worker"),
    "random-k": ("random-k's coordinates, alike on every worker", ("round", "tensor")),
    "sparta": ("SPARTA's averaged coordinates, alike on every worker", ("round", "tensor")),
    "slow-workers": ("the workers slow_workers makes slow", ()),
    "jitter": ("compute_jitter's factor of a worker's step", ("step",), "worker"),
    "churn": ("faults.churn's departures and stays of a step", ("step",)),
    "ad-psgd-neighbour": ("AD-PSGD's neighbour of a worker's event", ("count",), "worker"),
    "topology-round": ("a random topology's W_t (from topology_seed)", ("round",)),
    "equistatic": ("EquiTopo's static shifts (from topology_seed)", ()),
    "graph": ("a random static graph (random-regular, erdos-renyi; from topology_seed)", ("attempt",)),
})
_LEGACY_MIX = 1_000_003  # the epoch stream's seed: seed·1000003 + epoch (mod 2^63)


def declare(name: str, what: str, keys: tuple[str, ...], row: str | None = None) -> str:
    """Add a named random stream to :data:`STREAMS`, next to where it is drawn (a name, or id, taken is refused).

    Args:
        name (str): the stream's name.
        what (str): what it draws, one line.
        keys (tuple[str, ...]): the keys it is drawn with besides the seed (``("round",)``).
        row (str | None): a row stream's row key (``"worker"``), drawn with :func:`row_uniforms`
            and :func:`row_normals`; None: a plain stream, drawn with :func:`host_stream`.

    Returns:
        str: ``name``.

    Example::

        >>> from gossamer.extend import declare, host_stream
        >>> COINS = declare("my-coins", "my plugin's coin of a round", ("round",))
        >>> host_stream(COINS, 0, 3).random() == host_stream(COINS, 0, 3).random()  # seed 0, round 3
        True
    """
    if name in STREAMS or zlib.crc32(name.encode()) in {zlib.crc32(n.encode()) for n in STREAMS}:
        raise RuntimeError(f"random stream '{name}' declared twice")
    STREAMS[name] = Stream(what, tuple(keys), row)
    return name


def _sequence(name: str, seed: int, keys: tuple[int, ...], rows: bool = False) -> np.random.SeedSequence:
    if name not in STREAMS:
        raise KeyError(f"unknown random stream '{name}'; the streams are: {', '.join(STREAMS)}")
    stream = STREAMS[name]
    if len(keys) != len(stream.keys):
        raise ValueError(f"random stream '{name}' is drawn with keys {stream.keys}, got {len(keys)} keys")
    if name == "epoch":
        raise ValueError("the epoch stream is torch's generator: epoch_generator(seed, epoch)")
    if rows != (stream.row is not None):
        raise ValueError(f"random stream '{name}' is " + (f"drawn by rows ({stream.row}): row_uniforms, row_normals"
                                                        if stream.row else "not a row stream: host_stream"))
    return np.random.SeedSequence(int(seed) % 2**64, spawn_key=(zlib.crc32(name.encode()), *map(int, keys)))


def host_stream(name: str, seed: int, *keys: int) -> np.random.Generator:
    """The numpy generator of a plain stream for the run's seed and the stream's keys.

    Args:
        name (str): the stream (:func:`declare`).
        seed (int): the run's seed.
        *keys (int): its keys' values, as many as it declares (a round, a step).

    Returns:
        Generator: numpy's generator of (stream, seed, keys): the same numbers on every engine
        and process, and after a resume.

    Example::

        >>> from gossamer.extend import host_stream
        >>> host_stream("churn", 0, 7).permutation(5).shape  # the churn stream, seed 0, step 7
        (5,)
    """
    return np.random.default_rng(_sequence(name, seed, keys))


CHUNK = 1 << 22  # values one call draws at most (bounds the temporaries of a large block)


def row_uniforms(name: str, seed: int, *keys: int, rows: Iterable[int], width: int,
                 dtype: type = np.float64) -> np.ndarray:
    """U[0, 1) draws of a row stream: a row per worker, each worker's the same whichever rows are drawn with it.

    A float64 takes one PCG64 value (its top 53 bits), a float32 half of one (numpy's
    ``Generator.random``); a row of odd width takes a whole number of values.

    Args:
        name (str): a row stream (:func:`declare` with ``row``).
        seed (int): the run's seed.
        *keys (int): its keys' values.
        rows (Iterable[int]): the workers drawn for.
        width (int): the draws a worker.
        dtype (type): ``np.float64`` or ``np.float32``.

    Returns:
        ndarray: [len(rows), width], row k worker rows[k]'s.

    Example::

        >>> import numpy as np
        >>> from gossamer.extend import row_uniforms
        >>> four = row_uniforms("quant", 0, 2, rows=range(4), width=3)  # the quant stream, seed 0, round 2
        >>> np.array_equal(four[2:], row_uniforms("quant", 0, 2, rows=[2, 3], width=3))
        True
    """
    rows = (np.arange(rows.start, rows.stop, rows.step) if isinstance(rows, range) else
            np.asarray(rows if isinstance(rows, np.ndarray) else list(rows), dtype=np.int64).reshape(-1))
    if len(rows) and rows.min() < 0:
        raise ValueError(f"random stream '{name}': rows are workers, ≥ 0; got {int(rows.min())}")
    dtype = np.dtype(dtype)
    halves = dtype == np.float32
    span = -(-width // 2) if halves else width  # PCG64 values a row takes
    drawn = 2 * span if halves else width  # values of dtype drawn a row (the odd one's last is dropped)
    out = np.empty((len(rows), width), dtype=dtype)
    bits = np.random.PCG64(_sequence(name, seed, keys, rows=True))
    start, generator = bits.state, np.random.Generator(bits)
    breaks = np.flatnonzero(np.diff(rows) != 1) + 1
    step = max(1, CHUNK // max(drawn, 1))
    for first, end in zip([0, *breaks.tolist()], [*breaks.tolist(), len(rows)]):  # runs of consecutive rows
        bits.state = start
        bits.advance(int(rows[first]) * span)
        for a in range(first, end, step):
            b = min(a + step, end)
            out[a:b] = generator.random((b - a) * drawn, dtype=dtype).reshape(b - a, drawn)[:, :width]
    return out


def row_normals(name: str, seed: int, *keys: int, rows: Iterable[int], width: int) -> np.ndarray:
    """Standard normal draws of a row stream, a row per worker, by Box–Muller from the row's uniforms.

    u₁, u₂ of value j are the row's uniforms 2j and 2j + 1: z = √(−2 ln(1 − u₁))·cos(2π·u₂),
    exact in distribution and a fixed number of uniforms a value.

    Args:
        name (str): a row stream (:func:`declare` with ``row``).
        seed (int): the run's seed.
        *keys (int): its keys' values.
        rows (Iterable[int]): the workers drawn for.
        width (int): the draws a worker.

    Returns:
        ndarray: float64 [len(rows), width], row k worker rows[k]'s.

    Example::

        >>> from gossamer.extend import row_normals
        >>> row_normals("jitter", 0, 10, rows=[5], width=2).shape  # worker 5's, step 10
        (1, 2)
    """
    u = row_uniforms(name, seed, *keys, rows=rows, width=2 * width)
    return np.sqrt(-2.0 * np.log1p(-u[:, 0::2])) * np.cos(2.0 * math.pi * u[:, 1::2])


def stream_seed(name: str, seed: int, *keys: int) -> int:
    """A 128-bit integer seed of stream ``name`` (for a library that seeds itself from an integer)."""
    low, high = _sequence(name, seed, keys).generate_state(2, np.uint64)
    return int(high) << 64 | int(low)


def epoch_generator(seed: int, epoch: int) -> torch.Generator:
    """The ``epoch`` stream: torch's generator seeded with seed·1000003 + epoch (mod 2^63)."""
    return torch.Generator().manual_seed((int(seed) * _LEGACY_MIX + int(epoch)) % 2**63)
