"""Named random streams (gossamer.rng): every stream at the key shape it is drawn with gives its own
generator — no two streams, and no two keys (or rows) of one stream, draw the same numbers — a row
stream's row is the same numbers however the rows are drawn, and no module seeds a generator of its
own."""

import itertools
import re
from pathlib import Path

import numpy as np
import pytest
import torch

import gossamer.algorithms  # noqa: F401  (modules that declare streams of their own)
from gossamer.rng import STREAMS, declare, epoch_generator, host_stream, row_normals, row_uniforms, stream_seed

SRC = Path(__file__).resolve().parent.parent / "src" / "gossamer"
SEEDS = (0, 1, 2**44 - 1)
KEYS = (0, 1, 2, 29)  # 29: the old constant of the validation split and of churn


def fingerprint(rng: np.random.Generator) -> tuple[int, ...]:
    return tuple(rng.integers(0, 2**63, size=4).tolist())


def draws(name: str, seed: int, key: tuple[int, ...]) -> tuple[int, ...]:
    """4 integers of stream ``name`` at (seed, key): a plain stream's first, or a row stream's row key[-1]."""
    if STREAMS[name].row is None:
        return tuple(host_stream(name, seed, *key).integers(0, 2**63, size=4).tolist())
    u = row_uniforms(name, seed, *key[:-1], rows=[key[-1]], width=4)[0]
    return tuple((u * 2**53).astype(np.int64).tolist())


