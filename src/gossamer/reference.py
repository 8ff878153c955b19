"""docs/reference.md, generated from the code: every config key (its default and the comment beside
it in the dataclass that declares it) and every built-in algorithm, codec, topology, optimizer,
data set, model and engine with its help and its own keys (plugins' entries are left out). ``python -m gossamer.reference >
docs/reference.md`` writes it; tests/test_reference.py fails when the file and the code differ.
"""

from __future__ import annotations

import dataclasses
import inspect
import io
import tokenize
from dataclasses import MISSING

HEADER = ("# Reference\n\nGenerated from the code by `python -m gossamer.reference > docs/reference.md` "
          "(tests/test_reference.py checks that it is current): every key with its default, every registered "
          "entry with its keys. The guide (docs/guide.md) explains what they do together.\n")


def comments(cls: type) -> dict[str, str]:
    """The comment of each field of a dataclass: on its line, or on the comment lines just above it
    (in the class that declares it last: a subclass's overrides its base's)."""
    found = {}
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass):
            found.update(_declared_comments(klass, {f.name for f in dataclasses.fields(cls)}))
    return found


def _declared_comments(cls: type, names: set[str]) -> dict[str, str]:
    """The comments of the fields ``names`` in the source of ``cls`` itself."""
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        return {}
    found, above = {}, []
    lines = source.splitlines()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type != tokenize.COMMENT:
            continue
        row = token.start[0] - 1
        code = lines[row][: token.start[1]].strip()
        text = token.string.lstrip("#").strip()
        if text.startswith("--"):  # a heading between groups of fields
            above = []
            continue
        if code:
            name = code.split(":")[0].strip()
            if name in names:
                found[name] = " ".join([*above, text]).strip()
            above = []
        else:
            following = lines[row + 1].strip() if row + 1 < len(lines) else ""
            above.append(text)
            name = following.split(":")[0].strip()
            if name in names and "#" not in following:
                found[name] = " ".join(above)
                above = []
    return found


def _default(f: dataclasses.Field) -> str:
    if f.default is not MISSING:
        value = f.default
    elif f.default_factory is not MISSING:
        value = f.default_factory()
        if dataclasses.is_dataclass(value):
            return "(section)"
    else:
        return "(required)"
    return "`" + repr(value).replace("|", "\\|") + "`"


def _section(f: dataclasses.Field) -> type | None:
    factory = f.default_factory
    return f.metadata.get("section") or (factory if factory is not MISSING and dataclasses.is_dataclass(factory)
                                         else None)


def key_rows(cls: type, prefix: str = "") -> list[str]:
    """Markdown rows ``| key | default | what |`` of a dataclass's fields, sections expanded."""
    rows, notes = [], comments(cls)
    for f in dataclasses.fields(cls):
        if f.metadata.get("internal"):
            continue
        section = _section(f)
        note = notes.get(f.name, "").replace("|", "\\|")
        if section is not None:
            rows.append(f"| `{prefix}{f.name}` | {'unset' if f.default is None else '(section)'} | {note} |")
            rows += key_rows(section, f"{prefix}{f.name}.")
        else:
            rows.append(f"| `{prefix}{f.name}` | {_default(f)} | {note} |")
    return rows


def _table(rows: list[str]) -> str:
    return "\n".join(["| key | default | what |", "|---|---|---|", *rows])


def generate() -> str:
    from .codecs import CODECS
    from .config import KINDS, Config
    from .topology import TOPOLOGIES

    parts = [HEADER, "## General keys\n\nKeys of every run (`--set KEY=VALUE`, or a YAML file); a section's "
                     "keys are `section.key`.\n", _table(key_rows(Config))]
    for kind, registry in {**KINDS, "topology": TOPOLOGIES, "compression": CODECS}.items():
        parts.append(f"\n## {kind.capitalize()} (`{kind}`)\n")
        for e in registry.entries.values():
            if not e.build.__module__.startswith("gossamer."):  # a plugin's, in this process
                continue
            parts.append(f"### `{e.spec}`\n\n{e.help}\n")
            if e.keys:
                parts.append(_table(key_rows(e.options)) + "\n")
    return "\n".join(parts).rstrip() + "\n"


if __name__ == "__main__":
    print(generate(), end="")
