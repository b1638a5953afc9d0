"""Loop leases in KV (``<prefix>_leases``): one driver per loop at a time, normally.

A lease is a key created with the bucket's TTL and refreshed while the holder works. It avoids
wasted work; it is never the fence — the commit's expected sequence is.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass

import nats.js.errors
from nats.js.kv import KeyValue

log = logging.getLogger("loopwire.model_step.lease")


@dataclass
class Lease:
    kv: KeyValue
    key: str
    holder: str
    revision: int
    lost: bool = False

    @classmethod
    async def acquire(cls, kv: KeyValue, key: str, holder: str) -> Lease | None:
        """The lease, or None while somebody else holds it."""
        try:
            rev = await kv.create(key, holder.encode())
        except nats.js.errors.KeyWrongLastSequenceError:
            return None
        except nats.js.errors.APIError as e:
            if getattr(e, "err_code", None) in (10071, 10164):
                return None
            raise
        return cls(kv=kv, key=key, holder=holder, revision=rev)

    async def refresh(self) -> bool:
        if self.lost:
            return False
        try:
            self.revision = await self.kv.update(self.key, self.holder.encode(), last=self.revision)
        except (nats.js.errors.KeyWrongLastSequenceError, nats.js.errors.KeyNotFoundError):
            log.warning("lease %s lost", self.key)
            self.lost = True
        except Exception as e:  # transient: keep working, the commit fence stays the guard
            log.warning("lease %s refresh failed: %s", self.key, e)
        return not self.lost

    async def release(self) -> None:
        if self.lost:
            return
        with contextlib.suppress(Exception):
            await self.kv.delete(self.key, last=self.revision)
        self.lost = True
