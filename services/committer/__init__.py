"""The committer: the only writer of loop history (commit protocol and loop API)."""

from __future__ import annotations

from .server import serve

__all__ = ["serve"]
