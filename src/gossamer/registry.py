"""Registries: one per concept (algorithm, codec, dataset, model, optimizer, topology, engine).

An entry maps a name to its builder, the dataclass of the options it owns (the config keys that
apply to it, with their defaults and a ``validate(cfg)``) and one line of help. Config
validation, the command line's help and the builders all read the same registry, so a new
algorithm, data set or model is one registered function in the module that owns the concept.

An entry may declare traits (``faults=...``, ``size=...``): what it says about itself for its
concept, read by the one place that checks it. Each registry declares the traits its entries may
take, with one line of meaning each, and refuses an unknown one at registration (:class:`UnknownTrait`),
so a typo is one line at import, never a trait that silently is not there.

Some concepts take a parameter in their name (``random-regular:4``, ``edges:FILE``, ``top-k:0.01``):
:meth:`Registry.parse` splits such a spec into its entry and the text after the colon.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import PurePath
from types import MappingProxyType
from typing import Any, Callable, Mapping


class ConfigError(ValueError):
    """Bad input: the message is one line naming the option and what is allowed (CLI: exit 2).

    Args:
        message (str): the line.

    Example::

        >>> from gossamer.extend import ConfigError
        >>> def check(drop_rate):
        ...     if not 0 <= drop_rate < 1:
        ...         raise ConfigError(f"drop_rate must be a probability in [0, 1), got {drop_rate}")
        >>> check(1.5)
        Traceback (most recent call last):
            ...
        gossamer.registry.ConfigError: drop_rate must be a probability in [0, 1), got 1.5
    """


class NameTaken(ConfigError):
    """A registration under a name that is taken (a built-in's, or another plugin's)."""


class UnknownTrait(ConfigError):
    """A registration that declares a trait its registry does not know (a typo: ``fault=``)."""


def short(value: Any) -> str:
    """At most ~100 characters of a value for an error line, non-printable characters escaped (so a
    bad value is quoted, never echoed whole)."""
    text = value if isinstance(value, str) else repr(value) if not isinstance(value, PurePath) else str(value)
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text[:200])  # '\n' shown, not broken
    return text if len(text) <= 100 else text[:97] + "..."


def positive_ints(options: Any, *names: str, prefix: str = "") -> None:
    """Refuse any of the named attributes of ``options`` below 1 (``prefix``: the section's name)."""
    for name in names:
        value = getattr(options, name)
        if value < 1:
            raise ConfigError(f"{prefix}{name} must be a positive integer, got {value}")


@dataclass(frozen=True)
class NoOptions:
    """An entry that owns no config keys."""

    def validate(self, cfg: Any) -> None:
        pass


@dataclass(frozen=True)
class Entry:
    """One registered name: ``build`` makes the thing, ``options`` is the dataclass of its keys."""

    name: str
    build: Callable
    options: type = NoOptions
    help: str = ""
    spec: str = ""  # how the name is written when it takes a parameter, e.g. "random-regular[:D]"
    takes: str = "none"  # parameter after the colon: "none", "optional" or "required"
    example: tuple[str, ...] = ()  # a short use: overrides beside the name, or the parameter ("0.1")
    traits: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))  # what the concept asks of it

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(f.name for f in fields(self.options))


