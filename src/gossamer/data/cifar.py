"""CIFAR-10 and CIFAR-100 from their binary version, read with numpy (no pickle).

The binary files are fixed-size records: the label byte(s) — CIFAR-100 has two, coarse then fine
(we train on the 100 fine classes) — then 3,072 pixel bytes, the 1,024 red, green and blue
values of a 32×32 image in row-major order. Inputs are normalised per channel with the mean
and standard deviation of the training images (for CIFAR-10: 0.4914, 0.4822, 0.4465 and
0.2470, 0.2435, 0.2616), computed exactly from the pixel histograms.

Training augmentation (:class:`CropFlip`): a random 32×32 crop of the image padded with 4 black
pixels on each side, then a horizontal flip with probability 1/2 — drawn independently per
worker and per sample, for all n workers at once from the step's generator, as one gather on
the batch's device.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..registry import ConfigError
from .base import DATASETS, Dataset
from .files import FileOptions, Remote, extract, fetch, missing

IMAGE_BYTES = 3 * 32 * 32


@dataclass(frozen=True)
class CifarFiles:
    """Where a CIFAR variant's binary files come from and how its records are laid out."""

    name: str
    remote: Remote
    folder: str  # what the archive unpacks to, under data_dir
    train: tuple[str, ...]
    test: str
    label_bytes: int  # the label used is the last of them
    classes: int

    @property
    def members(self) -> list[str]:
        return [f"{self.folder}/{f}" for f in (*self.train, self.test)]


CIFAR = {
    "cifar10": CifarFiles("CIFAR-10", Remote("https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz",
                                             "md5:c32a1d4ab5d03f1284b67883e8d87530"),
                          "cifar-10-batches-bin", tuple(f"data_batch_{i}.bin" for i in range(1, 6)),
                          "test_batch.bin", 1, 10),
    "cifar100": CifarFiles("CIFAR-100", Remote("https://www.cs.toronto.edu/~kriz/cifar-100-binary.tar.gz",
                                               "md5:03b5dce01913d631647c71ecec9e9cb8"),
                           "cifar-100-binary", ("train.bin",), "test.bin", 2, 100),
}


def read_records(path: Path, files: CifarFiles) -> tuple[np.ndarray, np.ndarray]:
    """(images uint8 [N, 3, 32, 32], labels int64 [N]) of one binary file."""
    record = files.label_bytes + IMAGE_BYTES
    raw = np.fromfile(path, dtype=np.uint8)
    if raw.size == 0 or raw.size % record:
        raise ConfigError(f"{path} is not a {files.name} binary file: {raw.size} bytes is not a positive "
                          f"multiple of the {record}-byte record")
    records = raw.reshape(-1, record)
    labels = records[:, files.label_bytes - 1].astype(np.int64)
    if labels.max() >= files.classes:
        raise ConfigError(f"{path} has label {labels.max()}; {files.name} has {files.classes} classes")
    return records[:, files.label_bytes :].reshape(-1, 3, 32, 32), labels


