"""One error tree: every exception class of shared/ and services/ derives from LoopwireError, and the
tree drawn in shared/errors.py's docstring lists each of them under its own base."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re

import pytest

import services
import shared
from shared import errors
from shared.errors import LoopwireError


def _exception_classes() -> dict[str, type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for pkg in (shared, services):
        for info in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
            if info.name.rsplit(".", 1)[-1] == "__main__":  # runs a service when imported
                continue
            module = importlib.import_module(info.name)
            for obj in vars(module).values():
                if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == module.__name__:
                    found[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return found


CLASSES = _exception_classes()


def _drawn_tree() -> dict[str, str]:
    """Class name → the name of its parent in the docstring's tree ("" for the root)."""
    doc = errors.__doc__ or ""
    lines = doc[doc.index("    LoopwireError\n") :].splitlines()
    parents: dict[str, str] = {lines[0].strip(): ""}
    stack = [lines[0].strip()]
    for line in lines[1:]:
        m = re.match(r"^    ((?:[│ ]   )*)[├└]── (\w+)", line)
        if m is None:
            break
        depth = len(m.group(1)) // 4 + 1
        del stack[depth:]
        name = m.group(2)
        assert name not in parents, f"{name} is drawn twice"
        parents[name] = stack[-1]
        stack.append(name)
    return parents


def test_the_walk_finds_the_errors() -> None:
    names = {c.__name__ for c in CLASSES.values()}
    assert {"LoopwireError", "ToolError", "CliError", "RemoteError", "ModelError", "StepAbandoned"} <= names


@pytest.mark.parametrize("qualname", sorted(CLASSES))
def test_every_exception_is_a_loopwire_error(qualname: str) -> None:
    assert issubclass(CLASSES[qualname], LoopwireError), f"{qualname} must derive from LoopwireError"


def test_each_class_is_defined_once() -> None:
    names = [c.__name__ for c in CLASSES.values()]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)


def test_the_docstring_draws_every_class_under_its_base() -> None:
    drawn = _drawn_tree()
    by_name = {c.__name__: c for c in CLASSES.values()}
    assert set(drawn) == set(by_name), f"missing: {set(by_name) - set(drawn)}, stale: {set(drawn) - set(by_name)}"
    for name, parent in drawn.items():
        cls = by_name[name]
        bases = [b.__name__ for b in cls.__bases__ if issubclass(b, LoopwireError)]
        assert bases == ([parent] if parent else []), f"{name} is drawn under {parent!r}, derives from {bases}"


def test_value_and_runtime_errors_stay_catchable_as_such() -> None:
    by_name = {c.__name__: c for c in CLASSES.values()}
    for name in ("StrictJSONError", "ForkPointError", "McpToolRejected", "SSEDecodeError"):
        assert issubclass(by_name[name], ValueError), name
    for name in ("NatsServerError", "ServiceStartError"):
        assert issubclass(by_name[name], RuntimeError), name
