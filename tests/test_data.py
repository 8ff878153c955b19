import pytest
import torch

from gossamer.config import ConfigError, load_config
from gossamer.data import DATASETS, load_dataset
from gossamer.data.mnist1d import load_mnist1d
from gossamer.data.partition import (
    dirichlet_shards,
    iid_epoch_indices,
    shard_epoch_indices,
    steps_per_epoch,
)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def small(cache):
    return load_mnist1d(num_samples=500, seed=0, cache_dir=cache)


def test_shapes_dtypes_classes(small):
    assert small.x_train.shape == (400, 1, 40) and small.x_test.shape == (100, 1, 40)
    assert small.x_train.dtype == torch.float32 and small.y_train.dtype == torch.int64
    assert small.y_train.shape == (400,) and small.y_test.shape == (100,)
    assert small.num_classes == 10
    assert set(small.y_train.tolist()) == set(range(10))


def test_cache_roundtrip(small, cache):
    assert (cache / "mnist1d_n500_s0.npz").exists()
    assert not list(cache.glob("*.tmp"))
    again = load_mnist1d(num_samples=500, seed=0, cache_dir=cache)
    for name in ("x_train", "y_train", "x_test", "y_test"):
        assert torch.equal(getattr(small, name), getattr(again, name))


def test_standard_split():
    ds = load_dataset(load_config(None, ["num_samples=5000"]))  # uses the default cache
    assert len(ds.x_train) == 4000 and len(ds.x_test) == 1000


def test_unknown_dataset():
    assert "mnist1d" in DATASETS
    with pytest.raises(ConfigError, match="unknown dataset 'x'; choose one of: mnist1d"):
        load_config(None, ["dataset=x"])


def test_steps_per_epoch():
    assert steps_per_epoch(4000, 8, 32) == 15
    with pytest.raises(ValueError, match="batch_size"):
        steps_per_epoch(100, 8, 32)


def test_iid_indices():
    n, b = 4, 10
    idx = iid_epoch_indices(1003, n, b, epoch=0, seed=1)
    steps = (1003 // n) // b
    assert idx.shape == (steps, n, b) and idx.dtype == torch.int64
    flat = idx.flatten()
    assert flat.unique().numel() == n * steps * b  # disjoint and covering
    assert flat.min() >= 0 and flat.max() < 1003
    assert torch.equal(idx, iid_epoch_indices(1003, n, b, epoch=0, seed=1))
    assert not torch.equal(idx, iid_epoch_indices(1003, n, b, epoch=1, seed=1))
    assert not torch.equal(idx, iid_epoch_indices(1003, n, b, epoch=0, seed=2))


def _labels(per_class=100, classes=10):
    return torch.arange(classes).repeat_interleave(per_class)


def test_dirichlet_partition_and_determinism():
    y = _labels()
    shards = dirichlet_shards(y, 8, alpha=0.5, seed=3, min_size=5)
    assert len(shards) == 8 and all(len(s) >= 5 for s in shards)
    allidx = torch.cat(shards)
    assert allidx.numel() == len(y) and torch.equal(allidx.sort().values, torch.arange(len(y)))
    again = dirichlet_shards(y, 8, alpha=0.5, seed=3, min_size=5)
    assert all(torch.equal(a, b) for a, b in zip(shards, again))


def _top_class_fraction(y, shard):
    return torch.bincount(y[shard], minlength=10).max().item() / len(shard)


def test_dirichlet_skew():
    y = _labels()
    skewed = [dirichlet_shards(y, 10, alpha=0.05, seed=seed, min_size=1) for seed in range(4)]
    assert sum(_top_class_fraction(y, s) > 0.5 for shards in skewed for s in shards) >= 24  # of 40
    uniform = dirichlet_shards(y, 10, alpha=1000.0, seed=0, min_size=1)
    assert all(_top_class_fraction(y, s) < 0.2 for s in uniform)
    assert all(80 <= len(s) <= 120 for s in uniform)


def test_dirichlet_impossible():
    with pytest.raises(ValueError, match="dirichlet_alpha"):
        dirichlet_shards(_labels(), 10, alpha=0.5, seed=0, min_size=200)


def test_shard_epoch_indices():
    y = _labels()
    shards = dirichlet_shards(y, 4, alpha=0.3, seed=1, min_size=5)
    steps, b = 30, 16  # more than most shards hold, so shards get tiled
    idx = shard_epoch_indices(shards, steps, b, epoch=0, seed=7)
    assert idx.shape == (steps, 4, b) and idx.dtype == torch.int64
    for i, s in enumerate(shards):
        assert torch.isin(idx[:, i], s).all()
    assert torch.equal(idx, shard_epoch_indices(shards, steps, b, epoch=0, seed=7))
    assert not torch.equal(idx, shard_epoch_indices(shards, steps, b, epoch=1, seed=7))
