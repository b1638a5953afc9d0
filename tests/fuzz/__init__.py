"""Fuzzing loopwire's boundaries: the commit endpoint, the loop API, tool requests and the codec.

``tests/fuzz/test_fuzz.py`` runs a small deterministic set in CI; ``python -m tests.fuzz.run
--cases 10000`` runs the long campaign (see docs/reliability.md).
"""