def test_every_stream_at_every_key_draws_its_own_numbers():
    seen: dict[tuple, tuple] = {}
    shapes = {name: (*s.keys, *([s.row] if s.row else [])) for name, s in STREAMS.items() if name != "epoch"}
    for name, keys in shapes.items():
        for seed in SEEDS:
            for key in itertools.product(KEYS, repeat=len(keys)):
                drawn = draws(name, seed, key)
                assert drawn not in seen, f"{name}{(seed, *key)} draws what {seen[drawn]} draws"
                seen[drawn] = (name, seed, *key)
    assert len(seen) == sum(len(SEEDS) * len(KEYS) ** len(k) for k in shapes.values())
    assert {name for name, s in STREAMS.items() if s.row} >= {"sign", "qsgd", "quant", "jitter", "ad-psgd-neighbour",
                                                             "byzantine-noise"}


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_a_row_is_its_place_in_the_keys_generator_however_the_rows_are_drawn(dtype):
    """Row i of width w is values i·w' … (i+1)·w' − 1 of the keys' one generator (w' = w for float64,
    ⌈w/2⌉ PCG64 values for float32), reached by jump-ahead: a block of rows, the rows one by one, in
    any order or split across processes, and a plain sequential draw all agree bit for bit."""
    n, w = 9, 5
    block = row_uniforms("qsgd", 3, 7, rows=range(n), width=w, dtype=dtype)
    assert block.dtype == dtype and block.shape == (n, w)
    assert np.array_equal(block, np.concatenate([row_uniforms("qsgd", 3, 7, rows=[i], width=w, dtype=dtype)
                                                 for i in range(n)]))
    order = [8, 2, 3, 4, 0, 7]  # runs of consecutive rows in any order
    assert np.array_equal(block[order], row_uniforms("qsgd", 3, 7, rows=order, width=w, dtype=dtype))
    assert np.array_equal(block[4:], row_uniforms("qsgd", 3, 7, rows=range(4, n), width=w, dtype=dtype))
    drawn = 2 * -(-w // 2) if dtype == np.float32 else w
    sequential = row_uniforms("qsgd", 3, 7, rows=[0], width=n * drawn, dtype=dtype).reshape(n, drawn)[:, :w]
    assert np.array_equal(block, sequential)
    assert 0 <= block.min() and block.max() < 1


def test_row_normals_are_box_muller_of_the_rows_uniforms_and_standard():
    u = row_uniforms("jitter", 1, 4, rows=range(3), width=6)
    z = row_normals("jitter", 1, 4, rows=range(3), width=3)
    assert np.array_equal(z, np.sqrt(-2 * np.log1p(-u[:, 0::2])) * np.cos(2 * np.pi * u[:, 1::2]))
    many = row_normals("jitter", 0, 0, rows=range(200), width=1000).ravel()  # 2·10⁵ draws
    assert abs(many.mean()) < 0.01 and abs(many.std() - 1) < 0.01  # 4.5σ bounds: σ_mean = 0.0022
    assert abs((many < 1).mean() - 0.841345) < 0.004  # Φ(1)


def test_a_row_block_of_many_workers_is_one_generator():
    """16,384 workers' rows in one call build one SeedSequence (the cost the row streams remove)."""
    calls = []
    real = np.random.SeedSequence

    class Counting(real):
        def __init__(self, *args, **kwargs):
            calls.append(1)
            super().__init__(*args, **kwargs)
    np.random.SeedSequence = Counting
    try:
        row_uniforms("sign", 0, 1, rows=range(16384), width=3, dtype=np.float32)
    finally:
        np.random.SeedSequence = real
    assert len(calls) == 1


def test_the_epoch_stream_keeps_its_derivation_and_the_model_initialisation_is_torchs_own():
    """The i.i.d. shuffle of epoch e is torch's generator seeded with seed·1000003 + e, as in every
    run recorded before the named streams. The model's initialisation draws from torch's global
    generator seeded with the run's seed: the other torch generator of a run. Within a run, the
    one coincidence is the documented one: at seed 0, epoch 0's shuffle and the initialisation."""
    def first(g: torch.Generator) -> tuple[int, ...]:
        return tuple(torch.randint(0, 2**62, (4,), generator=g).tolist())
    assert torch.equal(torch.randperm(50, generator=epoch_generator(7, 3)),
                       torch.randperm(50, generator=torch.Generator().manual_seed(7 * 1_000_003 + 3)))
    shared = []
    for seed in SEEDS:
        drawn = {"init": first(torch.Generator().manual_seed(seed)),
                 **{("epoch", e): first(epoch_generator(seed, e)) for e in range(200)}}
        assert len(set(drawn.values())) >= len(drawn) - 1
        shared += [(seed, who) for who, value in drawn.items() if who != "init" and value == drawn["init"]]
    assert shared == [(0, ("epoch", 0))]


def test_a_stream_is_drawn_with_its_keys_and_a_name_is_declared_once():
    with pytest.raises(ValueError, match="is drawn with keys"):
        host_stream("churn", 0)
    with pytest.raises(KeyError, match="unknown random stream"):
        host_stream("no-such-stream", 0)
    with pytest.raises(RuntimeError, match="declared twice"):
        declare("churn", "again", ("step",))
    with pytest.raises(ValueError, match="drawn by rows"):
        host_stream("qsgd", 0, 1)
    with pytest.raises(ValueError, match="not a row stream"):
        row_uniforms("churn", 0, 1, rows=[0], width=1)
    with pytest.raises(ValueError, match="rows are workers"):
        row_uniforms("qsgd", 0, 1, rows=[-1], width=1)
    assert stream_seed("churn", 3, 5) == stream_seed("churn", 3, 5) != stream_seed("churn", 3, 6)


# where a module seeds a generator itself, and why that is not a stream of the run
OWN_SEEDS = {
    ("train.py", "torch.manual_seed(cfg.seed)"): "the model's initialisation: PyTorch's initialisers read the global generator",
    ("train.py", "default_generator.manual_seed(cfg.seed)"): "the same on the cpu, leaving the cuda generators alone",
    ("analysis.py", "np.random.default_rng(0)"): "the start vector of a graph's spectral analysis, the same for every run",
    ("mixing.py", "np.random.default_rng(0)"): "the start vector of a mixing matrix's norm (its sparse iteration), the same for every run",
    ("testing.py", "torch.manual_seed(cfg.seed if seed is None else seed)"):
        "the conformance kit's user loop: the model's initialisation as train.py seeds it",
}


TORCH_DRAWS = {"rand", "randn", "randint", "randperm", "normal", "bernoulli", "multinomial", "poisson", "rand_like",
               "randn_like", "randint_like"}
NOT_DRAWS = {"getstate", "setstate", "get_state", "set_state", "Random", "default_rng", "Generator", "SeedSequence",
             "PCG64"}


def test_every_draw_comes_from_a_named_generator():
    """Every torch draw in the package passes its ``generator=`` (a stream of :mod:`gossamer.rng`), and
    nothing draws from numpy's or Python's global generator (saving and restoring their state around
    an upstream generator is not a draw): an unseeded ``torch.rand(3)`` or ``np.random.normal()``
    fails here (issue 45, item 22: the test above greps for seeding calls only)."""
    import ast

    unseeded = []
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            name, attr = ast.unparse(node.func), node.func.attr
            torch_draw = name.startswith("torch.") and attr in TORCH_DRAWS and \
                not any(k.arg == "generator" for k in node.keywords)
            global_draw = name.startswith(("np.random.", "numpy.random.", "random.")) and attr not in NOT_DRAWS and \
                not name.startswith(("np.random.default_rng(", "numpy.random.default_rng("))
            if torch_draw or global_draw:
                unseeded.append(f"{path.name}:{node.lineno} {ast.unparse(node)[:80]}")
    assert unseeded == []


def test_no_module_seeds_a_generator_of_its_own():
    pattern = re.compile(r"(torch\.manual_seed\([^)]*\)|np\.random\.default_rng\([^)]*\)|SeedSequence\(|"
                         r"torch\.Generator\(|random\.seed\(|np\.random\.seed\(|default_generator\.manual_seed\([^)]*\))")
    found = {(path.name, match.group(0)) for path in SRC.rglob("*.py") if path.name != "rng.py"
             for match in pattern.finditer(path.read_text())}
    assert found == set(OWN_SEEDS)
