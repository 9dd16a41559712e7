"""A throwaway PostgreSQL server for the store benchmarks: its own data folder, port and database.

Debian's server programs (``/usr/lib/postgresql/*/bin``) or ``pg_ctl`` on PATH; run as Debian's
``postgres`` user when this process is root (PostgreSQL refuses root). Loopback only, trust
authentication: nothing but the benchmark on this machine connects, and it is gone afterwards.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
from pathlib import Path


def pg_bin() -> Path | None:
    """The folder of PostgreSQL's server programs, or None when none is installed."""
    found = shutil.which("pg_ctl") or next(iter(sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))[-1:]), None)
    return Path(found).resolve().parent if found else None


def stores_problem(value: str, known: tuple[str, ...], other: str | None = None) -> tuple[list[str], str | None]:
    """``--stores``' names and the first problem (None: none): unknown names, then ``other`` (the
    caller's own flags), then PostgreSQL asked for where its server programs are missing."""
    stores = [s for s in value.split(",") if s]
    if not stores or set(stores) - set(known):
        return stores, f"--stores {value!r}: use {', '.join(known)} (comma-separated)"
    if other is None and "postgresql" in stores and pg_bin() is None:
        other = "no PostgreSQL server programs (pg_ctl): apt-get install -y postgresql, or --stores sqlite"
    return stores, other


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _as_pg(cmd: list[str]) -> list[str]:
    """``cmd`` run as the postgres user when this process is root."""
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


@contextlib.contextmanager
def postgres(root: Path, max_connections: int = 100):
    """Start a PostgreSQL server with its data in ``root/pg``; yields the SQLAlchemy URI of its
    ``mlflow`` database; stops the server (by its data folder) on leaving."""
    bin_ = pg_bin()
    if bin_ is None:
        raise RuntimeError("no PostgreSQL server programs (pg_ctl): apt-get install -y postgresql")
    data, port = root / "pg", free_port()
    data.mkdir(parents=True)
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
        shutil.chown(data, "postgres")
    run = lambda *cmd: subprocess.run(_as_pg([str(bin_ / cmd[0]), *cmd[1:]]), check=True, capture_output=True)  # noqa: E731
    run("initdb", "-D", str(data), "-U", "mlflow", "--auth=trust", "-E", "UTF8")
    conf = f"listen_addresses = '127.0.0.1'\nport = {port}\nunix_socket_directories = '{data}'\n"
    conf += f"max_connections = {max_connections}\n"  # defaults otherwise: durable commits, as SQLite's
    with open(data / "postgresql.conf", "a") as f:
        f.write(conf)
    run("pg_ctl", "-D", str(data), "-l", str(data / "server.log"), "-w", "-t", "120", "start")
    try:
        run("createdb", "-h", "127.0.0.1", "-p", str(port), "-U", "mlflow", "mlflow")
        yield f"postgresql+psycopg2://mlflow@127.0.0.1:{port}/mlflow"
    finally:
        subprocess.run(_as_pg([str(bin_ / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"]), capture_output=True)
