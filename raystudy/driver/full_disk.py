"""A full disk: one line naming the fullest filesystem and how to resume, Tune's graceful stop, and
what the full disk caused kept out of Tune's, Ray's and MLflow's logs."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from pathlib import Path
from typing import Any

from raystudy.errors import disk_full

_full: dict[str, str] = {}  # the full disk's line, once said


def line(places: dict[str, Any], command: str = "grid") -> str:
    """One line for a full disk: of ``places`` (what -> path: the storage, the store, the tensor
    cache), the filesystem with the least room, what it holds, how much is free and needed (a
    trial's checkpoint, the largest file there), and how to resume."""
    found = []
    for what, path in places.items():
        p = Path(path)
        while not p.exists() and p != p.parent:
            p = p.parent
        try:
            st = os.statvfs(p)
        except OSError:
            continue
        while not os.path.ismount(p) and p != p.parent:
            p = p.parent
        found.append((st.f_bavail * st.f_frsize, str(p), what))
    free, mount, what = min(found) if found else (0, "?", "its files")
    held = [w for f, m, w in found if m == mount] or [what]
    need = max(_largest_checkpoint(places.get("storage")), 1 << 20)
    return (
        f"error: the disk is full: {mount} (holding {', '.join(held)}) has {_size(free)} free and a trial needs "
        f"at least {_size(need)} more for its checkpoint and records; the {command} stopped there: free space on "
        f"{mount} (or move them to another disk), then run the same command to resume"
    )


def places(tracking_uri: str, first: dict[str, Any]) -> dict[str, Any]:
    """Where a full disk may be, those known: ``first`` (what -> path), then the store (a SQLite
    file) and the tensor cache; ``line``'s ``places``."""
    from raystudy import paths
    from raystudy.tracking import connect

    found = {**first, "the store": connect.sqlite_path(tracking_uri), "the tensor cache": paths.tensor_cache()}
    return {k: v for k, v in found.items() if v}


def _largest_checkpoint(storage) -> int:
    """The size of the largest ``state.pt`` under ``storage`` (a trial's checkpoint), 0 if none."""
    best = 0
    if storage and "://" not in str(storage):
        for root, _, files in os.walk(storage):
            for f in files:
                if f == "state.pt":
                    with contextlib.suppress(OSError):
                        best = max(best, os.path.getsize(os.path.join(root, f)))
    return best


def _size(n: float) -> str:
    """``n`` bytes as MiB or GiB."""
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def stop(places: dict[str, Any], command: str = "grid") -> None:
    """At the first sign of a full disk: its one line (``line``), once, and Tune's
    graceful stop, as a Ctrl-C's (its SIGUSR1 handler is that of SIGINT): no trial is retried into
    the same full disk, and Tune's state is kept for the same command to resume."""
    if _full:
        return
    _full["line"] = line(places, command)
    print(_full["line"], flush=True)
    hush()
    if threading.current_thread() is threading.main_thread() and callable(signal.getsignal(signal.SIGUSR1)):
        os.kill(os.getpid(), signal.SIGUSR1)


def say(tracking_uri: str, first: dict[str, Any], command: str = "grid") -> None:
    """A full disk whose first sign was the driver's own write (its lock, Tune's state, Optuna's
    storage, MLflow's store), not a trial's: its line, unless a trial's already said it."""
    if said() is None:
        print(line(places(tracking_uri, first), command), flush=True)


def said() -> str | None:
    """The full disk's line, if this process has said it."""
    return _full.get("line")


class FullDiskFilter(logging.Filter):
    """Tune's errors that a full disk caused (each failed trial's traceback, each failed save of
    its state) are left out: the driver says it in one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Whether Tune's log shows ``record``."""
        exc = record.exc_info[1] if record.exc_info else None
        if said() is not None and record.getMessage().startswith("Trials did not complete"):
            return False  # the trials the stop left unfinished: the grid's last line counts them
        return not (disk_full(exc) or disk_full(record.getMessage()))


class UnhandledFullDisk(logging.Filter):
    """Ray's "Unhandled error" of a trial actor's task that a full disk failed (about 40 lines of
    its traceback), logged whenever Ray lets go of the task's result: during the run, or after it
    as the driver closes its runs. The driver says the full disk in one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Whether Ray's log shows ``record``."""
        message = record.getMessage()
        return not (message.startswith("Unhandled error") and disk_full(message))


UNHANDLED = UnhandledFullDisk()
FULL = FullDiskFilter()


def hush() -> None:
    """For the rest of the process, what a full disk caused stays out of Tune's, Ray Train's and
    MLflow's logs (``FullDiskFilter``): each trial's traceback, each failed save of Tune's state
    (during a run, or as the driver stops after it), each write MLflow's store refuses (the first
    one included: it may come before the driver has said anything). The driver says the full disk
    in one line. A logger's filter sees only its own records, a handler's all that reach it: both,
    the handlers as they are now (Ray sets its own as it starts)."""
    ray_log = logging.getLogger("ray")
    if not ray_log.handlers:
        # a local Ray started without its logging set up: Ray's records reach Python's last resort,
        # which no filter sees; a handler that prints as it does (warnings and worse, the message
        # alone, to stderr) takes its place
        last = logging.StreamHandler()
        last.setLevel(logging.WARNING)
        ray_log.addHandler(last)
    logs = [logging.getLogger(n) for n in ("ray.tune", "ray.tune.execution.tune_controller", "ray.train")]
    logs += [h for n in ("ray", "") for h in logging.getLogger(n).handlers]
    logs += [logging.getLogger("mlflow.store.db.utils"), *logging.getLogger("mlflow").handlers]
    for log in logs:
        if FULL not in log.filters:
            log.addFilter(FULL)
    # Ray may let go of a failed task's result after the run ended
    logging.getLogger("ray._private.worker").addFilter(UNHANDLED)
