"""Secured nats-servers for the system suite: the deployment's users and permissions, and TLS.

* :func:`secured_cluster` starts a 3-node cluster enforcing ``deploy/nats/auth.conf`` (the file the
  compose deployment includes), with passwords of this run's own in ``NATS_PW_*``.
* :func:`identity_env` is what a service needs to connect as its user (LW_NATS_USER,
  LW_NATS_PASSWORD, LW_NATS_INBOX_PREFIX), as compose.yaml sets it.
* :func:`make_certs` writes a throw-away CA and a server certificate for 127.0.0.1 with the
  ``openssl`` command line (no Python dependency), and a client certificate for mutual TLS.
* :func:`violations` connects as a user, attempts publishes/subscriptions, and returns the
  permission errors the server reported.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio
import nats

from shared.natsserver import NatsCluster

ROOT = Path(__file__).resolve().parents[2]
AUTH_CONF = ROOT / "deploy" / "nats" / "auth.conf"
# The users of deploy/nats/auth.conf this suite uses (a tool's user is tool_<name>).
USERS = (
    "committer",
    "model_step",
    "tool_calculator",
    "tool_clock",
    "tool_sleep",
    "tool_kv_memory",
    "mcp_time",
    "operator",
    "reader",
)


def password_var(user: str) -> str:
    return f"NATS_PW_{user.upper()}"


@dataclass
class SecuredCluster:
    cluster: NatsCluster
    passwords: dict[str, str]

    @property
    def urls(self) -> list[str]:
        return self.cluster.urls

    def log(self) -> str:
        return "\n".join(n.log_tail(1_000_000) for n in self.cluster.nodes)


def identity_env(sc: SecuredCluster, user: str) -> dict[str, str]:
    return {
        "LW_NATS_USER": user,
        "LW_NATS_PASSWORD": sc.passwords[user],
        "LW_NATS_INBOX_PREFIX": f"_INBOX_{user}",
    }


@contextmanager
def secured_cluster(base: Path) -> Iterator[SecuredCluster]:
    """A 3-node cluster with ``auth.conf`` included by every node (users in account LOOPWIRE)."""
    passwords = {u: f"pw-{u}-{uuid.uuid4().hex[:8]}" for u in USERS}
    # auth.conf references every NATS_PW_* variable it defines: give the unused ones a value too.
    needed = {
        line.split("$", 1)[1].strip().rstrip(",}").strip()
        for line in AUTH_CONF.read_text().splitlines()
        if "password: $" in line
    }
    env = {v: f"unused-{uuid.uuid4().hex}" for v in needed}
    env.update({password_var(u): p for u, p in passwords.items()})
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # nats-server reads the $NATS_PW_* references from its environment
    for i in range(3):
        node_dir = base / f"n{i + 1}"
        node_dir.mkdir(parents=True, exist_ok=True)
        shutil.copy(AUTH_CONF, node_dir)  # an include resolves beside the including config
    cluster = NatsCluster(base_dir=str(base), extra_config='include "auth.conf"')
    try:
        cluster.start()
        yield SecuredCluster(cluster=cluster, passwords=passwords)
    finally:
        cluster.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


async def violations(
    url: str | Sequence[str],
    user: str,
    password: str,
    *,
    publish: Sequence[str] = (),
    subscribe: Sequence[tuple[str, str]] = (),
    expect: int,
    wait: float = 5.0,
) -> list[str]:
    """Attempt the publishes and subscriptions as ``user``; the server's permission errors (in order).

    Waits until ``expect`` errors arrived (or ``wait`` seconds, then returns what came).
    """
    seen: list[str] = []
    got = anyio.Event()

    async def on_error(e: Exception) -> None:
        seen.append(str(e))
        if len(seen) >= expect:
            got.set()

    nc = await nats.connect(
        servers=[url] if isinstance(url, str) else list(url),
        user=user,
        password=password,
        inbox_prefix=f"_INBOX_{user}",
        error_cb=on_error,
        allow_reconnect=False,
        connect_timeout=5,
    )
    try:
        for subject in publish:
            await nc.publish(subject, b"{}")
        for subject, queue in subscribe:
            await nc.subscribe(subject, queue=queue)
        await nc.flush(timeout=5)
        with anyio.move_on_after(wait):
            await got.wait()
        if expect == 0:
            await anyio.sleep(0.5)  # room for an error that should not come
    finally:
        await nc.close()
    return seen


# --- TLS -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Certs:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_certs(d: Path) -> Certs:
    """A self-signed CA, a server certificate for 127.0.0.1/localhost and a client certificate (EC P-256)."""
    d.mkdir(parents=True, exist_ok=True)
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl(
        "req",
        "-x509",
        *ec,
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=loopwire test CA",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
        cwd=d,
    )
    for name, usage, san in (
        ("server", "serverAuth", "subjectAltName=IP:127.0.0.1,DNS:localhost"),
        ("client", "clientAuth", "subjectAltName=DNS:loopwire-client"),
    ):
        (d / f"{name}.ext").write_text(f"{san}\nextendedKeyUsage={usage}\nbasicConstraints=CA:FALSE\n")
        _openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN=loopwire-{name}", cwd=d)
        _openssl(
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            f"{name}.pem",
            "-days",
            "2",
            "-extfile",
            f"{name}.ext",
            cwd=d,
        )
    return Certs(d / "ca.pem", d / "server.pem", d / "server.key", d / "client.pem", d / "client.key")


def tls_config(c: Certs, *, verify_clients: bool = False) -> str:
    """The nats-server ``tls {}`` block (``verify``: clients must present a certificate from the CA)."""
    lines = [f'cert_file: "{c.server_cert}"', f'key_file: "{c.server_key}"', "timeout: 5"]
    if verify_clients:
        lines += [f'ca_file: "{c.ca}"', "verify: true"]
    return "tls {\n  " + "\n  ".join(lines) + "\n}"
