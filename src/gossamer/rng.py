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

- :func:`host_stream`: the numpy generator of a stream;
- :func:`stream_seed`: its seed as one integer (for a library that takes one: networkx);
- :func:`epoch_generator`: the torch generator of the ``epoch`` stream.
"""

from __future__ import annotations

import zlib

import numpy as np
import torch

# name → (what it draws, the keys it is drawn with besides the seed)
STREAMS: dict[str, tuple[str, tuple[str, ...]]] = {
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
    "sign": ("sign's fair coin for a coordinate that did not move", ("round", "worker")),
    "qsgd": ("qsgd's stochastic rounding", ("round", "worker")),
    "quant": ("quant's stochastic rounding", ("round", "worker")),
    "random-k": ("random-k's coordinates, alike on every worker", ("round", "tensor")),
    "sparta": ("SPARTA's averaged coordinates, alike on every worker", ("round", "tensor")),
    "slow-workers": ("the workers slow_workers makes slow", ()),
    "jitter": ("compute_jitter's factor of a worker's step", ("step", "worker")),
    "churn": ("faults.churn's departures and stays of a step", ("step",)),
    "ad-psgd-neighbour": ("AD-PSGD's neighbour of a worker's event", ("count", "worker")),
    "topology-round": ("a random topology's W_t (from topology_seed)", ("round",)),
    "equistatic": ("EquiTopo's static shifts (from topology_seed)", ()),
    "graph": ("a random static graph (random-regular, erdos-renyi; from topology_seed)", ("attempt",)),
}
_LEGACY_MIX = 1_000_003  # the epoch stream's seed: seed·1000003 + epoch (mod 2^63)


def declare(name: str, what: str, keys: tuple[str, ...]) -> str:
    """Add stream ``name`` to :data:`STREAMS` (refused if the name, or its id, is taken); returns it."""
    if name in STREAMS or zlib.crc32(name.encode()) in {zlib.crc32(n.encode()) for n in STREAMS}:
        raise RuntimeError(f"random stream '{name}' declared twice")
    STREAMS[name] = (what, tuple(keys))
    return name


def _sequence(name: str, seed: int, keys: tuple[int, ...]) -> np.random.SeedSequence:
    if name not in STREAMS:
        raise KeyError(f"unknown random stream '{name}'; the streams are: {', '.join(STREAMS)}")
    shape = STREAMS[name][1]
    if len(keys) != len(shape):
        raise ValueError(f"random stream '{name}' is drawn with keys {shape}, got {len(keys)} keys")
    if name == "epoch":
        raise ValueError("the epoch stream is torch's generator: epoch_generator(seed, epoch)")
    return np.random.SeedSequence(int(seed) % 2**64, spawn_key=(zlib.crc32(name.encode()), *map(int, keys)))


def host_stream(name: str, seed: int, *keys: int) -> np.random.Generator:
    """The numpy generator of stream ``name`` for the run's ``seed`` and the stream's ``keys``."""
    return np.random.default_rng(_sequence(name, seed, keys))


def stream_seed(name: str, seed: int, *keys: int) -> int:
    """A 128-bit integer seed of stream ``name`` (for a library that seeds itself from an integer)."""
    low, high = _sequence(name, seed, keys).generate_state(2, np.uint64)
    return int(high) << 64 | int(low)


def epoch_generator(seed: int, epoch: int) -> torch.Generator:
    """The ``epoch`` stream: torch's generator seeded with seed·1000003 + epoch (mod 2^63)."""
    return torch.Generator().manual_seed((int(seed) * _LEGACY_MIX + int(epoch)) % 2**63)
