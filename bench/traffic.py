"""Messages routed through nats-server, from the server's own statistics (``/varz`` on the monitoring port).

``in_msgs`` counts messages a server received (from clients and, in a cluster, from its routes),
``out_msgs`` the deliveries it made (one per matching subscription). A snapshot before and after a
run, summed over every node, divided by the run's committed steps gives the messages per step.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

FIELDS = ("in_msgs", "out_msgs", "in_bytes", "out_bytes")


@dataclass(frozen=True)
class Traffic:
    in_msgs: int = 0
    out_msgs: int = 0
    in_bytes: int = 0
    out_bytes: int = 0

    def __sub__(self, other: Traffic) -> Traffic:
        return Traffic(*(getattr(self, f) - getattr(other, f) for f in FIELDS))

    def per_step(self, steps: int, nodes: int) -> dict[str, Any]:
        """The counters per committed step (plus the node count they were summed over)."""
        out: dict[str, Any] = {f: round(v / steps, 2) if steps else 0.0 for f, v in asdict(self).items()}
        out["nodes"] = nodes
        return out


def varz(http_port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/varz", timeout=10) as r:
        data: dict[str, Any] = json.loads(r.read())
    return data


def snapshot(http_ports: Iterable[int]) -> Traffic:
    """The counters of every listed server, summed."""
    total = Traffic()
    for port in http_ports:
        v = varz(port)
        total = Traffic(*(getattr(total, f) + int(v.get(f, 0)) for f in FIELDS))
    return total
