"""docs/protocol.md and docs/observability.md name every loop-API verb the committer serves."""

from __future__ import annotations

import re
from pathlib import Path

from shared import protocol, subjects

ROOT = Path(__file__).resolve().parents[2]
PROTOCOL_MD = ROOT / "docs" / "protocol.md"
OBSERVABILITY_MD = ROOT / "docs" / "observability.md"


def _table_after(text: str, header: str) -> list[list[str]]:
    """The rows of the Markdown table whose header row starts with ``header``: its cells, up to the
    first line that is not a row (a blank line ends a table, so a row after one is no longer in it)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def test_table_reader_stops_at_a_blank_line() -> None:
    text = "| verb | x |\n|---|---|\n| `a` | 1 |\n\n| `b` | 2 |\n"
    assert [r[0] for r in _table_after(text, "| verb |")] == ["`a`"]


def test_protocol_md_verb_table_lists_every_verb_the_api_serves() -> None:
    served = set(subjects.VERBS)
    assert served == set(protocol.REQUEST_TYPES)  # what the committer decodes a body of, per verb
    rows = _table_after(PROTOCOL_MD.read_text(encoding="utf-8"), "| verb | body |")
    listed = [re.fullmatch(r"`(\w+)`", r[0]) for r in rows]
    assert all(listed), rows
    assert sorted(m.group(1) for m in listed if m) == sorted(served)


def test_observability_md_api_span_lists_every_verb() -> None:
    row = next(
        line for line in OBSERVABILITY_MD.read_text(encoding="utf-8").splitlines() if "`<verb> <prefix>.api`" in line
    )
    first_cell = row.strip("|").split("|")[0]
    assert set(re.findall(r"`(\w+)`", first_cell)) == set(subjects.VERBS)
