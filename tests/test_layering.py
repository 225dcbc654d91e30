"""The import graph of zero_ref, sim and course: no cycles, no upward edges, no imports of a package's own face.

Every import counts, at module level or inside a function (a lazy import still ties two modules together);
imports under ``if TYPE_CHECKING:`` do not run and do not count. ``from pkg import name`` is an edge to the
submodule ``pkg.name`` when there is one, else to ``pkg`` itself. A failure names each offending edge with
the file and line of the import.
"""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

from tests.helpers import ROOT

PACKAGES = ("zero_ref", "sim", "course")

# Which package may import which: a package never imports one to its right.
PACKAGE_ORDER = ("zero_ref", "sim", "course")

# zero_ref's wings from the bottom up: a module may import its own wing and the wings below, never one above.
# A row names modules and sub-packages (a name covers everything under it); the longest matching name wins,
# and a module no row names is in the top wing (recipes, profiling: they run whole engine steps).
WINGS = (
    ("floor", ("zero_ref.memory", "zero_ref.config", "zero_ref.parallel.topology",  # torch-free (test_project)
               "zero_ref.parallel.schedules")),
    ("process", ("zero_ref.launcher", "zero_ref.launch_rank", "zero_ref.forkserver", "zero_ref.clean_exit",
                 "zero_ref.rng", "zero_ref.measure")),
    ("comm", ("zero_ref.comm", "zero_ref.parallel.groups", "zero_ref.diagnostics")),
    ("math", ("zero_ref.optim", "zero_ref.kernels", "zero_ref.precision", "zero_ref.collective_algorithms",
              "zero_ref.models.dropout")),
    ("parallel", ("zero_ref.parallel", "zero_ref.activation_checkpointing")),
    ("model", ("zero_ref.models", "zero_ref.parallel.moe")),  # the course GPT; MoE's experts are its MLPs
    ("stages", ("zero_ref.stages", "zero_ref.offload", "zero_ref.compression")),
    ("checkpoint", ("zero_ref.checkpoint",)),
    ("ds", ("zero_ref.ds",)),  # DeepSpeed's API: nothing but scripts-like modules above it imports it
    ("top", ("zero_ref",)),
)


def module_files() -> dict[str, Path]:
    """Every module of the packages, by dotted name (a package by its ``__init__.py``)."""
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            if all((ROOT / Path(*parts[:i]) / "__init__.py").exists() for i in range(1, len(parts))):
                out[".".join(parts)] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return getattr(test, "id", None) == "TYPE_CHECKING" or getattr(test, "attr", None) == "TYPE_CHECKING"


def _imports(tree: ast.AST):
    """Each import statement that runs: anywhere in the module, except in ``if TYPE_CHECKING:`` blocks."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def _known(name: str, modules) -> str | None:
    """``name`` or its longest prefix that is one of ``modules``."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(modules: dict[str, Path] | None = None) -> dict[str, dict[str, list[str]]]:
    """``{importer: {imported: ["file:line", ...]}}`` over the modules of the packages."""
    modules = modules or module_files()
    graph: dict[str, dict[str, list[str]]] = {m: defaultdict(list) for m in modules}
    for mod, path in modules.items():
        is_pkg = path.name == "__init__.py"
        for node in _imports(ast.parse(path.read_text(), str(path))):
            where = f"{path.relative_to(ROOT)}:{node.lineno}"
            targets = []
            if isinstance(node, ast.Import):
                targets = [_known(a.name, modules) for a in node.names]
            else:
                base = node.module or ""
                if node.level:  # relative: from the module's package (a package's own name), up level - 1
                    parts = mod.split(".")
                    anchor = parts[: len(parts) - node.level + int(is_pkg)]
                    base = ".".join(anchor + ([base] if base else []))
                for a in node.names:
                    sub = f"{base}.{a.name}"
                    targets.append(sub if sub in modules else _known(base, modules))
            for t in targets:
                if t is not None and t != mod and where not in graph[mod][t]:
                    graph[mod][t].append(where)
    return graph


def _reach(graph, start: str) -> set[str]:
    """The modules ``start`` imports, directly or through others."""
    seen, todo = set(), list(graph[start])
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo.extend(graph[m])
    return seen


def cycles(graph) -> list[tuple[list[str], list[str]]]:
    """``(cycle, members)`` for each strongly connected component of more than one module: a shortest cycle
    through its first module, and all its modules."""
    reach = {m: _reach(graph, m) for m in graph}
    sccs = {frozenset({m} | {w for w in reach[m] if m in reach[w]}) for m in graph if m in reach[m]}
    out = []
    for scc in sorted(sccs, key=min):  # breadth-first: the shortest way from its first module back to itself
        start, prev, frontier = min(scc), {}, [min(scc)]
        while start not in prev:
            nxt = []
            for v in frontier:
                for w in sorted(graph[v]):
                    if w in scc and w not in prev:
                        prev[w] = v
                        nxt.append(w)
            frontier = nxt
        path, v = [start], prev[start]
        while v != start:
            path.append(v)
            v = prev[v]
        out.append(([start, *reversed(path)], sorted(scc)))
    return out


def wing(module: str) -> int:
    """The row of ``WINGS`` that holds ``module`` (the longest matching name)."""
    best, rank = -1, len(WINGS) - 1
    for i, (_, names) in enumerate(WINGS):
        for n in names:
            if (module == n or module.startswith(n + ".")) and len(n) > best:
                best, rank = len(n), i
    return rank


def _package(module: str) -> str:
    return module.split(".")[0]


def _edge(graph, a, b) -> str:
    return f"{a} -> {b} ({', '.join(graph[a][b])})"


GRAPH = import_graph()


def test_the_graph_sees_the_packages():
    assert {"zero_ref", "zero_ref.comm", "sim", "course.build"} <= set(GRAPH)
    assert "zero_ref.comm" in GRAPH["zero_ref.stages.zero1"]


def test_no_import_cycles():
    found = cycles(GRAPH)
    msg = "\n".join(f"cycle: {'  ->  '.join(c)}\n  " + "\n  ".join(_edge(GRAPH, a, b) for a, b in zip(c, c[1:]))
                    + (f"\n  (one of {len(members)} modules that import each other: {', '.join(members)})"
                       if len(members) > len(c) - 1 else "") for c, members in found)
    assert not found, f"{len(found)} import cycle(s) (break one edge of each):\n{msg}"


def test_packages_import_only_downwards():
    bad = [_edge(GRAPH, a, b) for a in GRAPH for b in GRAPH[a]
           if PACKAGE_ORDER.index(_package(b)) > PACKAGE_ORDER.index(_package(a))]
    assert not bad, "upward imports between packages (zero_ref < sim < course):\n" + "\n".join(bad)


def test_no_module_imports_its_own_package_face():
    bad = [_edge(GRAPH, a, b) for a in GRAPH for b in GRAPH[a] if a.startswith(b + ".")]
    assert not bad, "modules importing their own package's __init__ (import the defining module):\n" + "\n".join(bad)


def test_zero_ref_wings_import_only_downwards():
    inside = [(a, b) for a in GRAPH for b in GRAPH[a] if _package(a) == _package(b) == "zero_ref"]
    bad = [f"{_edge(GRAPH, a, b)}: {WINGS[wing(a)][0]} imports {WINGS[wing(b)][0]}"
           for a, b in inside if wing(b) > wing(a)]
    order = " < ".join(name for name, _ in WINGS)
    assert not bad, f"upward imports between zero_ref's wings ({order}):\n" + "\n".join(bad)
