"""shared.connection.Connection reads and writes header blocks exactly as nats-py's own client does."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from nats.aio.client import Client

from shared.connection import Connection

_line_bytes = st.binary(max_size=24) | st.sampled_from(
    [b"Name: value", b" Name : v ", b"Na me: v", b"\x1cName: v", b"Name\x1f: v", b"N\xc3\xa9: v", b"N:", b":v", b"N::v"]
)


@given(st.lists(_line_bytes, max_size=8))
@settings(max_examples=400)
def test_parsed_like_nats_py(lines: list[bytes]) -> None:
    raw = b"\r\n".join(lines) + b"\r\n\r\n"
    assert Connection._parse_header_lines(raw) == Client._parse_header_lines(raw)


def test_every_ascii_character_in_a_name_is_treated_like_nats_py() -> None:
    for c in range(256):
        for raw in (b"A%cB: v\r\n\r\n" % c, b"%cAB: v\r\n\r\n" % c, b"AB%c: v\r\n\r\n" % c):
            assert Connection._parse_header_lines(raw) == Client._parse_header_lines(raw), raw
