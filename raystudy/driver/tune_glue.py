"""Tune as a driver wants it: quiet output, a restore that refuses what it cannot use, Ctrl-C.

Nothing here imports Ray at module level: a session uses ``uninterrupted`` before Ray starts.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pickle
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from raystudy.errors import disk_full


class Stopped(KeyboardInterrupt):
    """A Tune run the user stopped with one Ctrl-C: Tune's graceful stop returns from ``fit()``
    as if the run were done. Raised once MLflow is closed, so that a command line ends as it does
    on a second Ctrl-C, instead of going on to its next stage."""


@contextlib.contextmanager
def sigint_as(handler):
    """Ctrl-C handled by ``handler`` inside, the handler before restored after; a no-op off the
    main thread (only it may set signal handlers)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


_full: dict[str, str] = {}  # the full disk's line, once said


def full_disk_line(places: dict[str, Any], command: str = "grid") -> str:
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


def disk_places(tracking_uri: str, first: dict[str, Any]) -> dict[str, Any]:
    """Where a full disk may be, those known: ``first`` (what -> path), then the store (a SQLite
    file) and the tensor cache; ``full_disk_line``'s ``places``."""
    from raystudy import paths
    from raystudy.tracking import connect

    places = {**first, "the store": connect.sqlite_path(tracking_uri), "the tensor cache": paths.tensor_cache()}
    return {k: v for k, v in places.items() if v}


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


def stop_on_full_disk(places: dict[str, Any], command: str = "grid") -> None:
    """At the first sign of a full disk: its one line (``full_disk_line``), once, and Tune's
    graceful stop, as a Ctrl-C's (its SIGUSR1 handler is that of SIGINT): no trial is retried into
    the same full disk, and Tune's state is kept for the same command to resume."""
    if _full:
        return
    _full["line"] = full_disk_line(places, command)
    print(_full["line"], flush=True)
    hush_full_disk()
    if threading.current_thread() is threading.main_thread() and callable(signal.getsignal(signal.SIGUSR1)):
        os.kill(os.getpid(), signal.SIGUSR1)


def say_full_disk(tracking_uri: str, first: dict[str, Any], command: str = "grid") -> None:
    """A full disk whose first sign was the driver's own write (its lock, Tune's state, Optuna's
    storage, MLflow's store), not a trial's: its line, unless a trial's already said it."""
    if full_disk_said() is None:
        print(full_disk_line(disk_places(tracking_uri, first), command), flush=True)


def full_disk_said() -> str | None:
    """The full disk's line, if this process has said it."""
    return _full.get("line")


class FullDiskFilter(logging.Filter):
    """Tune's errors that a full disk caused (each failed trial's traceback, each failed save of
    its state) are left out: the driver says it in one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Whether Tune's log shows ``record``."""
        exc = record.exc_info[1] if record.exc_info else None
        if full_disk_said() is not None and record.getMessage().startswith("Trials did not complete"):
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


def hush_full_disk() -> None:
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


def uninterrupted():
    """Ctrl-C ignored while MLflow is being closed: a user pressing it again (Tune's graceful stop
    is slow) would otherwise cut the closing short and leave runs RUNNING."""
    return sigint_as(signal.SIG_IGN)


def fit(tuner, verbose: int, close: Callable[[], Any]) -> bool:
    """Run ``tuner`` to its end, then ``close`` (Ctrl-C ignored) however it ended, so that no
    MLflow run stays RUNNING; returns whether the run was stopped (one Ctrl-C, a full disk, the
    driver's Ray node lost)."""
    unwatch = watch_node()
    try:
        with tune_output(verbose) as notice:
            tuner.fit()
    except Exception:
        if full_disk_said() is None and node_lost() is None:
            raise
        # stopped on a full disk or a lost node: Tune's end, reading back its files or asking its
        # dead trials, may fail too
    finally:
        unwatch()
        with uninterrupted():
            try:
                close()
            except Exception as e:
                if not disk_full(e):
                    raise
                # a full store: its runs stay RUNNING, and the same command, rerun, closes them
        let_go()
    return notice.received or full_disk_said() is not None or node_lost() is not None


_lost: dict[str, str] = {}  # the driver's Ray node found dead: its line


