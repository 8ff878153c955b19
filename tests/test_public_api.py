"""The public API (issue 44, item 4): every name that ``gossamer``, ``gossamer.extend`` and
``gossamer.integrations`` export is documented in the style of PyTorch's model averagers — a
summary line, ``Args:`` naming each parameter, ``Returns:`` where it returns a value, and an
``Example::`` — and every example runs (doctest; a few seconds for all of them).

What documents a name: a function's or class's own docstring (a class's ``Args:`` are its
constructor's; a Protocol is not constructed: its docstring describes its methods); a registry, an
object that cannot carry a docstring of its own, by its ``register`` method, whose sections are
checked and whose example runs once for all the registries; a plain value (``__version__``,
``REJOIN_MODES``) by the docstring of the module that exports it, which names it as ``:data:`NAME```.
"""

import doctest
import importlib
import inspect
import re

import pytest
import torch

from gossamer import rng
from gossamer.registry import Registry

MODULES = ("gossamer", "gossamer.extend", "gossamer.integrations")
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
EXPORTED = [(module, name) for module in MODULES for name in importlib.import_module(module).__all__]
SECTION = re.compile(r"^\s*(Args:|Returns:|Example::)\s*$", re.M)


def documented(value):
    """What documents an exported value: itself (a function, a class), a registry's ``register``
    method, or None (a plain value, documented by its module)."""
    if isinstance(value, Registry):
        return type(value).register
    if inspect.isclass(value) or inspect.isroutine(value):
        return value
    return None


def parameters(obj) -> list[str]:
    """The parameters its ``Args:`` names: a function's, a class's constructor's (none for a Protocol
    or an exception, whose constructor is not its interface: the message)."""
    if inspect.isclass(obj) and (getattr(obj, "_is_protocol", False) or issubclass(obj, BaseException)):
        return []
    return [p.name for p in inspect.signature(obj).parameters.values() if p.name not in ("self", "cls")]


def returns(obj) -> bool:
    """Whether a function returns a value (its annotation is not None; one without says nothing, so it may)."""
    return not inspect.isclass(obj) and inspect.signature(obj).return_annotation not in (None, "None")


def sections(doc: str) -> dict[str, str]:
    """The text of each section of a docstring, by its header."""
    parts = SECTION.split(doc)
    return {header: text for header, text in zip(parts[1::2], parts[2::2])}


@pytest.mark.parametrize("module, name", EXPORTED)
def test_every_exported_name_is_documented(module, name):
    exporter = importlib.import_module(module)
    obj = documented(getattr(exporter, name))
    if obj is None:
        assert f":data:`{name}`" in exporter.__doc__, f"{module}'s docstring does not document {name}"
        return
    doc = inspect.getdoc(obj) or ""
    lines = doc.splitlines()
    assert lines and lines[0].strip() and (len(lines) == 1 or not lines[1].strip()), \
        f"{module}.{name}: the docstring starts with a summary line, then a blank line"
    found = sections(doc)
    assert "Example::" in found and ">>>" in found["Example::"], f"{module}.{name}: no Example:: with >>> lines"
    wanted = parameters(obj)
    if wanted:
        assert "Args:" in found, f"{module}.{name}: no Args: for {wanted}"
        missing = [p for p in wanted if not re.search(rf"\b{p}\b", found["Args:"])]
        assert not missing, f"{module}.{name}: Args: does not name {missing}"
    if returns(obj):
        assert "Returns:" in found and found["Returns:"].strip(), f"{module}.{name}: no Returns:"


@pytest.fixture
def restored():
    """The registries, the random streams and torch's generator as they were before an example
    (which registers entries and declares streams, as a plugin does)."""
    registries = {id(v): v for m in MODULES for v in vars(importlib.import_module(m)).values()
                  if isinstance(v, Registry)}.values()
    entries, streams, generator = [dict(r.entries) for r in registries], dict(rng.STREAMS), torch.get_rng_state()
    yield
    for registry, saved in zip(registries, entries):
        registry.entries.clear()
        registry.entries.update(saved)
    rng.STREAMS.clear()
    rng.STREAMS.update(streams)
    torch.set_rng_state(generator)


def examples() -> list[tuple[str, str]]:
    """(module, name) of each exported name that documents something of its own: a registry's
    ``register`` once for all of them, a plain value never."""
    seen, chosen = set(), []
    for module, name in EXPORTED:
        obj = documented(getattr(importlib.import_module(module), name))
        if obj is not None and id(obj) not in seen:
            seen.add(id(obj))
            chosen.append((module, name))
    return chosen


@pytest.mark.parametrize("module, name", examples())
def test_every_example_runs(module, name, restored):
    obj = documented(getattr(importlib.import_module(module), name))
    tests = [test for test in doctest.DocTestFinder().find(obj, f"{module}.{name}", globs={}) if test.examples]
    assert tests, f"{module}.{name} has no example"
    runner, report = doctest.DocTestRunner(optionflags=FLAGS), []
    for test in tests:
        runner.run(test, out=report.append)
    assert not runner.failures, "".join(report)
