"""The ``loopwire`` package exports exactly the names docs/api.md documents, and nothing else."""

from __future__ import annotations

import re
from pathlib import Path

import loopwire

ROOT = Path(__file__).resolve().parents[2]
API_DOC = (ROOT / "docs" / "api.md").read_text()


def _documented() -> list[str]:
    """Every name of the doc's tables: rows of the form ``| `name` | what it is |``."""
    return re.findall(r"^\| `(\w+)` \| .+ \|$", API_DOC, re.M)


def test_all_is_sorted_and_without_duplicates() -> None:
    assert loopwire.__all__ == sorted(set(loopwire.__all__))


def test_every_public_member_is_exported() -> None:
    public = sorted(name for name in vars(loopwire) if not name.startswith("_"))
    assert public == loopwire.__all__, "import privately (as _name) or add it to __all__ and docs/api.md"


def test_every_export_resolves() -> None:
    for name in loopwire.__all__:
        assert getattr(loopwire, name) is not None, name


def test_the_doc_lists_every_export_once() -> None:
    documented = _documented()
    assert len(documented) == len(set(documented)), sorted(n for n in documented if documented.count(n) > 1)
    assert set(documented) == set(loopwire.__all__), (
        f"undocumented: {sorted(set(loopwire.__all__) - set(documented))}, "
        f"documented but not exported: {sorted(set(documented) - set(loopwire.__all__))}"
    )


def test_every_exported_error_is_a_loopwire_error() -> None:
    for name in loopwire.__all__:
        obj = getattr(loopwire, name)
        if isinstance(obj, type) and issubclass(obj, BaseException):
            assert issubclass(obj, loopwire.LoopwireError), name


def test_docs_and_examples_import_only_loopwire() -> None:
    texts = {
        p: p.read_text() for p in [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "examples").glob("*.py")]
    }
    internal = re.compile(r"^\s*(?:from|import) (?:shared|services)\b", re.M)
    offenders = sorted(str(p.relative_to(ROOT)) for p, text in texts.items() if internal.search(text))
    assert not offenders, f"import from loopwire instead: {offenders}"
