"""YAML as gossamer reads it (config files, ``--set`` values, a run's config.yaml): the safe
loader with aliases bounded (:data:`MAX_YAML_NODES`) and no key given twice; every error one
:class:`~gossamer.registry.ConfigError` line naming what was read."""

from __future__ import annotations

import copy
import functools
from collections.abc import Hashable
from pathlib import Path
from typing import Any

import yaml

from .registry import ConfigError, short


MAX_YAML_NODES = 100_000  # after expanding aliases: a few hundred bytes of anchors can stand for billions
MERGE_TAG = "tag:yaml.org,2002:merge"  # "<<: *defaults": keys that the mapping's own may override


class _RepeatedKey(yaml.YAMLError):
    """A mapping names one key twice (YAML would keep the last value silently)."""

    def __init__(self, key: Any, line: int):
        super().__init__(key, line)
        self.key, self.line = key, line


class _BoundedLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing documents whose aliases expand past :data:`MAX_YAML_NODES`
    and mappings that repeat a key (a ``<<`` merge's keys may be overridden)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node in (k for k, _ in node.value if k.tag != MERGE_TAG):
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, Hashable):
                continue  # the base class refuses it
            if key in seen:
                raise _RepeatedKey(key, key_node.start_mark.line + 1)
            seen.add(key)
        return super().construct_mapping(node, deep)

    def compose_document(self):
        node = super().compose_document()
        sizes: dict[int, int] = {}
        aliased = False

        def size(n) -> int:  # nodes after expansion; shared (aliased) nodes counted once per use
            nonlocal aliased
            aliased |= id(n) in sizes
            if id(n) not in sizes:
                sizes[id(n)] = 0  # a recursive alias counts once
                children = n.value if isinstance(n, yaml.SequenceNode) else \
                    [c for pair in n.value for c in pair] if isinstance(n, yaml.MappingNode) else []
                sizes[id(n)] = min(1 + sum(size(c) for c in children), MAX_YAML_NODES + 1)
            return sizes[id(n)]
        if node is not None and size(node) > MAX_YAML_NODES:
            if aliased:
                raise ConfigError(f"YAML aliases expand to more than {MAX_YAML_NODES:,} values; write the values out")
            raise ConfigError(f"the YAML holds more than {MAX_YAML_NODES:,} values, gossamer's limit on a config "
                              f"(MAX_YAML_NODES); give long lists (faults.events, ...) in a shorter form")
        return node


class YAMLSyntaxError(ConfigError):
    """Text that is not YAML at all (``--set`` then takes it as a plain string)."""


def parse_yaml(text: str, what: str) -> Any:
    """``text`` as YAML (safe, aliases bounded, no key repeated); errors name ``what``."""
    try:
        return copy.deepcopy(_parsed(text))  # the caller's to change
    except _RepeatedKey as e:
        raise ConfigError(f"{what} gives the key '{short(e.key)}' twice (line {e.line}); give each key once") from None
    except yaml.YAMLError as e:
        raise YAMLSyntaxError(f"{what} is not valid YAML: {str(e).splitlines()[0][:100]}") from None
    except RecursionError:
        raise ConfigError(f"{what} nests too deeply") from None


@functools.lru_cache(maxsize=1024)
def _parsed(text: str) -> Any:
    """The pure-Python loader takes a third of a millisecond for ``epochs=1``, and a process reads
    the same ``--set`` values and config files many times: each text is parsed once."""
    return yaml.load(text, Loader=_BoundedLoader)


def read_yaml(path: str | Path, what: str = "config file") -> Any:
    """The YAML document in a file; a missing, unreadable, binary or non-UTF-8 file is one line."""
    path = Path(path)
    shown = f"{what} '{short(path)}'"
    if path.is_dir():
        raise ConfigError(f"{shown} is a directory, not a YAML file")
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{shown} does not exist") from None
    except OSError as e:
        raise ConfigError(f"{shown} cannot be read ({e.strerror or e})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{shown} is not UTF-8 text") from None
    if "\x00" in text:
        raise ConfigError(f"{shown} is binary, not YAML text")
    return parse_yaml(text, shown)
