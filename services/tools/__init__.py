"""Tool workers: the SDK, discovery, the call protocol, the batch executor and the built-in tools.

from services.tools import tool, run_worker
"""

from __future__ import annotations

from services.tools.sdk import Tool, ToolContext, ToolError, ToolOutput, tool
from services.tools.serve import run_worker, serve, serve_tools
from services.tools.spec import ToolAnnotations, ToolSpec

__all__ = [
    "Tool",
    "ToolAnnotations",
    "ToolContext",
    "ToolError",
    "ToolOutput",
    "ToolSpec",
    "run_worker",
    "serve",
    "serve_tools",
    "tool",
]
