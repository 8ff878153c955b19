"""The shape of the source: the import graph of ``gossamer`` has no cycle, at any level.

Every ``import`` and ``from ... import`` in every module counts — at module level, inside functions
and methods, and under ``if TYPE_CHECKING:`` — so a cycle cannot hide behind a deferred import.
An edge goes to the module that is imported: ``import gossamer.algorithms`` and
``from gossamer import algorithms`` to ``gossamer/algorithms/__init__.py``; ``from .pkg import name``
to ``pkg/name.py`` where ``name`` is a submodule, else to ``pkg/__init__.py`` (the name is defined
or re-exported there). Importing ``pkg.sub`` runs ``pkg/__init__.py`` first, but that implicit edge
is not counted: a package's ``__init__`` importing its own submodules (to register them) while a
submodule imports a sibling is the normal layout; a submodule taking a *name* from its package's
``__init__`` is a cycle.

And the size of the source: no module over :data:`MAX_FILE_LINES` lines, no function or method
over :data:`MAX_FUNCTION_LINES` (issue 44) — a larger one is split along its seams.
"""

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "gossamer"

# Cycles that are known and not yet removed, each as the sorted tuple of its modules, with why.
KNOWN_CYCLES: set[tuple[str, ...]] = set()

MAX_FILE_LINES = 600  # a source file's lines
MAX_FUNCTION_LINES = 80  # a function's or method's, from its def to its last line (nested ones count in it too)


def modules() -> dict[str, Path]:
    """Every module of the package by dotted name; a package by its own name (its ``__init__``)."""
    found = {}
    for path in sorted((SRC / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def resolve(module: str, is_package: bool, level: int, target: str | None) -> str:
    """The absolute name of ``from <level dots><target> import ...`` written in ``module``."""
    if level == 0:
        return target or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[:len(base) - (level - 1)]
    return ".".join(base + ([target] if target else []))


def imports(module: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package's modules that ``module`` imports, anywhere in its source."""
    is_package = path.name == "__init__.py"
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = resolve(module, is_package, node.level, node.module)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in known else base)
    return {name for name in found if name in known and name != module}


def graph() -> dict[str, set[str]]:
    known = modules()
    return {module: imports(module, path, known) for module, path in known.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, on_stack, stack, components = {}, {}, set(), [], []

    def visit(v: str) -> None:  # the graph is a few dozen modules: recursion is fine
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(components)


def cycle_path(edges: dict[str, set[str]], component: list[str]) -> str:
    """One cycle through the component's first module, for the message: a → b → ... → a."""
    members, start = set(component), component[0]
    paths, queue = {start: [start]}, [start]
    while queue:  # breadth first, within the component: the shortest way back to the start
        v = queue.pop(0)
        for w in sorted(edges[v] & members):
            if w == start:
                return " → ".join(paths[v] + [start])
            if w not in paths:
                paths[w] = paths[v] + [w]
                queue.append(w)
    return " ↔ ".join(component)


def describe(edges: dict[str, set[str]], component: list[str]) -> str:
    """A cycle, and every import between the component's modules (the edges to cut among)."""
    members = set(component)
    inside = "; ".join(f"{v} → {', '.join(sorted(edges[v] & members))}" for v in component)
    return f"{cycle_path(edges, component)}\n    (within: {inside})"


def test_the_graph_is_read_whole():
    """The reader sees the imports it must: module level, inside functions, relative, submodules."""
    edges = graph()
    assert len(edges) > 30 and sum(map(len, edges.values())) > 100
    assert "gossamer.registry" in edges["gossamer.config"] or "gossamer.config" in edges["gossamer.registry"]
    assert "gossamer.algorithms.schedule" in edges["gossamer.algorithms.gossip"]  # from .schedule import ...
    assert resolve("gossamer.engines.sim", False, 2, "topology") == "gossamer.topology"
    assert resolve("gossamer.algorithms", True, 1, "schedule") == "gossamer.algorithms.schedule"
    assert "gossamer.runner" in edges["gossamer.api"]  # inside gossamer.run
    assert "gossamer.plugins" in edges["gossamer.cli"]  # from . import plugins: the submodule


def test_a_name_from_the_package_init_is_an_edge_to_it_and_a_cycle(tmp_path):
    """``from . import Name`` in a submodule, Name defined in the package's ``__init__``, is an edge
    to the ``__init__``; with the ``__init__`` importing the submodule, a cycle."""
    (tmp_path / "__init__.py").write_text("from . import sub\nSHARED = 1\n")
    (tmp_path / "sub.py").write_text("def f():\n    from . import SHARED\n    from .. import other\n")
    known = {"pkg": tmp_path / "__init__.py", "pkg.sub": tmp_path / "sub.py"}
    edges = {name: imports(name, path, known) for name, path in known.items()}
    assert edges == {"pkg": {"pkg.sub"}, "pkg.sub": {"pkg"}}
    assert cycles(edges) == [["pkg", "pkg.sub"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_no_import_cycle():
    edges = graph()
    found = {tuple(c): c for c in cycles(edges)}
    new = [describe(edges, c) for key, c in found.items() if key not in KNOWN_CYCLES]
    assert not new, "import cycles:\n" + "\n".join(new)
    gone = KNOWN_CYCLES - set(found)
    assert not gone, f"known cycles no longer there (remove them from KNOWN_CYCLES): {sorted(gone)}"



def oversized(path: Path, shown: str) -> list[str]:
    """What in one source file (``shown`` by that name) is over the limits: the file itself, and
    every function or method by its qualified name, nested ones too, each "FILE[:LINE NAME]: N lines"."""
    text, found = path.read_text(), []
    lines = len(text.splitlines())
    if lines > MAX_FILE_LINES:
        found.append(f"{shown}: {lines} lines (at most {MAX_FILE_LINES})")

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = prefix
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}."
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = child.end_lineno - child.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    found.append(f"{shown}:{child.lineno} {name[:-1]}: {length} lines (at most {MAX_FUNCTION_LINES})")
            visit(child, name)

    visit(ast.parse(text, filename=str(path)), "")
    return found


def test_the_size_check_names_a_long_file_and_a_long_method(tmp_path):
    """A file over the limit and a method over it are named (the method as Class.method); a
    function of exactly the limit is not."""
    statements = [f"x = {k}" for k in range(MAX_FUNCTION_LINES - 1)]
    fits = ["def fits():", *("    " + s for s in statements)]
    long = ["class A:", "    def long(self):", *("        " + s for s in statements), "        return x"]
    lines = [*fits, "", "", *long]
    path = tmp_path / "big.py"
    path.write_text("\n".join(lines + [""] * (MAX_FILE_LINES + 1 - len(lines))) + "\n")
    assert oversized(path, "big.py") == [f"big.py: {MAX_FILE_LINES + 1} lines (at most {MAX_FILE_LINES})",
                                         f"big.py:{len(fits) + 4} A.long: {MAX_FUNCTION_LINES + 1} lines "
                                         f"(at most {MAX_FUNCTION_LINES})"]
    path.write_text("\n".join(fits) + "\n")
    assert oversized(path, "big.py") == []


def test_no_source_file_or_function_is_too_long():
    """Every module of src/gossamer at most MAX_FILE_LINES lines, every function and method at
    most MAX_FUNCTION_LINES: each one over is named."""
    found = [problem for path in modules().values() for problem in oversized(path, path.relative_to(SRC).as_posix())]
    assert not found, "too long (split along the seams the code has):\n" + "\n".join(found)
