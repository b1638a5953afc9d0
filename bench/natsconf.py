"""The benchmarks' own nats-server settings on top of ``shared.natsserver``: JetStream's fsync policy.

``sync_interval`` (inside the ``jetstream`` block) is how often the file store fsyncs: the server's
default is every 2 minutes (a crash of the machine, not of the process, can lose what was acked
since); ``always`` fsyncs every write before acking it. :class:`SyncedNatsServer` writes the value
asked for, whatever the shared config says, so a benchmark compares exactly the two.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from shared.natsserver import NatsServer

# "" = leave it to the server (its default, 2 minutes); "always" = fsync every write.
SYNC_DEFAULT: Final = ""
SYNC_ALWAYS: Final = "always"
_SYNC_SETTING: Final = re.compile(r",?\s*sync_interval:\s*[^,}\s]+")


@dataclass
class SyncedNatsServer(NatsServer):
    """A :class:`NatsServer` whose JetStream block has ``sync_interval`` set to :attr:`sync_interval`
    (none at all for :data:`SYNC_DEFAULT`)."""

    sync_interval: str = SYNC_DEFAULT

    def config(self) -> str:
        lines = []
        for line in super().config().splitlines():
            if line.lstrip().startswith("jetstream {"):
                line = _SYNC_SETTING.sub("", line)
                if self.sync_interval:
                    head, _, _ = line.rpartition("}")
                    line = f"{head.rstrip()}, sync_interval: {self.sync_interval} }}"
            lines.append(line)
        return "\n".join(lines) + "\n"


def sync_label(sync_interval: str) -> str:
    return f"sync_interval: {sync_interval}" if sync_interval else "default (sync_interval 2m)"
