"""A PostgreSQL for the peers: the machine's own on 127.0.0.1:5432 if it answers, else one we start.

Each peer gets a database of its own (``lw_bench_<name>``), dropped and created fresh per run.
Starting our own uses the Debian binaries (``/usr/lib/postgresql/*/bin``): ``initdb`` into a temp
directory, ``postgres`` on a free loopback port, trust auth, default (durable) settings.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from shared.natsserver import free_port
from shared.procs import die_with_parent


def _bin_dir() -> Path | None:
    for cand in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (cand / "initdb").exists():
            return cand
    found = shutil.which("initdb")
    return Path(found).parent if found else None


@dataclass
class Postgres:
    host: str = "127.0.0.1"
    port: int = 5432
    user: str = "postgres"
    own_dir: str = ""
    proc: subprocess.Popen[bytes] | None = None
    databases: list[str] = field(default_factory=list)

    def dsn(self, db: str) -> str:
        return f"postgresql://{self.user}@{self.host}:{self.port}/{db}"

    def _connect(self, db: str = "postgres") -> object:
        import psycopg

        return psycopg.connect(self.dsn(db), autocommit=True, connect_timeout=3)

    def alive(self) -> bool:
        try:
            with self._connect():  # type: ignore[attr-defined]
                return True
        except Exception:
            return False

    def fresh_database(self, name: str) -> str:
        with self._connect() as conn:  # type: ignore[attr-defined]
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}"')
        self.databases.append(name)
        return self.dsn(name)

    def database_bytes(self, name: str) -> int:
        with self._connect() as conn:  # type: ignore[attr-defined]
            row = conn.execute("SELECT pg_database_size(%s)", (name,)).fetchone()
        return int(row[0])

    def relation_bytes(self, db: str, tables: list[str]) -> int:
        """Total size (heap + TOAST + indexes) of the tables that exist."""
        total = 0
        with self._connect(db) as conn:  # type: ignore[attr-defined]
            for t in tables:
                row = conn.execute("SELECT to_regclass(%s)", (t,)).fetchone()
                if row and row[0]:
                    total += int(conn.execute("SELECT pg_total_relation_size(%s::regclass)", (t,)).fetchone()[0])
        return total

    def settings(self) -> dict[str, str]:
        with self._connect() as conn:  # type: ignore[attr-defined]
            return {
                k: str(conn.execute(f"SHOW {k}").fetchone()[0])
                for k in ("server_version", "fsync", "synchronous_commit", "wal_sync_method")
            }

    def cleanup(self) -> None:
        with contextlib.suppress(Exception), self._connect() as conn:  # type: ignore[attr-defined]
            for name in self.databases:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        if self.proc is not None:
            self.proc.terminate()
            with contextlib.suppress(Exception):
                self.proc.wait(timeout=20)
        if self.own_dir:
            shutil.rmtree(self.own_dir, ignore_errors=True)


def ensure_postgres() -> Postgres:
    """The local server if it answers on 127.0.0.1:5432, else a private one (raises if impossible)."""
    pg = Postgres()
    if pg.alive():
        return pg
    bindir = _bin_dir()
    if bindir is None:
        raise RuntimeError("no PostgreSQL on 127.0.0.1:5432 and no initdb found (apt-get install postgresql)")
    d = tempfile.mkdtemp(prefix="lw-bench-pg-")
    data = Path(d) / "data"
    user = getpass.getuser()
    run_as: list[str] = []
    if os.geteuid() == 0:  # postgres refuses to run as root: use the postgres system user
        shutil.chown(d, "postgres")
        run_as = ["runuser", "-u", "postgres", "--"]
        user = "postgres"
    subprocess.run(
        [*run_as, str(bindir / "initdb"), "-D", str(data), "-U", user, "--auth=trust", "-E", "UTF8"],
        check=True,
        capture_output=True,
    )
    port = free_port()
    proc = subprocess.Popen(
        [
            *run_as,
            str(bindir / "postgres"),
            "-D",
            str(data),
            "-p",
            str(port),
            "-c",
            "listen_addresses=127.0.0.1",
            "-c",
            f"unix_socket_directories={d}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=die_with_parent,
    )
    pg = Postgres(port=port, user=user, own_dir=d, proc=proc)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if pg.alive():
            return pg
        time.sleep(0.2)
    pg.cleanup()
    raise RuntimeError("the private PostgreSQL did not start within 30 s")
