"""The committer: the only writer of loop history (commit protocol and loop API)."""

from __future__ import annotations

from .service import CommitterService

__all__ = ["CommitterService"]