def watch_node(every: float = 1.0) -> Callable[[], None]:
    """While a Tune run goes, the driver's own Ray node checked every ``every`` seconds; returns
    what ends the watch. A raylet killed, or ended by Ray because an agent it needs died, leaves
    the driver up and Tune waiting for ever on a cluster of no CPUs: the node's end is said in one
    line and Tune stopped gracefully (its SIGUSR1, as on a full disk), so that the same command
    resumes. A GCS that cannot be reached is Ray's own to say (it ends the driver)."""
    import ray

    node = ray.get_runtime_context().get_node_id()
    done = threading.Event()

    def loop() -> None:
        while not done.wait(every):
            try:
                alive = any(n["NodeID"] == node and n["Alive"] for n in ray.nodes())
            except Exception:  # noqa: BLE001 - the GCS unreachable or gone: see above
                continue
            if not alive and not done.is_set():
                lose_node()
                return

    threading.Thread(target=loop, name="raystudy-node-watch", daemon=True).start()
    return done.set


def lose_node() -> None:
    """The driver's Ray node is dead: its one line, Tune's warnings of a cluster without
    resources muted (the line says why), and Tune's graceful stop."""
    if _lost:
        return
    _lost["line"] = (
        "error: the Ray node this driver runs on has ended (its raylet was killed, or Ray ended it "
        "when an agent it needs died): stopping; run the same command to resume"
    )
    print(_lost["line"], flush=True)
    logging.getLogger("ray.tune.utils.resource_updater").setLevel(logging.ERROR)
    if callable(signal.getsignal(signal.SIGUSR1)):
        os.kill(os.getpid(), signal.SIGUSR1)


def node_lost() -> str | None:
    """The lost node's line, if this process has said it."""
    return _lost.get("line")


ENCODED = "tune_func_encode:"  # Ray's log-once key for each object Tune's JSON encoder pickles


def let_go() -> None:
    """What an ended Tune run leaves in the driver that nothing reads again, let go before the
    next run of a long grid or search: Ray's log-once keys for the objects Tune's encoder could
    not write as JSON (a trial's storage context at each save, a key each, kept for the life of
    the process: a few kB a trial), the run's garbage, and the free pages glibc keeps mapped."""
    import ctypes
    import gc

    from ray.util import debug

    logged = getattr(debug, "_logged", None)
    if isinstance(logged, set):
        logged.difference_update([k for k in logged if k.startswith(ENCODED)])
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


