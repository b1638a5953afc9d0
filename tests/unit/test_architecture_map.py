"""docs/architecture.md's map says what each package may import: the import graph holds to it.

Every module of loopwire, services and shared belongs to one row of the map (the longest path that
contains it), and every module it imports (type-only imports included) is its own row's, or one the
row's "may import" cell names, or one every service may import (the sentence under the table).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[2]
ARCHITECTURE_MD = ROOT / "docs" / "architecture.md"
PACKAGES = ("loopwire", "shared", "services")
MAP_HEADER = "| package | owns | may import |"
EVERY_SERVICE = "Every service package may also import"


@dataclass(frozen=True)
class Row:
    modules: tuple[str, ...]  # the dotted modules or packages the row is about
    allowed: tuple[str, ...] | None  # dotted prefixes it may import (None: anything)


def _dotted(path: str) -> str:
    return path.removesuffix("/").removesuffix(".py").replace("/", ".")


def _row(package_cell: str, may_cell: str, every_service: tuple[str, ...]) -> Row:
    paths = re.findall(r"`([^`]+)`", package_cell)
    base = paths[0].rsplit("/", 1)[0] if "/" in paths[0].removesuffix("/") else ""
    modules = tuple(_dotted(p if "/" in p else f"{base}/{p}") for p in paths)
    if may_cell in ("everything below", "any service package"):
        allowed: tuple[str, ...] | None = None if may_cell == "everything below" else ("services", "shared")
    elif may_cell.startswith("nothing of"):
        allowed = ()
    else:
        allowed = tuple(re.findall(r"`([\w.]+)`", may_cell))
    if modules[0].startswith("services.") and allowed is not None:
        allowed += every_service
    return Row(modules, allowed)


def _map(text: str) -> list[Row]:
    lines = text.splitlines()
    start = lines.index(MAP_HEADER)
    after = "\n".join(lines[start:])
    sentence = after[after.index(EVERY_SERVICE) :].split(".\n")[0].split(". ")[0]
    every_service = tuple(re.findall(r"`([\w.]+)`", sentence))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        package_cell, _owns, may_cell = (c.strip() for c in line.strip().strip("|").split("|"))
        rows.append(_row(package_cell, may_cell, every_service))
    return rows


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def _owner(module: str, rows: list[Row]) -> tuple[Row, str] | None:
    """The row of ``module`` and the package (or module) of that row it belongs to (a row's modules may
    import one another)."""
    best = [(len(m), r, m) for r in rows for m in r.modules if _within(module, m)]
    if not best:
        return None
    _, row, owned = max(best, key=lambda t: t[0])
    return row, owned


def violations(graph: grimp.ImportGraph, rows: list[Row]) -> list[str]:
    found = []
    for module in sorted(graph.modules):
        if module in PACKAGES:
            continue  # the top-level packages themselves: containers, each an empty __init__
        owner = _owner(module, rows)
        if owner is None:
            found.append(f"{module}: in no row of the map")
            continue
        row, owned = owner
        if row.allowed is None:
            continue
        for imported in sorted(graph.find_modules_directly_imported_by(module)):
            if imported.split(".")[0] not in PACKAGES:
                continue  # the standard library and third-party packages
            if any(_within(imported, m) for m in (*row.modules, *row.allowed)):
                continue
            found.append(f"{module} imports {imported}: the map lets {owned} import only {', '.join(row.allowed)}")
    return found


def test_the_import_graph_keeps_to_the_map() -> None:
    rows = _map(ARCHITECTURE_MD.read_text(encoding="utf-8"))
    assert len(rows) >= 10
    graph = grimp.build_graph(*PACKAGES, exclude_type_checking_imports=False)
    assert violations(graph, rows) == []


def test_a_disallowed_or_unmapped_import_is_found() -> None:
    text = (
        f"{MAP_HEADER}\n|---|---|---|\n"
        "| `services/contract/` | the contract | `shared` |\n"
        "| `services/toolwire/` | the wire | `shared` |\n"
        "| `shared/` | plumbing | nothing of `services` or `loopwire` |\n\n"
        f"{EVERY_SERVICE} `services.lifecycle`.\n"
    )
    rows = _map(text)
    graph = grimp.ImportGraph()
    for m in ("services.contract.a", "services.toolwire.b", "shared.c", "services.lifecycle", "services.odd"):
        graph.add_module(m)
    graph.add_import(importer="services.contract.a", imported="shared.c")
    graph.add_import(importer="services.contract.a", imported="services.lifecycle")
    assert violations(graph, rows) == ["services.lifecycle: in no row of the map", "services.odd: in no row of the map"]
    graph.add_import(importer="services.contract.a", imported="services.toolwire.b")
    graph.add_import(importer="shared.c", imported="services.toolwire.b")
    found = violations(graph, rows)
    assert any(f.startswith("services.contract.a imports services.toolwire.b") for f in found)
    assert any(f.startswith("shared.c imports services.toolwire.b") for f in found)
