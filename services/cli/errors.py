"""The CLI's one error type (kept apart so that importing it is cheap; defined with every other error)."""

from __future__ import annotations

from shared.errors import CliError as CliError
