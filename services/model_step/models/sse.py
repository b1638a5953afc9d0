"""A strict server-sent-events decoder (the framing both provider APIs stream in).

Bytes go in, complete events come out. Lines end with CRLF, LF or CR; ``data:`` lines of one
event are joined with ``\\n``; ``event:`` names it; ``:`` lines are comments; a blank line
dispatches. Invalid UTF-8 is an error, never replaced: a damaged frame must not be guessed at.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from shared.errors import SSEDecodeError as SSEDecodeError

_EOL: Final = re.compile(rb"\r\n|\r|\n")
MAX_EVENT_BYTES: Final = 16 * 1024 * 1024  # far above any real event; bounds a runaway line


@dataclass(frozen=True, slots=True)
class SSEEvent:
    event: str  # "message" when the frame had no event: line
    data: str


class SSEDecoder:
    def __init__(self) -> None:
        self._buf = bytearray()
        self._event = ""
        self._data: list[str] = []
        self._started = False  # a BOM is only allowed at the very start

    def feed(self, data: bytes) -> list[SSEEvent]:
        """Events completed by ``data`` (possibly none)."""
        self._buf += data
        out: list[SSEEvent] = []
        pos = 0
        while True:
            m = _EOL.search(self._buf, pos)
            if m is None:
                break
            if m.group() == b"\r" and m.end() == len(self._buf):
                break  # maybe the first half of a CRLF split across reads: wait for more
            line = bytes(self._buf[pos : m.start()])
            pos = m.end()
            event = self._line(line)
            if event is not None:
                out.append(event)
        del self._buf[:pos]
        if len(self._buf) > MAX_EVENT_BYTES:
            raise SSEDecodeError(f"an SSE line exceeds {MAX_EVENT_BYTES} bytes")
        return out

    @property
    def pending(self) -> bool:
        """True when an incomplete line or an undispatched event is buffered."""
        return bool(self._buf.strip(b"\r")) or bool(self._data) or bool(self._event)

    def _line(self, raw: bytes) -> SSEEvent | None:
        if not self._started:
            self._started = True
            raw = raw.removeprefix(b"\xef\xbb\xbf")
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise SSEDecodeError(f"invalid UTF-8 in an SSE line at byte {e.start}") from None
        if not line:
            if not self._data:
                self._event = ""
                return None
            event = SSEEvent(self._event or "message", "\n".join(self._data))
            self._event, self._data = "", []
            return event
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        # id: and retry: are irrelevant to a one-shot response; unknown fields are ignored (SSE spec).
        return None
