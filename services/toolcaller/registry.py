"""Tool discovery: workers keep their spec in KV ``<prefix>_tools``; callers watch the bucket.

Key ``<tool_name>.<worker_id>`` → :class:`~services.toolwire.spec.Registration`. A worker puts its
entries after it subscribed (so a listed tool is callable), refreshes them every
:data:`REFRESH_SECONDS` and deletes them on a graceful stop. The bucket's TTL
(``services.toolwire.bucket.REGISTRATION_TTL_SECONDS``) removes the entries of a worker that died; since that expiry is
silent, the registry also forgets an entry it has not seen written for that long (entries loaded at
start count as seen then, so no clock comparison with the server is needed).

:class:`ToolRegistry` follows the bucket with a KV watch, so a new worker is visible to a running
caller within milliseconds (no polling, no restart).

Conflict rule: the replicas of one tool must agree on version, input schema, ``sequential``,
``write_target`` and kind (description and timeout may differ; the newest registration's are
used). When live workers disagree the tool is *conflicted*: :meth:`ToolRegistry.conflicts` lists
the variants, :meth:`ToolRegistry.live` leaves it out (the model is not offered it),
:meth:`ToolRegistry.get` returns it with ``conflict`` set, and the batch executor fails its calls
with ``error: tool unavailable: ...`` without sending them — NATS would otherwise spread them over
both versions of the queue group. It is usable again as soon as the workers agree.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Final, Protocol, cast

import anyio
import msgspec
from nats.aio.client import Client as NATS
from nats.js.kv import KeyValue

from services.toolwire import bucket
from services.toolwire.spec import Registration, ToolSpec, valid_tool_name
from shared.subjects import Names

log = logging.getLogger("loopwire.tools.registry")

REGISTRATION_TTL_SECONDS: Final = bucket.REGISTRATION_TTL_SECONDS
REFRESH_SECONDS: Final = bucket.REFRESH_SECONDS
_SWEEP_SECONDS: Final = 1.0


def _silence_seconds() -> float:
    """No registration at all for this long: the bucket, not the workers, is the likely problem."""
    return REFRESH_SECONDS + 2 * _SWEEP_SECONDS


_KV_DEL: Final = bucket.KV_DEL
_KV_PURGE: Final = bucket.KV_PURGE
# Start-up (see ToolRegistry._load): how long a silent watch is waited for, and how many entries
# are read directly at once.
_LOAD_QUIET_SECONDS: Final = 0.5
_DIRECT_READS: Final = 16


# (ToolSpec.input_schema is a JSON Schema of any JSON values: the one Any of this module.)
class LiveTool(ToolSpec, kw_only=True):  # type: ignore[explicit-any]
    """A tool as the registry sees it: the spec plus how many workers serve it."""

    replicas: int = 0
    workers: list[str] = msgspec.field(default_factory=list)
    # Non-empty when live workers disagree (see the module's conflict rule): one line per variant.
    conflict: list[str] = msgspec.field(default_factory=list)


_reg_decoder = msgspec.json.Decoder(Registration)


class _Watcher(Protocol):
    """What the registry uses of a KV watch (nats-py's watcher is untyped)."""

    def __aiter__(self) -> AsyncIterator[KeyValue.Entry | None]: ...

    async def stop(self) -> None: ...


class ToolRegistry:
    """Live view of the tools bucket. ``await start()`` returns once the current entries are loaded."""

    def __init__(self, nc: NATS, names: Names, *, replicas: int = 1) -> None:
        self._nc = nc
        self._names = names
        self._replicas = replicas
        # name -> worker id -> (arrival order, last seen (monotonic), registration)
        self._regs: dict[str, dict[str, tuple[int, float, Registration]]] = {}
        self._no_workers: set[str] = set()
        # Views as of the last change (asked for on every step; changes come with registrations).
        self._views: dict[str, LiveTool | None] = {}
        self._live: list[LiveTool] | None = None
        self._changed = anyio.Event()
        self._loaded = asyncio.Event()
        # While starting (see _load): the newest revision applied per key, the newest read directly,
        # the watch's newest, and an event set on each thing the watch delivers.
        self._revisions: dict[str, int] | None = {}
        self._fetched_up_to = 0
        self._watched_up_to = 0
        self._progress = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._watcher: _Watcher | None = None
        self._seq = 0
        self._last_put = time.monotonic()  # when the last registration arrived (see _sweep)

    async def __aenter__(self) -> ToolRegistry:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self, timeout: float = 10.0) -> None:
        """Watch the bucket and return once every entry it held is in the view; a registry stopped
        after a start that failed (a start-up retried while JetStream elects) starts afresh."""
        await self.stop()
        self._revisions, self._fetched_up_to, self._watched_up_to = {}, 0, 0
        self._loaded = asyncio.Event()
        kv = await bucket.ensure_tools_bucket(self._nc.jetstream(), self._names, self._replicas)
        self._watcher = cast(_Watcher, await kv.watchall())
        self._task = asyncio.get_running_loop().create_task(self._follow())
        self._sweeper = asyncio.get_running_loop().create_task(self._sweep())
        with anyio.fail_after(timeout):
            await self._load()

    async def _load(self) -> None:
        """Return once every key the bucket held when the watch began is in the view.

        nats-py's "initial values done" (its marker, or the entry that left nothing pending) is no
        end to wait for: it compares message counts, so it can come before entries the server had
        already sent; and while workers rewrite their entries, an entry due in the initial values
        is replaced (the bucket keeps one revision) before it is sent, its new revision comes
        later as an update, and the consumer's pending count can reach 0 first. So the keys and
        the bucket's last revision are read once the watch exists; each key is done when the
        watch delivers it. Once the watch is past that revision (it delivers in revision order),
        a key still missing was rewritten, removed or expired meanwhile: it is read directly, at
        its current revision, and the watch's older revisions of it are then skipped.
        """
        keys, last = await bucket.tools_bucket_keys(self._nc, self._names)
        revisions = self._revisions
        assert revisions is not None
        while not keys <= revisions.keys() and self._watched_up_to < last:
            self._progress.clear()
            # A quiet watch short of ``last``: that revision itself is gone (expired, say).
            with anyio.move_on_after(_LOAD_QUIET_SECONDS) as quiet:
                await self._progress.wait()
            if quiet.cancelled_caught:
                break
        limiter = anyio.CapacityLimiter(_DIRECT_READS)

        async def read(key: str) -> None:
            async with limiter:
                entry = await bucket.read_entry(self._nc, self._names, key)
            if entry is not None:
                self._fetched_up_to = max(self._fetched_up_to, entry.revision)
                self._take(entry.key, entry.value, entry.operation, entry.revision)

        async with anyio.create_task_group() as tg:
            for key in sorted(keys - revisions.keys()):
                tg.start_soon(read, key)
        self._loaded.set()

    async def stop(self) -> None:
        for task in (self._task, self._sweeper):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        self._task = self._sweeper = None
        if self._watcher is not None:
            with contextlib.suppress(Exception):
                await self._watcher.stop()
            self._watcher = None

    async def _follow(self) -> None:
        assert self._watcher is not None
        async for entry in self._watcher:
            if entry is not None:  # (None: nats-py's "initial values done", no end: see _load)
                revision = entry.revision or 0
                self._watched_up_to = max(self._watched_up_to, revision)
                self._take(entry.key, entry.value, entry.operation, revision)
                if self._loaded.is_set() and revision > self._fetched_up_to:
                    # Past every revision read directly: the watch delivers in revision order, so
                    # nothing older of any key is still to come.
                    self._revisions = None
            self._progress.set()

    def _take(self, key: str, value: bytes | None, op: str | None, revision: int) -> None:
        """Apply one entry unless, during the start, a newer revision of its key is already applied."""
        if self._revisions is not None:
            if revision <= self._revisions.get(key, 0):
                return
            self._revisions[key] = revision
        try:
            self._apply(key, value, op)
        except Exception:  # one bad entry never stops discovery
            log.warning("tools registry: ignoring entry %r", key, exc_info=True)

    def _apply(self, key: str, value: bytes | None, op: str | None) -> None:
        name, _, worker_id = key.partition(".")
        if op in (_KV_DEL, _KV_PURGE) or not value:
            workers = self._regs.get(name)
            if workers is not None:
                workers.pop(worker_id, None)
                if not workers:
                    del self._regs[name]
        else:
            reg = _reg_decoder.decode(value)
            if reg.spec.name != name or not valid_tool_name(name):
                raise ValueError(f"registration key {key!r} does not match spec name {reg.spec.name!r}")
            now = time.monotonic()
            if now - self._last_put > _silence_seconds():
                # Writes resume after a silence (see _sweep): it counts against nobody's TTL.
                for regs in self._regs.values():
                    for w, (order, _, r) in regs.items():
                        regs[w] = (order, now, r)
            self._last_put = now
            self._seq += 1
            self._regs.setdefault(name, {})[worker_id] = (self._seq, now, reg)
            self._no_workers.discard(name)
        self._notify()

    def _notify(self) -> None:
        self._views.clear()
        self._live = None
        self._changed.set()
        self._changed = anyio.Event()

    async def _sweep(self) -> None:
        """Forget registrations nobody refreshed for the TTL (dead workers; KV expiry is silent).

        Only while registrations keep arriving: when none at all came for longer than a refresh
        period, the bucket is the likely problem, not every worker at once (its stream is electing
        a leader after a NATS node died, and no worker can refresh), so what is known is kept
        until writes resume instead of every tool vanishing for every caller. A worker that really
        died meanwhile is caught by NATS "no responders" (:meth:`mark_no_workers`).
        """
        while True:
            await asyncio.sleep(_SWEEP_SECONDS)
            if time.monotonic() - self._last_put > _silence_seconds():
                continue
            cutoff = time.monotonic() - REGISTRATION_TTL_SECONDS
            changed = False
            for name in list(self._regs):
                workers = self._regs[name]
                for worker_id in [w for w, (_, seen, _) in workers.items() if seen < cutoff]:
                    del workers[worker_id]
                    changed = True
                if not workers:
                    del self._regs[name]
            if changed:
                self._notify()

    # --- queries ---------------------------------------------------------------------------------

    def _view(self, name: str) -> LiveTool | None:
        try:
            return self._views[name]
        except KeyError:
            view = self._views[name] = self._make_view(name)
            return view

    def _make_view(self, name: str) -> LiveTool | None:
        workers = self._regs.get(name)
        if not workers:
            return None
        newest = max(workers.values(), key=lambda sr: sr[0])[2]
        if name in self._no_workers:
            # Known but unreachable: callers answer "unavailable", not "unknown" (which reads to a
            # model as "this tool does not exist") until a worker registers again or the sweep forgets it.
            return LiveTool(**{f: getattr(newest.spec, f) for f in ToolSpec.__struct_fields__})
        variants: dict[bytes, list[Registration]] = {}
        for _, _, reg in workers.values():
            variants.setdefault(reg.spec.compatibility_key(), []).append(reg)
        conflict = []
        if len(variants) > 1:
            for regs in variants.values():
                conflict.append(f"version {regs[0].spec.version!r} ({len(regs)} worker(s))")
            conflict.sort()
        spec = newest.spec
        fields = {f: getattr(spec, f) for f in ToolSpec.__struct_fields__}
        fields["healthy"] = any(reg.spec.healthy for _, _, reg in workers.values())  # one healthy replica serves
        return LiveTool(
            **fields,
            replicas=len(workers),
            workers=sorted(workers),
            conflict=conflict,
        )

    def live(self) -> list[LiveTool]:
        """Tools with at least one live worker and no conflict, by name."""
        if self._live is None:
            views = (self._view(name) for name in sorted(self._regs))
            self._live = [v for v in views if v is not None and v.replicas and not v.conflict]
        return list(self._live)

    def names(self) -> frozenset[str]:
        """Every tool name some worker registered (conflicted and unreachable ones included)."""
        return frozenset(self._regs)

    def get(self, name: str) -> LiveTool | None:
        """The tool ``name`` (conflicted ones included, with ``conflict`` set; ``replicas == 0`` while every
        worker it had failed to answer), or None if no worker has it."""
        if not valid_tool_name(name):
            return None
        return self._view(name)

    def conflicts(self) -> dict[str, list[ToolSpec]]:
        """Tools whose live workers disagree: name → the distinct specs."""
        out: dict[str, list[ToolSpec]] = {}
        for name, workers in sorted(self._regs.items()):
            variants: dict[bytes, ToolSpec] = {}
            for _, _, reg in workers.values():
                variants.setdefault(reg.spec.compatibility_key(), reg.spec)
            if len(variants) > 1:
                out[name] = list(variants.values())
        return out

    def mark_no_workers(self, name: str) -> None:
        """A call got "no responders": no live replica until a worker registers again.

        Not for a tool whose every replica says it is unhealthy: those left their queue groups on
        purpose while their backend restarts, and the tool stays listed (as down)."""
        view = self._view(name)
        if view is not None and not view.healthy:
            return
        if name in self._regs and name not in self._no_workers:
            self._no_workers.add(name)
            self._notify()

    async def wait_for(self, name: str, *, replicas: int = 1, timeout: float = 5.0) -> LiveTool:
        """Wait until ``name`` has at least ``replicas`` live workers (tests, start-up ordering)."""
        with anyio.fail_after(timeout):
            while True:
                view = self._view(name)
                if view is not None and view.replicas >= max(1, replicas):
                    return view
                await self._changed.wait()

    async def wait_gone(self, name: str, *, timeout: float = 5.0) -> None:
        """Wait until no worker is registered for ``name``."""
        await self.wait_until(lambda r: r.get(name) is None, timeout=timeout)

    async def wait_until(self, predicate: Callable[[ToolRegistry], bool], *, timeout: float = 5.0) -> None:
        """Wait until ``predicate(self)`` holds (re-checked on every registry change)."""
        with anyio.fail_after(timeout):
            while not predicate(self):
                await self._changed.wait()


async def registered_names(nc: NATS, names: Names, *, replicas: int = 1, timeout: float = 10.0) -> frozenset[str]:
    """The tool names of the tools bucket right now (a registry loaded once, then stopped)."""
    registry = ToolRegistry(nc, names, replicas=replicas)
    try:
        await registry.start(timeout)
        return registry.names()
    finally:
        await registry.stop()
