"""The published contract, generated from the code: JSON Schemas of every wire type and an AsyncAPI 3 document.

``loopwire schema --out schemas --asyncapi docs/asyncapi.yaml`` writes both; ``--check`` compares
them with the files instead (the test suite does the same, so the checked-in contract never drifts
from the msgspec types). Everything here is deterministic: the same code gives the same bytes.

:mod:`.catalog` lists the published types, :mod:`.rules` adds the decoder's rules to msgspec's
schemas, :mod:`.schemas` builds the JSON Schema files, :mod:`.asyncapi` the AsyncAPI document (from
:mod:`.messages`, :mod:`.channels` and :mod:`.operations`), :mod:`.yaml_emitter` writes it, and
:mod:`.files` writes and checks both.
"""