class Registry:
    """Name → :class:`Entry` for one kind of thing (``kind`` names it in errors and help)."""

    def __init__(self, kind: str, error: type[ConfigError] = ConfigError, traits: Mapping[str, str] | None = None):
        """``traits``: the traits its entries may declare, each with one line of what it means (none
        by default); :meth:`register` refuses any other."""
        self.kind = kind
        self.error = error
        self.traits: Mapping[str, str] = MappingProxyType(dict(traits or {}))
        self.entries: dict[str, Entry] = {}

    def register(self, name: str, *, options: type = NoOptions, help: str = "", spec: str = "",
                 takes: str = "none", example: tuple[str, ...] = (), **traits: Any) -> Callable:
        """Decorator: register the decorated builder under ``name`` (every registry of :mod:`gossamer.extend`).

        A name is registered once: one that is taken (a built-in's, another plugin's) is refused
        when the builder is decorated (:class:`NameTaken`).

        Args:
            name (str): the entry's name, as a config gives it.
            options (type): the dataclass of the config keys it owns (their defaults, the comment
                beside each as its help, and ``validate(cfg)``); default: none.
            help (str): one line for ``gossamer train --help``.
            spec (str): how the name is written when it takes a parameter (``random-regular[:D]``).
            takes (str): its parameter after a colon: ``none``, ``optional`` or ``required``.
            example (tuple[str, ...]): how a short run uses it (config overrides beside the name, or
                the parameter): the tests generated from the registries, and the plugin kit, run it.
            **traits: what the entry declares about itself for its concept (an algorithm's
                ``faults``, a topology's ``size``), each one the registry declares in ``traits``
                with its meaning; another is refused here (:class:`UnknownTrait`).

        Returns:
            Callable: the decorator, which registers the builder and returns it unchanged.

        Example::

            >>> import torch
            >>> from dataclasses import dataclass
            >>> from gossamer.extend import MODELS
            >>> @dataclass
            ... class TinyOptions:
            ...     tiny_width: int = 8  # the hidden width
            ...     def validate(self, cfg):
            ...         pass
            >>> @MODELS.register("tiny-mlp", options=TinyOptions, example=("tiny_width=4",), help="one hidden layer")
            ... def build(cfg, data):
            ...     width = data.input_shape[-1]
            ...     return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(width, cfg.tiny_width),
            ...                                torch.nn.ReLU(), torch.nn.Linear(cfg.tiny_width, data.num_classes))
            >>> MODELS["tiny-mlp"].keys, "tiny-mlp" in MODELS
            (('tiny_width',), True)
            >>> MODELS.register("tiny-mlp")(build)
            Traceback (most recent call last):
                ...
            gossamer.registry.NameTaken: model 'tiny-mlp' is already registered; choose another name
            >>> MODELS.register("tinier-mlp", fault=True)
            Traceback (most recent call last):
                ...
            gossamer.registry.UnknownTrait: model 'tinier-mlp' declares an unknown trait 'fault'; ...
        """
        for trait in traits:
            if trait not in self.traits:
                a = "an" if self.kind[:1] in "aeiou" else "a"
                known = f"{a} {self.kind}'s traits are: {', '.join(self.traits)}" if self.traits \
                    else f"{a} {self.kind} declares no traits"
                raise UnknownTrait(f"{self.kind} '{short(name)}' declares an unknown trait '{short(trait)}'; {known}")

        def add(build: Callable) -> Callable:
            if name in self.entries:  # a plugin never shadows a built-in or another plugin
                raise NameTaken(f"{self.kind} '{short(name)}' is already registered; choose another name")
            self.entries[name] = Entry(name, build, options, help, spec or name, takes, tuple(example),
                                       MappingProxyType(dict(traits)))
            return build
        return add

    def names(self) -> list[str]:
        return list(self.entries)

    def choices(self) -> str:
        return ", ".join(e.spec for e in self.entries.values())

    def __contains__(self, name: object) -> bool:
        return name in self.entries

    def __getitem__(self, name: str) -> Entry:
        if not isinstance(name, str) or name not in self.entries:
            shown = name if isinstance(name, str) else repr(name)
            raise self.error(f"unknown {self.kind} '{shown[:100]}'; choose one of: {self.choices()}")
        return self.entries[name]

    def parse(self, spec: str) -> tuple[Entry, str | None]:
        """``name`` or ``name:param`` → (entry, param or None), checking that the entry takes one."""
        if not isinstance(spec, str) or not spec.strip():
            raise self.error(f"{self.kind} must be a non-empty name; choose one of: {self.choices()}")
        base, sep, param = spec.partition(":")
        entry = self[base.strip()]
        param = param.strip() if sep else None
        if param is not None and entry.takes == "none":
            raise self.error(f"{self.kind} '{entry.name}' takes no parameter, got '{short(spec)}'")
        if not param and entry.takes == "required":
            raise self.error(f"{self.kind} '{entry.name}' needs a parameter: '{entry.spec}'")
        if param == "" and entry.takes == "optional":
            raise self.error(f"{self.kind} '{entry.name}' has an empty parameter in '{spec[:100]}'")
        return entry, param

    def owners(self, key: str) -> list[str]:
        """The entries whose options include ``key``."""
        return [e.name for e in self.entries.values() if key in e.keys]

    def help(self) -> str:
        return "\n".join(f"  {e.spec:<24} {e.help}" for e in self.entries.values())
