"""Checking stored histories against their digest chains (:mod:`shared.chain`): ``loopwire verify``
and the console's verified mark use this one code.

Every record of a loop is re-read from its history stream (Direct Get batches, headers included)
and checked in order: its digest over its own bytes (a *changed* record), its chain index right
after the previous record's (a *gap*: records missing in between), its previous digest being that
record's digest (a *broken* chain). A chain begins at index 1 after :data:`shared.chain.GENESIS`,
or, for a fork, right after its source's record at the fork point. Records stored before digests
existed are counted as *unchained*, not as problems, as long as no digested record came before
them. A history stream that is missing or cannot be read is a problem of its own (it did not
recover); so is a message deleted from one (history streams refuse deletes: a deletion is a loss).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Final

import msgspec
import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS

from shared import shards
from shared.chain import GENESIS, Link, Stamp, digest_of, link_after, stamp_of
from shared.errors import MalformedStampError
from shared.jserrors import JetStreamError, JetStreamUnavailableError
from shared.streamreads import StoredMsg, direct_get_batch, get_msg
from shared.subjects import Names

GAP: Final = "gap"
CHANGED: Final = "changed"
BROKEN: Final = "broken"
STREAM: Final = "stream"  # a history stream missing or unreadable: it did not recover
KINDS: Final = (GAP, CHANGED, BROKEN, STREAM)
BATCH: Final = 1000


@dataclass(frozen=True, slots=True)
class Problem:
    """One problem found: its kind, where (stream, loop, record sequence) and what."""

    kind: str
    stream: str
    loop_id: str
    seq: int
    detail: str

    def line(self) -> str:
        where = f"loop {self.loop_id}" if self.loop_id else f"stream {self.stream}"
        at = f" seq {self.seq}" if self.seq else ""
        return f"{self.kind:<8} {where}{at}: {self.detail}"

    def to_json(self) -> dict[str, Any]:
        return {
            "problem": self.kind,
            "stream": self.stream,
            "loop_id": self.loop_id or None,
            "seq": self.seq or None,
            "detail": self.detail,
        }


class _Head(msgspec.Struct):
    """What a chain's first record says about a fork (any other field is ignored)."""

    type: str = ""
    source_loop_id: str = ""
    source_seq: int = 0


_head = msgspec.json.Decoder(_Head)


@dataclass(slots=True)
class _Fork:
    seq: int
    source_loop_id: str
    source_seq: int
    stamp: Stamp


@dataclass(slots=True)
class LoopCheck:
    """One loop's records as checked: counts, problems, and a fork's link still to check."""

    loop_id: str
    stream: str
    records: int = 0
    chained: int = 0
    unchained: int = 0
    unchained_last_seq: int = 0
    problems: list[Problem] = field(default_factory=list)
    last: Link | None = None  # None: no digested record yet
    last_seq: int = 0
    fork: _Fork | None = None

    @property
    def ok(self) -> bool:
        return not self.problems

    def _problem(self, kind: str, seq: int, detail: str) -> None:
        self.problems.append(Problem(kind, self.stream, self.loop_id, seq, detail))

    def add(self, m: StoredMsg) -> None:
        """Check the loop's next record (records come in stream order)."""
        self.records += 1
        try:
            stamp = stamp_of(m.headers)
        except MalformedStampError as e:
            self._problem(CHANGED, m.seq, str(e))
            return
        if stamp is None:
            if self.last is None:
                self.unchained += 1
                self.unchained_last_seq = m.seq
            else:
                self._problem(BROKEN, m.seq, f"it has no digest, but the chain began before it (seq {self.last_seq})")
            return
        self.chained += 1
        if digest_of(stamp.index, stamp.prev, m.data) != stamp.digest:
            self._problem(CHANGED, m.seq, "its content does not match its digest")
        if self.last is None:
            self._begin(m, stamp)
        elif stamp.index > self.last.index + 1:
            missing = stamp.index - self.last.index - 1
            self._problem(GAP, m.seq, f"{missing} record(s) missing between seq {self.last_seq} and it")
        elif stamp.index != self.last.index + 1 or stamp.prev != self.last.digest:
            self._problem(
                BROKEN,
                m.seq,
                f"it does not follow seq {self.last_seq} (chain index {stamp.index} after "
                f"{self.last.index}, or another previous digest)",
            )
        self.last, self.last_seq = stamp.link, m.seq

    def _begin(self, m: StoredMsg, stamp: Stamp) -> None:
        try:
            head = _head.decode(m.data)
        except msgspec.DecodeError:
            head = _Head()
        if head.type == "LoopForked" and self.records == 1:
            self.fork = _Fork(m.seq, head.source_loop_id, head.source_seq, stamp)
        elif stamp.index != 1 or stamp.prev != GENESIS:
            self._problem(BROKEN, m.seq, f"the chain begins at index {stamp.index}, not at 1 after the genesis digest")

    def check_fork(self, source: Link | None) -> None:
        """The fork's first record against its source's record at the fork point (None: not there)."""
        f = self.fork
        if f is None:
            return
        if source is None:
            self._problem(
                BROKEN,
                f.seq,
                f"its source's record at the fork point is missing (loop {f.source_loop_id} seq {f.source_seq})",
            )
        elif f.stamp.index != source.index + 1 or f.stamp.prev != source.digest:
            self._problem(
                BROKEN,
                f.seq,
                f"it does not continue its source's chain at the fork point "
                f"(loop {f.source_loop_id} seq {f.source_seq})",
            )