def _read(paths: list[Path], files: CifarFiles) -> tuple[np.ndarray, np.ndarray]:
    parts = [read_records(p, files) for p in paths]
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def channel_stats(images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel mean and standard deviation of uint8 images in [0, 1] units, exact (histograms)."""
    values = np.arange(256) / 255.0
    hist = np.stack([np.bincount(images[:, c].ravel(), minlength=256) for c in range(images.shape[1])])
    count = hist.sum(1)
    mean = hist @ values / count
    var = hist @ values**2 / count - mean**2
    return mean, np.sqrt(var)


CHANNELS = ("red", "green", "blue")


def _check_channels(images: np.ndarray, files: CifarFiles, root: Path) -> None:
    """Refuse training images with a constant channel: its standard deviation, which normalisation
    divides by, is 0."""
    low, high = images.min((0, 2, 3)), images.max((0, 2, 3))
    for name, lo, hi in zip(CHANNELS, low, high):
        if lo == hi:
            raise ConfigError(f"data_dir '{str(root)[:100]}': the {files.name} training images have a constant {name} "
                              f"channel (every pixel {lo}), which per-channel normalisation cannot scale; are they "
                              f"real {files.name} files?")


@dataclass(frozen=True)
class CropFlip:
    """Random crop with ``padding`` black pixels and horizontal flip, per worker and per sample.

    ``fill`` is a black pixel's value per channel after normalisation. For x [m, b, C, H, W] of
    workers ``rows`` (of n): draws offsets (o_y, o_x) ∈ [0, 2·padding]² and flips for all n·b
    samples, keeps those of ``rows``, and returns out[i, j] = padded[o_y + i, o_x + j'] with
    j' = W − 1 − j when flipped (crop, then flip: torchvision's RandomCrop + RandomHorizontalFlip).
    """

    fill: tuple[float, ...]
    padding: int = 4

    def __call__(self, x: torch.Tensor, rows: range, n: int, rng: np.random.Generator) -> torch.Tensor:
        m, b, C, H, W = x.shape
        p, device = self.padding, x.device
        mine = slice(rows.start, rows.stop)
        offsets = torch.from_numpy(rng.integers(0, 2 * p + 1, (n, b, 2))[mine]).to(device)
        flips = torch.from_numpy(rng.integers(0, 2, (n, b, 1))[mine].astype(bool)).to(device)
        N = m * b
        padded = _channel_values(self.fill, device, x.dtype).expand(N, C, H + 2 * p, W + 2 * p).clone()
        padded[:, :, p : p + H, p : p + W] = x.reshape(N, C, H, W)
        i, j = torch.arange(H, device=device), torch.arange(W, device=device)
        ys = offsets[..., 0].reshape(N, 1) + i
        xs = offsets[..., 1].reshape(N, 1) + torch.where(flips.reshape(N, 1), W - 1 - j, j)
        n_idx = torch.arange(N, device=device).view(N, 1, 1, 1)
        c_idx = torch.arange(C, device=device).view(1, C, 1, 1)
        out = padded[n_idx, c_idx, ys.view(N, 1, H, 1), xs.view(N, 1, 1, W)]
        return out.view(m, b, C, H, W)


@functools.cache
def _channel_values(values: tuple[float, ...], device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """Per-channel values as [1, C, 1, 1] on ``device``: copied there once, not every step."""
    return torch.tensor(values, dtype=dtype).view(1, -1, 1, 1).to(device)


def load_cifar(files: CifarFiles, options: FileOptions) -> Dataset:
    """Read (and when missing and allowed, download, check and unpack) a CIFAR variant."""
    root = options.root
    paths = [root / m for m in files.members]
    if not all(p.is_file() for p in paths):
        what = f"{files.name} ({files.folder}/ of the binary version)"
        if not options.download:
            raise missing(what, root, files.remote)
        archive = fetch(files.remote, root / files.remote.filename, what)
        extract(archive, files.members, root)
        archive.unlink()
    x_train, y_train = _read(paths[:-1], files)
    x_test, y_test = _read(paths[-1:], files)
    _check_channels(x_train, files, root)
    mean, std = channel_stats(x_train)

    def normalise(images: np.ndarray) -> torch.Tensor:
        x = torch.from_numpy(images).to(torch.float32).div_(255)
        return x.sub_(torch.tensor(mean, dtype=torch.float32).view(1, 3, 1, 1)).div_(
            torch.tensor(std, dtype=torch.float32).view(1, 3, 1, 1))

    return Dataset(normalise(x_train), torch.from_numpy(y_train), normalise(x_test), torch.from_numpy(y_test),
                   files.classes, augment=CropFlip(tuple(float(v) for v in -mean / std)))


@DATASETS.register("cifar10", options=FileOptions,
                   help="CIFAR-10 (binary version; downloaded once), 32×32 images, 10 classes, crop + flip")
def _cifar10(cfg) -> Dataset:
    return load_cifar(CIFAR["cifar10"], cfg.options["dataset"])


@DATASETS.register("cifar100", options=FileOptions,
                   help="CIFAR-100 (binary version; downloaded once), 100 fine classes, crop + flip")
def _cifar100(cfg) -> Dataset:
    return load_cifar(CIFAR["cifar100"], cfg.options["dataset"])
