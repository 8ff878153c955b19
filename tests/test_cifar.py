"""CIFAR-10/100 from tiny files in the real binary layout: reading, normalisation, download and
its checks, bad input, and the per-worker crop + flip augmentation."""

import hashlib
import signal
import tarfile

import numpy as np
import pytest
import torch
from test_durable import assert_same_run, stop_with

from conftest import write_cifar
from gossamer.cli import main
from gossamer.config import ConfigError, load_config
from gossamer.data import cifar, load_dataset
from gossamer.data.cifar import CropFlip, channel_stats
from gossamer.data.files import Remote


def cifar_cfg(root, *overrides, name="cifar10"):
    return load_config(None, [f"dataset={name}", f"data_dir={root}", "model=resnet20", *overrides])


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return write_cifar(tmp_path_factory.mktemp("data"), train=200, test=60)


def test_reads_the_binary_records(root):
    data = load_dataset(cifar_cfg(root))
    assert data.x_train.shape == (200, 3, 32, 32) and data.x_test.shape == (60, 3, 32, 32)
    assert data.x_train.dtype == torch.float32 and data.num_classes == 10 and data.task == "classification"
    # labels cycle over the classes within each file (40 records per training file)
    assert torch.equal(data.y_train, (torch.arange(40) % 10).repeat(5)) and torch.equal(data.y_test, torch.arange(60) % 10)
    # the pixels: record 3 of data_batch_2 (training sample 43), channel-major, undone normalisation
    raw = np.frombuffer((root / "cifar-10-batches-bin" / "data_batch_2.bin").read_bytes(), np.uint8).reshape(-1, 3073)
    images = np.concatenate([np.frombuffer((root / "cifar-10-batches-bin" / f"data_batch_{i}.bin").read_bytes(),
                                           np.uint8).reshape(-1, 3073)[:, 1:] for i in range(1, 6)])
    mean, std = channel_stats(images.reshape(-1, 3, 32, 32))
    pixel = data.x_train[43].double() * torch.tensor(std).view(3, 1, 1) + torch.tensor(mean).view(3, 1, 1)
    assert torch.allclose(pixel * 255, torch.tensor(raw[3, 1:].reshape(3, 32, 32), dtype=torch.float64), atol=1e-4)
    # per-channel normalisation with the training set's own statistics: mean 0, std 1 there
    assert data.x_train.mean((0, 2, 3)).abs().max() < 1e-5
    assert (data.x_train.double().std((0, 2, 3), unbiased=False) - 1).abs().max() < 1e-5


def test_channel_stats_are_exact():
    images = np.random.default_rng(0).integers(0, 256, (7, 3, 4, 5), dtype=np.uint8)
    mean, std = channel_stats(images)
    x = images.astype(np.float64) / 255
    np.testing.assert_allclose(mean, x.mean((0, 2, 3)), rtol=0, atol=1e-14)
    np.testing.assert_allclose(std, x.std((0, 2, 3)), rtol=0, atol=1e-12)


def test_cifar100_trains_on_the_fine_label(tmp_path):
    write_cifar(tmp_path, train=150, test=50, cifar100=True)
    data = load_dataset(cifar_cfg(tmp_path, name="cifar100"))
    assert data.num_classes == 100 and len(data.y_train) == 150
    assert torch.equal(data.y_train, torch.arange(150) % 100)  # the second label byte, not the coarse first


def _archive(tmp_path, folder_root):
    path = tmp_path / "cifar-10-binary.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        tar.add(folder_root / "cifar-10-batches-bin", arcname="cifar-10-batches-bin")
    return path


