"""MCP servers as loopwire tool workers: ``loopwire serve mcp NAME -- COMMAND`` / ``--url URL``."""
