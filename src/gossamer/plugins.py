"""Plugins: a user's Python file or module, imported before a config is validated, that registers
algorithms, codecs, topologies, optimizers, models and data sets with the decorators of
:mod:`gossamer.extend` — the ones gossamer's own modules use.

A plugin is named by a path (``my_algorithm.py``, any name ending in ``.py`` or holding a ``/``) or
an importable module (``mylab.gossip``); installed packages announce theirs in the entry-point
group ``gossamer.plugins`` (loaded by :func:`load_installed`). A config records each plugin it used
as ``SOURCE#sha256=HEX`` (:func:`load`): its absolute path or module name and the SHA-256 of its
source (a package: of its ``.py`` files, by relative path; and the helper modules beside it that
they import), so a run directory says which code it ran and a resume refuses, naming the plugin,
one that is missing or changed — or finds one that moved, given again by path with the same content.

Importing is all or nothing: a plugin that fails to import, or registers a name that is taken (a
built-in's or another plugin's — nothing shadows silently), leaves the registries as they were
and is one :class:`~gossamer.registry.ConfigError` line; so is one that declares a trait its
registry does not know (``fault=`` for ``faults=``). A plugin is imported once per process.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import hashlib
import importlib
import importlib.metadata
import importlib.util
import os
import sys
import traceback
from pathlib import Path
from types import ModuleType

from .registry import ConfigError, NameTaken, UnknownTrait, short

ENTRY_POINTS = "gossamer.plugins"
HASH = "#sha256="

_loaded: dict[str, str] = {}  # source → the sha256 it was imported with
_added: dict[str, list[tuple[str, str]]] = {}  # source → the (kind, name) entries its import registered
_moved: dict[str, str] = {}  # sha256 → the latest source loaded with it: where a recorded plugin that moved is now


def is_path(spec: str) -> bool:
    """Whether a plugin spec names a file (else a module)."""
    return spec.endswith(".py") or "/" in spec or "\\" in spec


def _registries() -> list:
    from .algorithms import ALGORITHMS
    from .byzantine import ATTACKS
    from .codecs import CODECS
    from .data import DATASETS
    from .engines import ENGINES
    from .loggers import LOGGERS
    from .models import FOOTPRINTS, MODELS
    from .optim import OPTIMIZERS
    from .outer import OUTER_OPTIMIZERS
    from .rng import STREAMS
    from .robust import AGGREGATORS
    from .tasks import TASKS
    from .topology import TOPOLOGIES
    return [ALGORITHMS, ATTACKS, AGGREGATORS, CODECS, DATASETS, ENGINES, LOGGERS, MODELS, OPTIMIZERS,
            OUTER_OPTIMIZERS, TASKS, TOPOLOGIES], [FOOTPRINTS, STREAMS]


def source_of(spec: str) -> tuple[str, list[Path], Path]:
    """(the plugin's source as a config records it, its files, the root their names are relative
    to): an absolute path, or a module name and the files of its module or package."""
    if is_path(spec):
        path = Path(spec).expanduser().resolve()
        if not path.is_file():
            raise ConfigError(f"plugin '{short(spec)}' does not exist (a plugin is a .py file or an importable module)")
        return str(path), [path], path.parent
    try:
        found = importlib.util.find_spec(spec)
    except (ImportError, ValueError) as e:
        raise ConfigError(f"plugin '{short(spec)}' cannot be found: {short(str(e))}") from None
    if found is None:
        raise ConfigError(f"plugin '{short(spec)}' is neither a .py file nor an importable module")
    if found.submodule_search_locations:  # a package: every .py file under it
        root = Path(next(iter(found.submodule_search_locations)))
        return spec, sorted(root.rglob("*.py")), root
    if found.origin is None or not Path(found.origin).is_file():
        raise ConfigError(f"plugin '{short(spec)}' has no source file to record")
    origin = Path(found.origin)
    return spec, [origin], origin.parent


def local_imports(files: list[Path], root: Path) -> list[Path]:
    """The .py files under ``root`` that ``files`` import, directly or through one another (read from
    their source, not run): a plugin's helper modules beside it, which change what it computes."""
    found, todo = set(files), list(files)
    while todo:
        file = todo.pop()
        try:
            tree = ast.parse(file.read_bytes())
        except (SyntaxError, ValueError):
            continue  # the import reports it
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [(alias.name, root) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = root if not node.level else file.parents[node.level - 1]
                module = (node.module or "").replace(".", "/")
                names = [(module, base), *((f"{module}/{alias.name}".strip("/"), base) for alias in node.names)]
            else:
                continue
            for name, base in names:
                path = base / name.replace(".", "/")
                for candidate in (path.with_suffix(".py"), path / "__init__.py"):
                    if name and candidate.is_file() and candidate.resolve().is_relative_to(root.resolve()) \
                            and candidate not in found:
                        found.add(candidate)
                        todo.append(candidate)
    return sorted(found)


def fingerprint(spec: str) -> str:
    """``SOURCE#sha256=HEX`` of a plugin as it is now: its files and the helper modules beside it
    that they import (:func:`local_imports`)."""
    source, files, root = source_of(spec)
    digest = hashlib.sha256()
    for file in local_imports(files, root):
        digest.update(str(file.relative_to(root)).encode() + b"\0" + file.read_bytes() + b"\0")
    return f"{source}{HASH}{digest.hexdigest()}"


def load(specs: list[str]) -> list[str]:
    """Import each plugin (once per process) and return their records ``SOURCE#sha256=HEX``. A spec
    that carries a hash (a recorded config) must match the plugin's content now."""
    records = []
    for spec in specs:
        if not isinstance(spec, str) or not spec.strip():
            raise ConfigError(f"plugins must be a list of .py files or module names, got {short(spec)}")
        given, _, recorded = spec.partition(HASH)
        if recorded and is_path(given) and not Path(given).expanduser().is_file() and recorded in _moved:
            given = _moved[recorded]  # moved: the plugin given by path with the recorded content
        record = fingerprint(given)
        source, _, digest = record.partition(HASH)
        if recorded and recorded != digest:
            raise ConfigError(f"plugin '{short(source)}' changed since the run recorded it (sha256 {recorded[:12]}… "
                              f"then, {digest[:12]}… now); restore it, or start a new run")
        if _loaded.get(source, digest) != digest:
            raise ConfigError(f"plugin '{short(source)}' changed since this process imported it; start a new process")
        _moved[digest] = source  # where this content is now
        earlier = next((src for src, d in _loaded.items() if d == digest and src != source), None)
        if source not in _loaded and earlier is not None:  # the same code, imported from where it was
            _loaded[source], _added[source] = digest, _added[earlier]
        if source not in _loaded:
            registries = _registries()[0]
            before = {(r.kind, name) for r in registries for name in r.entries}
            _import(source)
            _loaded[source] = digest
            _added[source] = [(r.kind, name) for r in registries for name in r.entries if (r.kind, name) not in before]
            for registry in registries:
                for name in [name for name in registry.entries if (registry.kind, name) not in before]:
                    registry.entries[name] = _guarded(registry.entries[name], registry.kind, source)
        if record not in records:
            records.append(record)
    return records


def _guarded(entry, kind: str, source: str):
    """``entry`` whose builder, a plugin's, fails in one line: whatever it raises (but a ConfigError,
    already one), or a None it returns, names the plugin and the entry."""
    build = entry.build

    @functools.wraps(build)
    def guarded(*args, **kwargs):
        where = f"plugin '{short(source)}': {kind} '{entry.name}'"
        try:
            built = build(*args, **kwargs)
        except ConfigError:
            raise
        except Exception as e:  # noqa: BLE001 — whatever the user's code raises is one line
            reason = str(e).splitlines()[0] if str(e) else ""
            raise ConfigError(f"{where} failed to build: {type(e).__name__}{': ' + short(reason) if reason else ''}"
                              ) from None
        if built is None:
            raise ConfigError(f"{where} built None: its builder must return the {kind}")
        return built
    return dataclasses.replace(entry, build=guarded)


def registered(record: str) -> list[tuple[str, str]]:
    """The (kind, name) of every entry that the import of a loaded plugin (its record) registered."""
    return list(_added[record.partition(HASH)[0]])


def load_installed(warn=lambda line: print(f"gossamer: warning: {line}", file=sys.stderr)) -> list[str]:
    """Import the plugins that installed packages announce in the ``gossamer.plugins`` entry points.
    One whose names a plugin given by path already took (a working copy of the installed one) is
    skipped with a ``warn`` line; one that fails to import is one line naming its package."""
    records = []
    for point in announced():
        module = point.value.split(":")[0]
        package = f"{point.dist.name} {point.dist.version}" if point.dist is not None else "unknown package"
        try:
            records += [r for r in load([module]) if r not in records]
        except NameTaken as e:
            warn(f"the installed plugin '{short(module)}' ({package}) is not loaded: {e}")
        except ConfigError as e:
            raise ConfigError(f"installed {e} (package {package}; uninstall or fix it)") from None
    return records


def announced() -> tuple[importlib.metadata.EntryPoint, ...]:
    """The ``gossamer.plugins`` entry points of the installed packages. Reading them reads every
    installed package's metadata (milliseconds, and a process loads many configs), so they are read
    again only when ``sys.path`` or the modification time of one of its folders changed, as
    installing or removing a package changes its folder's."""
    return _entry_points(tuple((folder, _modified(folder)) for folder in sys.path))


def _modified(folder: str) -> int | None:
    try:
        return os.stat(folder or ".").st_mtime_ns
    except OSError:
        return None


@functools.lru_cache(maxsize=1)
def _entry_points(_folders: tuple) -> tuple[importlib.metadata.EntryPoint, ...]:
    return tuple(importlib.metadata.entry_points(group=ENTRY_POINTS))


def _import(source: str) -> ModuleType:
    """Import a plugin; on any failure the registries are restored and the error is one line."""
    registries, tables = _registries()
    saved = [dict(r.entries) for r in registries], [dict(t) for t in tables]
    try:
        if not is_path(source):
            return importlib.import_module(source)
        name = f"gossamer_plugin_{hashlib.sha256(source.encode()).hexdigest()[:12]}"
        folder = str(Path(source).parent)
        if folder not in sys.path:  # as for a script: its helper modules beside it import
            sys.path.append(folder)
        spec = importlib.util.spec_from_file_location(name, source)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses and pickling look the module up by name
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
        return module
    except (Exception, SystemExit) as e:  # noqa: BLE001 — whatever the user's code raises (or exits with) is one line
        for registry, entries in zip(registries, saved[0]):
            registry.entries.clear()
            registry.entries.update(entries)
        for table, entries in zip(tables, saved[1]):
            table.clear()
            table.update(entries)
        if isinstance(e, NameTaken):
            raise NameTaken(f"plugin '{short(source)}' registers a name that is taken: {e}") from None
        if isinstance(e, UnknownTrait):  # a typo'd trait (fault= for faults=): the line and where it is
            raise ConfigError(f"plugin '{short(source)}' failed to register: {e}{_where(e, source)}") from None
        text = e.msg if isinstance(e, SyntaxError) else str(e)  # a syntax error's str holds its place again
        reason = text.splitlines()[0] if text else ""
        raise ConfigError(f"plugin '{short(source)}' failed to import: {type(e).__name__}"
                          f"{': ' + reason[:300] if reason else ''}{_where(e, source)}") from None


def _where(error: BaseException, source: str) -> str:
    """`` (FILE line N)``: the innermost line of the plugin's own code (its folder or package) that the
    error came from (a syntax error's own line), or nothing."""
    if isinstance(error, SyntaxError) and error.lineno:
        return f" ({Path(error.filename or '?').name} line {error.lineno})"
    try:
        root = source_of(source)[2].resolve()
    except ConfigError:
        return ""
    frames = [f for f in traceback.extract_tb(error.__traceback__)
              if not f.filename.startswith("<") and Path(f.filename).resolve().is_relative_to(root)]
    return f" ({Path(frames[-1].filename).name} line {frames[-1].lineno})" if frames else ""
