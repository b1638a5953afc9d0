"""The CLI's one error type (kept apart so that importing it is cheap)."""

from __future__ import annotations


class CliError(Exception):
    """A failure to report as one line (``error: <message>``), exit status 1."""
