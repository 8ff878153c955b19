"""Data sets read from files: where the files live, and fetching them once, checked.

``data_dir`` (an option of every such data set) defaults to ``$GOSSAMER_DATA``, else
``~/.cache/gossamer/data`` (under ``$GOSSAMER_CACHE`` when that is set). A missing file is
downloaded from its home page when ``download`` is true and checked against its published
checksum before it is kept; offline, or with ``download: false``, the error says where to put it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tarfile
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from ..registry import ConfigError
from .base import default_cache_dir


def default_data_dir() -> Path:
    """$GOSSAMER_DATA if set, else the ``data`` folder of the cache (~/.cache/gossamer/data)."""
    return Path(os.environ.get("GOSSAMER_DATA", default_cache_dir() / "data"))


@dataclass
class FileOptions:
    """The options of a data set read from files."""

    data_dir: str | None = None  # None: $GOSSAMER_DATA, else ~/.cache/gossamer/data
    download: bool = True  # fetch missing files from the data set's home page

    def validate(self, cfg) -> None:
        root = self.root
        if root.exists() and not root.is_dir():
            raise ConfigError(f"data_dir '{root}' is a file, not a directory")

    @property
    def root(self) -> Path:
        return Path(self.data_dir).expanduser() if self.data_dir is not None else default_data_dir()


@dataclass(frozen=True)
class Remote:
    """A file on a data set's home page and its published checksum (``"md5:HEX"``, ``"sha256:HEX"``)."""

    url: str
    checksum: str

    @property
    def filename(self) -> str:
        return self.url.rsplit("/", 1)[-1]


def checksum(path: Path, algorithm: str) -> str:
    digest = hashlib.new(algorithm)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def fetch(remote: Remote, dest: Path, what: str) -> Path:
    """Download ``remote`` to ``dest`` (atomically) and check its checksum; a failure is a
    ConfigError naming ``what`` is missing and where to put it."""
    algorithm, expected = remote.checksum.split(":")
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, suffix=".part")
    try:
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(remote.url, timeout=60) as response:
            shutil.copyfileobj(response, out)
        got = checksum(Path(tmp), algorithm)
        if got != expected:
            raise ConfigError(f"the download of {remote.url} has {algorithm.upper()} {got}, expected {expected} "
                              f"(corrupt or changed; nothing was kept); put {what} in {dest.parent} by hand")
        os.replace(tmp, dest)
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", None) or e
        raise ConfigError(f"{what} is not in {dest.parent} and downloading {remote.url} failed ({reason}); "
                          f"put it there, or set data_dir (or GOSSAMER_DATA) to where it is") from None
    finally:
        Path(tmp).unlink(missing_ok=True)
    return dest


def missing(what: str, where: Path, remote: Remote) -> ConfigError:
    """The error for a file that is not there and may not be downloaded (``download: false``)."""
    return ConfigError(f"{what} is not in {where} and download is false; put it there (from {remote.url}), "
                       f"or set download: true")


def extract(archive: Path, members: list[str], into: Path) -> None:
    """Extract exactly the named regular files of a .tar.gz (nothing else, no paths outside ``into``)."""
    try:
        with tarfile.open(archive, "r:gz") as tar:
            found = {m.name: m for m in tar.getmembers() if m.isfile()}
            absent = [name for name in members if name not in found]
            if absent:
                raise ConfigError(f"{archive} lacks {absent[0]}: not the expected archive")
            for name in members:
                target = into / name
                target.parent.mkdir(parents=True, exist_ok=True)
                part = target.with_name(target.name + ".part")
                with tar.extractfile(found[name]) as src, open(part, "wb") as dst:
                    shutil.copyfileobj(src, dst)
                os.replace(part, target)  # a file that is there is whole
    except (tarfile.TarError, OSError) as e:
        raise ConfigError(f"could not unpack {archive}: {e}") from None