@contextlib.contextmanager
def tune_output(verbose: int):
    """Tune silent but for errors when ``verbose`` is 0: its new output engine prints an
    experiment header even then, the classic one does not, and no default result loggers.
    Yields a ``StopNotice``: whether the user stopped the run (Tune's first-Ctrl-C handler ran)."""
    # nor Tune's traceback of each failed attempt: the driver says each in one line (retrying, or
    # failed, with the error's last line), and the whole traceback stays in the trial's error file
    quiet = {"RAY_AIR_NEW_OUTPUT": "0", "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "1", "TUNE_PRINT_ALL_TRIAL_ERRORS": "0"}
    quiet = quiet if not verbose else {}
    saved = {k: os.environ.get(k) for k in quiet}
    os.environ.update(quiet)
    # On Ctrl-C, Tune's warnings tell the user to call Tuner.restore and list the trials that
    # never started as missing metrics; the driver says instead what the first Ctrl-C does, and at
    # the end that its command resumes it.
    muted, tune_log = logging.getLogger("ray.tune.analysis.experiment_analysis"), logging.getLogger("ray.tune.tune")
    level, notice = muted.level, StopNotice(quiet=bool(quiet))
    if quiet:
        muted.setLevel(logging.ERROR)
    tune_log.addFilter(notice)
    hush_full_disk()
    # Tune leaves its Ctrl-C handler installed after a run that was not stopped: the next Ctrl-C
    # (between a search's studies, in the next Tune run) would only set that ended run's flag.
    main = threading.current_thread() is threading.main_thread()
    handler = signal.getsignal(signal.SIGINT) if main else None
    try:
        yield notice
    finally:
        if main and handler is not None:  # None: a handler not set from Python, left alone
            signal.signal(signal.SIGINT, handler)
        muted.setLevel(level)
        tune_log.removeFilter(notice)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class StopNotice(logging.Filter):
    """Notes Tune's Ctrl-C warning (``received``). ``quiet``: Tune's log, errors only, and the
    warning becomes the driver's line."""

    def __init__(self, quiet: bool):
        super().__init__()
        self.quiet, self.received = quiet, False

    def filter(self, record: logging.LogRecord) -> bool:
        """Whether Tune's log shows ``record``; Tune's Ctrl-C warning is noted (and said our way)."""
        if record.getMessage().startswith("Stop signal received"):
            self.received = True
            if self.quiet:
                print(
                    "\nstopping: saving Tune's state and ending the running trials; Ctrl-C again to stop at once",
                    flush=True,
                )
            return not self.quiet
        return not self.quiet or record.levelno >= logging.ERROR


def restore(path, trainable):
    """(the Tuner of an interrupted run of this grid, "") or (None, why not): its state cannot
    be read (half written: a full disk), is not a grid's (no ``trial`` grid in its param space),
    or is not whole (``_unwhole``): Tune would start trials without their config."""
    from ray import tune

    try:
        if isinstance(path, Path):  # Tune keeps the param space's shape in tuner.pkl; it does not check it
            with open(path / "tuner.pkl", "rb") as f:
                shape = pickle.load(f).get("__flattened_param_space_keys")
            if shape is not None and "trial/grid_search" not in shape:
                return None, f"its param space ({', '.join(shape)}) has no trial grid"
            for state in path.glob("experiment_state-*.json"):  # cut short by a full disk: unusable
                json.loads(state.read_text())
            why = _unwhole(path)
            if why:
                return None, why
        return tune.Tuner.restore(str(path), trainable, resume_unfinished=True, resume_errored=True), ""
    except Exception as e:  # noqa: BLE001 - any unreadable state is handled the same way
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
        return None, f"{type(e).__name__}: {first}"


def _unwhole(path: Path) -> str:
    """Why the Tune state at ``path`` is not whole, or "". A session saves the trials' state, then
    the search's (which trials of the grid it has made), each a file named by the session; Tune's
    restore takes the newest of each. A driver killed before the first or between the two (as a
    Tune run begins) leaves a state whose search Tune rebuilds from the param space, which a
    restore does not have: it makes trials with no config. Tune writes its state in the driver's
    staging folder and copies it to the storage: a disk that fills during the copy leaves the
    search's file cut short, with the same result."""
    import ray.cloudpickle

    states = sorted(path.glob("experiment_state-*.json"))
    if not states:
        return "it has no experiment state: the driver stopped before Tune's first save"
    session = states[-1].name.removeprefix("experiment_state-").removesuffix(".json")
    search = path / f"basic-variant-state-{session}.json"
    if not search.is_file():
        return "its search state of the last session is missing: the driver stopped while Tune saved"
    try:
        with search.open("rb") as f:
            ray.cloudpickle.load(f)
    except (pickle.UnpicklingError, EOFError):
        size = search.stat().st_size
        return f"its search state of the last session is cut short ({size} bytes): the disk filled as Tune saved"
    return ""


def set_console(tuner, lines, verbose: int) -> None:
    """A restored Tuner keeps the first session's run config (Tune has no option to change it):
    give it this session's verbosity and console (``lines``, a ``console.ConsoleTrials``),
    numbered from what MLflow holds now."""
    from raystudy.driver import console

    rc = tuner._local_tuner.get_run_config()
    rc.verbose = verbose
    rc.callbacks = [c for c in rc.callbacks or [] if not isinstance(c, console.ConsoleTrials)] + [lines]


def result_files(verbose: int) -> list:
    """Tune's result files: only the JSON one, which Tune reads back at the end, unless Tune's
    own output is asked for (MLflow holds every result; its TensorBoard writer only warns)."""
    from ray.tune.logger import JsonLoggerCallback

    return [] if verbose else [JsonLoggerCallback()]


def set_aside(path, storage, name: str):
    """A folder for a fresh run, returned: the unusable one is renamed (kept for a post-mortem),
    or on object storage a new name is used."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    if isinstance(path, Path):
        os.replace(path, path.with_name(f"{name}.unrestorable-{stamp}"))
        return path
    return f"{str(storage).rstrip('/')}/{name}-{stamp}"


def trial_name(trial) -> str:
    """A grid trial's Tune name and folder: its condition, dataset, optimizer, lr, seed and id."""
    c = trial.config["trial"]["finetune"]
    return f"{c['condition']}_{c['dataset']}_{c['optimizer']}_lr{c['lr']:g}_s{c['seed']}_{trial.trial_id}"
