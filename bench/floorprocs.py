"""The floor's processes: its nats-server (or 3-node cluster) and its tool and commit responders."""

from __future__ import annotations

import os
from typing import Any

from bench.floor import run_floor
from bench.meter import RunMeter, add_cpu
from shared.natsserver import NatsCluster, NatsServer
from shared.procs import ServiceProcess, Supervisor


class FloorProcesses:
    """The floor's server(s) and responders, kept up for its runs (R3 on a ``cluster``, else R1)."""

    def __init__(self, cluster: bool = False) -> None:
        self.nats_cluster = NatsCluster().start() if cluster else None
        self.srv = None if cluster else NatsServer().start()
        nodes = self.nats_cluster.nodes if self.nats_cluster is not None else [self.srv]
        self.servers = [n for n in nodes if n is not None]
        self.url = self.nats_cluster.url if self.nats_cluster is not None else self.servers[0].url
        self.sup = Supervisor()
        try:
            for k in ("tool", "commit"):
                args = ["-m", "bench.floor", "serve", k, "--url", self.url, "--replicas", "3" if cluster else "1"]
                self.sup.start(ServiceProcess(f"floor-{k}", args, {}), timeout=60)
        except BaseException:
            self.stop()
            raise
        self.pids = {p.name: p.pid for p in self.sup.services}
        for n in self.servers:
            assert n.proc is not None
            self.pids[f"nats-{n.name}"] = n.proc.pid
        self.pids["driver"] = os.getpid()

    @property
    def http_ports(self) -> list[int]:
        return [n.http_port for n in self.servers]

    async def run(self, loops: int, steps: int, record: bytes, runs: int = 1) -> dict[str, Any]:
        """``runs`` runs of ``loops`` × ``steps``: their CPU per step together."""
        seconds: dict[str, float] = {}
        for _ in range(runs):
            meter = RunMeter(self.pids, self.http_ports)
            await run_floor(self.url, loops, steps, record, on_start=meter.begin, on_end=meter.end)
            add_cpu(seconds, meter)
        n = runs * loops * steps
        return {"cpu_us_per_step": {name: round(s / n * 1e6) for name, s in seconds.items()}}

    def stop(self) -> None:
        for p in self.sup.services:
            p.stop()
        if self.nats_cluster is not None:
            self.nats_cluster.cleanup()
        if self.srv is not None:
            self.srv.cleanup()
