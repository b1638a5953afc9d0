"""Tool workers: the SDK, discovery, the call protocol, the batch executor and the built-in tools.

from services.tools import tool, run_worker
"""

from __future__ import annotations

from services.tools.sdk import Tool, ToolContext, ToolError, ToolOutput, tool
from services.tools.service import ToolService, run_worker
from services.toolwire.spec import ToolSpec

__all__ = [
    "Tool",
    "ToolContext",
    "ToolError",
    "ToolOutput",
    "ToolService",
    "ToolSpec",
    "run_worker",
    "tool",
]