@dataclass(slots=True)
class Report:
    """What a verification read: streams, loops (by id) and stream-level problems."""

    streams: list[str] = field(default_factory=list)
    loops: dict[str, LoopCheck] = field(default_factory=dict)
    stream_problems: list[Problem] = field(default_factory=list)

    @property
    def problems(self) -> list[Problem]:
        out = list(self.stream_problems)
        for c in self.loops.values():
            out += c.problems
        return out

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> dict[str, Any]:
        problems = self.problems
        return {
            "ok": not problems,
            "streams": len(self.streams),
            "loops": len(self.loops),
            "records": sum(c.records for c in self.loops.values()),
            "unchained": sum(c.unchained for c in self.loops.values()),
            "problems": len(problems),
            "by_kind": {k: n for k in KINDS if (n := sum(p.kind == k for p in problems))},
        }


async def _read(nc: NATS, stream: str, subject: str, report: Report, names: Names) -> None:
    """Every message of ``subject`` (a wildcard too) in ``stream``, fed to its loop's check."""
    start = 1
    while True:
        batch = await direct_get_batch(nc, stream, subject, start_seq=start, batch=BATCH)
        for m in batch.messages:
            loop_id = names.loop_of_hist(m.subject)
            check = report.loops.get(loop_id)
            if check is None:
                check = report.loops[loop_id] = LoopCheck(loop_id, stream)
            check.add(m)
            start = m.seq + 1
        if not batch.messages or batch.num_pending == 0:
            return


async def _stream(nc: NATS, stream: str, subject: str, report: Report, names: Names) -> None:
    """Read one history stream into ``report``; a missing or unreadable one is a problem."""
    report.streams.append(stream)
    try:
        info = await nc.jetstream().stream_info(stream)
        await _read(nc, stream, subject, report, names)
    except nats.js.errors.NotFoundError:
        report.stream_problems.append(Problem(STREAM, stream, "", 0, "the stream is missing: it did not recover"))
        return
    except (nats.js.errors.Error, nats.errors.Error, JetStreamError, JetStreamUnavailableError) as e:
        detail = f"the stream cannot be read: {e or type(e).__name__}"
        report.stream_problems.append(Problem(STREAM, stream, "", 0, detail))
        return
    deleted = info.state.num_deleted or 0
    if deleted and subject.endswith(">"):
        detail = f"{deleted} message(s) deleted from the stream (history streams refuse deletes)"
        report.stream_problems.append(Problem(GAP, stream, "", 0, detail))


async def _source_link(nc: NATS, names: Names, loop_id: str, seq: int) -> Link | None:
    home = await shards.home_of(nc, names, loop_id)
    stored = await get_msg(nc, home.stream, seq=seq)
    if stored is None or stored.subject != home.subject:
        return None
    return link_after(stored.headers)


async def _forks(nc: NATS, names: Names, checks: Iterable[LoopCheck]) -> None:
    for c in checks:
        if c.fork is None:
            continue
        try:
            c.check_fork(await _source_link(nc, names, c.fork.source_loop_id, c.fork.source_seq))
        except (ValueError, JetStreamError, JetStreamUnavailableError, nats.errors.Error):
            c.check_fork(None)


async def verify_all(nc: NATS, names: Names) -> Report:
    """Check every loop of every shard's history stream."""
    report = Report()
    for h in shards.history_streams(names):
        await _stream(nc, h.stream, h.subjects, report, names)
    await _forks(nc, names, report.loops.values())
    return report


async def verify_loop(nc: NATS, names: Names, loop_id: str) -> Report:
    """Check one loop (in its home stream); a loop with no records is absent from ``report.loops``."""
    report = Report()
    home = await shards.home_of(nc, names, loop_id)
    await _stream(nc, home.stream, home.subject, report, names)
    await _forks(nc, names, report.loops.values())
    return report
