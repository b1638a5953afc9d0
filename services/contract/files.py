"""Writing the contract files and checking them against the code (``loopwire schema --out/--asyncapi/--check``)."""

from __future__ import annotations

from pathlib import Path

from services.contract.asyncapi import render_asyncapi
from services.contract.catalog import CONFORMANCE_DIR
from services.contract.schemas import render_schemas


def write_schemas(directory: Path) -> list[Path]:
    written = []
    for rel, text in render_schemas().items():
        path = directory / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


def schema_drift(directory: Path) -> list[str]:
    """What differs between ``directory`` and the generated schemas (empty = in sync)."""
    want = render_schemas()
    problems = []
    for rel, text in want.items():
        path = directory / rel
        if not path.is_file():
            problems.append(f"missing {path}")
        elif path.read_text(encoding="utf-8") != text:
            problems.append(f"differs: {path}")
    if directory.is_dir():
        for path in sorted(directory.rglob("*.json")):
            rel = path.relative_to(directory).as_posix()
            if rel not in want and not rel.startswith(CONFORMANCE_DIR + "/"):
                problems.append(f"not generated (stale?): {path}")
    return problems


def asyncapi_drift(path: Path) -> list[str]:
    if not path.is_file():
        return [f"missing {path}"]
    return [] if path.read_text(encoding="utf-8") == render_asyncapi() else [f"differs: {path}"]