def test_download_checks_the_md5_and_unpacks(tmp_path, monkeypatch, root):
    archive = _archive(tmp_path, root)
    md5 = hashlib.md5(archive.read_bytes()).hexdigest()
    files = cifar.CIFAR["cifar10"]
    monkeypatch.setitem(cifar.CIFAR, "cifar10", files.__class__(**{**vars(files), "remote": Remote(
        archive.as_uri(), "md5:" + "0" * 32)}))
    target = tmp_path / "data"
    with pytest.raises(ConfigError, match=r"has MD5 [0-9a-f]{32}, expected 0{32}.*nothing was kept"):
        load_dataset(cifar_cfg(target))
    assert not any(target.iterdir())  # a corrupt download leaves nothing behind
    monkeypatch.setitem(cifar.CIFAR, "cifar10", files.__class__(**{**vars(files), "remote": Remote(
        archive.as_uri(), "md5:" + md5)}))
    data = load_dataset(cifar_cfg(target))
    assert len(data.y_train) == 200
    assert sorted(p.name for p in (target / "cifar-10-batches-bin").iterdir()) == \
        sorted([f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"])
    assert not (target / "cifar-10-binary.tar.gz").exists()


@pytest.mark.parametrize("overrides, fragment", [
    (["download=false"], r"CIFAR-10 \(cifar-10-batches-bin/ .*\) is not in .*download is false; put it there"),
    ([], r"is not in .* and downloading file:///nowhere/cifar.tar.gz failed .*; put it there"),
])
def test_missing_files_say_where_to_put_them(tmp_path, monkeypatch, overrides, fragment):
    files = cifar.CIFAR["cifar10"]
    monkeypatch.setitem(cifar.CIFAR, "cifar10", files.__class__(**{**vars(files), "remote": Remote(
        "file:///nowhere/cifar.tar.gz", files.remote.checksum)}))
    with pytest.raises(ConfigError, match=fragment):
        load_dataset(cifar_cfg(tmp_path / "empty", *overrides))


def test_bad_files_and_options(tmp_path, root):
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(ConfigError, match="data_dir '.*a-file' is a file, not a directory"):
        cifar_cfg(tmp_path / "a-file")
    bad = write_cifar(tmp_path / "bad", train=50, test=10)
    with open(bad / "cifar-10-batches-bin" / "test_batch.bin", "ab") as f:
        f.write(b"\0" * 7)
    with pytest.raises(ConfigError, match=r"test_batch.bin is not a CIFAR-10 binary file: 30737 bytes"):
        load_dataset(cifar_cfg(bad))
    with pytest.raises(ConfigError, match="num_samples does not apply to dataset 'cifar10'"):
        cifar_cfg(root, "num_samples=10")


# ---------------------------------------------------------------- augmentation


def _reference_crop_flip(image, dy, dx, flip, fill, padding=4):
    """One image by slicing: pad with the fill, take the window at (dy, dx), flip it."""
    C, H, W = image.shape
    padded = fill.view(C, 1, 1).expand(C, H + 2 * padding, W + 2 * padding).clone()
    padded[:, padding:-padding, padding:-padding] = image
    window = padded[:, dy : dy + H, dx : dx + W]
    return window.flip(-1) if flip else window


def test_crop_flip_is_a_padded_crop_then_a_flip_per_sample():
    fill = (-1.5, 0.25, 2.0)
    augment = CropFlip(fill)
    n, b = 3, 5
    x = torch.randn(n, b, 3, 8, 6, dtype=torch.float64)
    out = augment(x, range(n), n, np.random.default_rng(7))
    g = np.random.default_rng(7)  # the same draws, in the same order
    offsets = torch.from_numpy(g.integers(0, 9, (n, b, 2)))
    flips = torch.from_numpy(g.integers(0, 2, (n, b, 1)))
    for i in range(n):
        for j in range(b):
            ref = _reference_crop_flip(x[i, j], *offsets[i, j].tolist(), bool(flips[i, j]), torch.tensor(fill).double())
            assert torch.equal(out[i, j], ref)
    assert len({tuple(o) for o in offsets.view(-1, 2).tolist()}) > 5 and 0 < flips.sum() < n * b


def test_a_worker_gets_the_same_augmentation_whichever_engine_holds_it():
    augment, n, b = CropFlip((0.0, 0.0, 0.0)), 4, 6
    x = torch.randn(n, b, 3, 32, 32)
    full = augment(x, range(n), n, np.random.default_rng(3))
    for rows in (range(0, 2), range(2, 4), range(1, 2)):  # the blocks of 2 processes, and one worker
        part = augment(x[rows.start : rows.stop], rows, n, np.random.default_rng(3))
        assert torch.equal(part, full[rows.start : rows.stop])
    assert not torch.equal(full, augment(x, range(n), n, np.random.default_rng(4)))


def test_train_batches_are_augmented_deterministically_and_test_data_never(root):
    data = load_dataset(cifar_cfg(root))
    idx = torch.arange(16).view(4, 4)
    x1, y1 = data.train_batch(idx, range(4), np.random.default_rng(11))
    x2, _ = data.train_batch(idx, range(4), np.random.default_rng(11))
    x3, _ = data.train_batch(idx, range(4), np.random.default_rng(12))
    assert torch.equal(x1, x2) and not torch.equal(x1, x3)
    assert not torch.equal(x1, data.x_train[idx]) and torch.equal(y1, data.y_train[idx])


def test_stopped_and_resumed_cifar_run_is_the_uninterrupted_one(tmp_path, capsys, monkeypatch, root):
    """Augmentation draws (seeded by step), BatchNorm statistics (vmap's batched path) and
    statistics recomputed for x̄ resume bit for bit."""
    overrides = ["dataset=cifar10", f"data_dir={root}", "model=resnet20", "workers=2", "batch_size=8", "epochs=1",
                 "algorithm=gossip", "grad_backend=vmap", "bn_eval=recompute", "momentum=0.9", "lr=0.05"]
    args = [a for o in overrides for a in ("--set", o)]
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    assert main(["train", "--quiet", "--out", str(straight), *args]) == 0
    with monkeypatch.context() as m:
        stop_with(signal.SIGTERM, 5, m)  # in the middle of the 12-step epoch
        assert main(["train", "--quiet", "--out", str(stopped), *args]) == 143
    capsys.readouterr()
    assert main(["train", "--quiet", "--resume", str(stopped)]) == 0
    assert_same_run(straight, stopped)
