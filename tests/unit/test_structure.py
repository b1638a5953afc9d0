"""The code stays easy to see: small modules, short functions, and no import cycle of any kind.

The import contracts (layers, independence) are checked by lint-imports in test_import_contracts.py;
this adds what it cannot say: a cycle between any two modules, type-only imports included, and sizes.
"""

from __future__ import annotations

import ast
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("loopwire", "shared", "services")
# Where the code lives: the packages, the benchmarks and the tests' own helpers and tests.
TREES = (*PACKAGES, "bench", "tests")
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80


def _python_files() -> list[Path]:
    return sorted(p for tree in TREES for p in (ROOT / tree).rglob("*.py"))


def test_every_module_is_under_the_line_limit() -> None:
    too_long = {
        str(p.relative_to(ROOT)): n
        for p in _python_files()
        if (n := p.read_text(encoding="utf-8").count("\n")) >= MAX_MODULE_LINES
    }
    assert too_long == {}


def test_every_function_is_under_the_line_limit() -> None:
    too_long: dict[str, int] = {}
    for p in _python_files():
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    too_long[f"{p.relative_to(ROOT)}:{node.lineno} {node.name}"] = n
    assert too_long == {}


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, edges = work[-1]
            w = next(edges, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.find_modules_directly_imported_by(w)))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycle_between_any_modules_type_only_imports_included() -> None:
    graph = grimp.build_graph(*PACKAGES, exclude_type_checking_imports=False)
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = grimp.ImportGraph()
    for m in ("a", "b", "c"):
        graph.add_module(m)
    graph.add_import(importer="a", imported="b")
    graph.add_import(importer="b", imported="c")
    graph.add_import(importer="c", imported="a")
    assert _cycles(graph) == [["a", "b", "c"]]
