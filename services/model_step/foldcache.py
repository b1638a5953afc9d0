"""The loops' last folds, kept between drives: a drive reads a loop's history on from its fold.

At most ``size`` folds are kept, the least recently used dropped first, so a replica's memory does
not grow with every loop it ever drove; a loop whose fold was dropped is read whole at its next drive.
"""

from __future__ import annotations

from collections import OrderedDict

from shared.history import LoopHistory


class FoldCache:
    def __init__(self, size: int) -> None:
        self._size = max(1, size)
        self._folds: OrderedDict[str, LoopHistory] = OrderedDict()

    def get(self, loop_id: str) -> LoopHistory | None:
        h = self._folds.get(loop_id)
        if h is not None:
            self._folds.move_to_end(loop_id)
        return h

    def __setitem__(self, loop_id: str, h: LoopHistory) -> None:
        self._folds[loop_id] = h
        self._folds.move_to_end(loop_id)
        while len(self._folds) > self._size:
            self._folds.popitem(last=False)

    def __len__(self) -> int:
        return len(self._folds)
