"""One driver per grid: an advisory file lock that names its holder."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import socket
import time
from pathlib import Path

from raystudy import paths
from raystudy.errors import ConfigError
from raystudy.spaces.grids import Trial, grid_key


class GridBusy(ConfigError):
    """Another driver runs this grid (same storage and key)."""


_HELD: dict[str, int] = {}


def grid_name(trials: list[Trial], label: str) -> str:
    """The grid's folder under the storage path (and its lock's name)."""
    return f"{label}-{grid_key(trials)}"


def lock_path(storage: Path | str, name: str) -> Path:
    """Next to the grid's Tune folder; for object storage (s3://), in the local cache, keyed by it."""
    if "://" in str(storage):
        digest = hashlib.sha256(f"{storage}/{name}".encode()).hexdigest()[:16]
        return paths.cache() / "locks" / f"{name}-{digest}.lock"
    return Path(storage) / f".{name}.lock"


@contextlib.contextmanager
def grid_lock(storage: Path | str, name: str, log=print):
    """Hold the grid's lock while driving it, or raise ``GridBusy`` naming the driver that does.

    An advisory ``flock`` on a file that names its holder (host, pid, start): the kernel drops it
    when the holder dies, however it dies, so a stale file is simply taken over. On a shared
    folder across hosts this needs a file system with working locks (NFSv4 does). Reentrant in
    one process (a session holds it before starting Ray; ``grid_run.run_grid`` takes it again).
    """
    key = str(lock_path(storage, name))
    if key in _HELD:
        _HELD[key] += 1
        try:
            yield
        finally:
            _HELD[key] -= 1
        return
    with _locked(lock_path(storage, name), name, log):
        _HELD[key] = 1
        try:
            yield
        finally:
            del _HELD[key]


@contextlib.contextmanager
def _locked(path: Path, name: str, log):
    """The lock file at ``path`` flocked and naming this process, emptied again on release."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:  # closing it drops the flock
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            h = _holder(f.read())
            raise GridBusy(
                f"grid {name} is already being run by pid {h.get('pid', '?')} on host "
                f"{h.get('host', '?')} (since {h.get('started', '?')}; lock {path}); "
                "wait for it to end or stop it first"
            ) from None
        f.seek(0)
        old = _holder(f.read())
        if old and log:
            log(f"the grid's last driver (pid {old.get('pid')} on {old.get('host')}) is gone; taking over its lock")
        f.seek(0)
        f.truncate()
        f.write(
            json.dumps(
                {"host": socket.gethostname(), "pid": os.getpid(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}
            )
        )
        f.flush()
        try:
            yield
        finally:
            f.seek(0)
            f.truncate()  # an empty file: released cleanly
            f.flush()


def _holder(text: str) -> dict:
    try:
        return json.loads(text) if text.strip() else {}
    except ValueError:
        return {}
