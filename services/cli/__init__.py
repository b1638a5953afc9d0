"""The ``loopwire`` command: demo, up, serve, the client commands and ``schema`` (the contract, from services.contract).

``main`` is the console script's entry point; ``build_parser`` is the whole command line.
"""

from services.cli.app import build_parser, main

__all__ = ["build_parser", "main"]
