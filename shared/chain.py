"""The digest chain of a loop's history: what every stored record's ``Lw-Digest`` headers mean.

Each record appended by the committer carries three headers::

    Lw-Chain-Index: <n>        its place in the chain, 1 for the first chained record
    Lw-Digest-Prev: <hex>      the Lw-Digest of the record before it (GENESIS for the first)
    Lw-Digest:      <hex>      SHA-256 of  "<n>\\n<prev hex>\\n"  followed by the stored payload bytes

in lowercase hex (64 characters). The payload is the record exactly as stored (the committer's
canonical envelope), so any language checks a record with one SHA-256 over bytes it reads. A fork's
first record continues its source's chain: its prev is the source record's digest at the fork
point and its index that record's index + 1. Records stored before digests existed carry none;
a chain then starts at the first digested record, as if after :data:`GENESIS`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from shared.errors import MalformedStampError
from shared.subjects import H_CHAIN_INDEX, H_DIGEST, H_DIGEST_PREV

GENESIS: Final = "0" * 64
_HEX: Final = frozenset("0123456789abcdef")


@dataclass(frozen=True, slots=True)
class Link:
    """A record's place in its loop's chain: its index and its digest (index 0 = before the first)."""

    index: int
    digest: str


START: Final = Link(0, GENESIS)


@dataclass(frozen=True, slots=True)
class Stamp:
    """The chain headers of one stored record, as read (see :func:`stamp_of`)."""

    index: int
    prev: str
    digest: str

    @property
    def link(self) -> Link:
        return Link(self.index, self.digest)


def digest_of(index: int, prev: str, payload: bytes) -> str:
    """The digest of the record at ``index`` after the record whose digest is ``prev``."""
    h = hashlib.sha256(f"{index}\n{prev}\n".encode("ascii"))
    h.update(payload)
    return h.hexdigest()


def chain_headers(after: Link, payloads: Sequence[bytes]) -> tuple[list[dict[str, str]], Link]:
    """The chain headers of ``payloads`` stored in order right after ``after``, and the last link."""
    out: list[dict[str, str]] = []
    link = after
    for payload in payloads:
        index = link.index + 1
        digest = digest_of(index, link.digest, payload)
        out.append({H_CHAIN_INDEX: str(index), H_DIGEST_PREV: link.digest, H_DIGEST: digest})
        link = Link(index, digest)
    return out, link


def _is_digest(v: str) -> bool:
    return len(v) == 64 and set(v) <= _HEX


def stamp_of(headers: Mapping[str, str] | None) -> Stamp | None:
    """The chain headers of a stored record; None when it has none (written before digests).

    Raises :class:`MalformedStampError` when some are present but any is missing or malformed.
    """
    h = headers or {}
    raw = (h.get(H_CHAIN_INDEX), h.get(H_DIGEST_PREV), h.get(H_DIGEST))
    if raw == (None, None, None):
        return None
    index, prev, digest = raw
    if index is None or prev is None or digest is None:
        raise MalformedStampError("some of its chain headers are missing")
    if not index.isdigit() or int(index) < 1 or not _is_digest(prev) or not _is_digest(digest):
        raise MalformedStampError("its chain headers are malformed")
    return Stamp(int(index), prev, digest)


def link_after(headers: Mapping[str, str] | None) -> Link:
    """The link a record stored right after this one chains to (START for an undigested record)."""
    try:
        stamp = stamp_of(headers)
    except MalformedStampError:
        return START
    return START if stamp is None else stamp.link
