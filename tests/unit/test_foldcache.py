"""The model-step's fold cache keeps at most its size, dropping the least recently used fold."""

from __future__ import annotations

from services.model_step.foldcache import FoldCache
from shared.history import LoopHistory


def test_the_least_recently_used_fold_goes_first() -> None:
    cache = FoldCache(2)
    a, b, c = (LoopHistory(loop_id=x) for x in "abc")
    cache["a"], cache["b"] = a, b
    assert cache.get("a") is a  # a is now the most recently used
    cache["c"] = c
    assert cache.get("b") is None
    assert cache.get("a") is a and cache.get("c") is c
    assert len(cache) == 2


def test_replacing_a_fold_keeps_one_entry() -> None:
    cache = FoldCache(3)
    first, second = LoopHistory(loop_id="a"), LoopHistory(loop_id="a")
    cache["a"] = first
    cache["a"] = second
    assert cache.get("a") is second and len(cache) == 1
