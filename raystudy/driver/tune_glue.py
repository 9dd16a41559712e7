"""Tune as a driver wants it: quiet output, a restore that refuses what it cannot use, Ctrl-C.

Nothing here imports Ray at module level: a session uses ``uninterrupted`` before Ray starts.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


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


def uninterrupted():
    """Ctrl-C ignored while MLflow is being closed: a user pressing it again (Tune's graceful stop
    is slow) would otherwise cut the closing short and leave runs RUNNING."""
    return sigint_as(signal.SIG_IGN)


def fit(tuner, verbose: int, close: Callable[[], Any]) -> bool:
    """Run ``tuner`` to its end, then ``close`` (Ctrl-C ignored) however it ended, so that no
    MLflow run stays RUNNING; returns whether the user stopped the run (one Ctrl-C)."""
    try:
        with tune_output(verbose) as notice:
            tuner.fit()
    finally:
        with uninterrupted():
            close()
    return notice.received


@contextlib.contextmanager
def tune_output(verbose: int):
    """Tune silent but for errors when ``verbose`` is 0: its new output engine prints an
    experiment header even then, the classic one does not, and no default result loggers.
    Yields a ``StopNotice``: whether the user stopped the run (Tune's first-Ctrl-C handler ran)."""
    quiet = {"RAY_AIR_NEW_OUTPUT": "0", "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "1"} if not verbose else {}
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
    be read (half written: a full disk) or is not a grid's (no ``trial`` grid in its param
    space: Tune would start trials without their config)."""
    from ray import tune

    try:
        if isinstance(path, Path):  # Tune keeps the param space's shape in tuner.pkl; it does not check it
            with open(path / "tuner.pkl", "rb") as f:
                shape = pickle.load(f).get("__flattened_param_space_keys")
            if shape is not None and "trial/grid_search" not in shape:
                return None, f"its param space ({', '.join(shape)}) has no trial grid"
        return tune.Tuner.restore(str(path), trainable, resume_unfinished=True, resume_errored=True), ""
    except Exception as e:  # noqa: BLE001 - any unreadable state is handled the same way
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
        return None, f"{type(e).__name__}: {first}"


def set_console(tuner, lines, verbose: int) -> None:
    """A restored Tuner keeps the first session's run config (Tune has no option to change it):
    give it this session's verbosity and console (``lines``, a ``console.ConsoleTrials``),
    numbered from what MLflow holds now."""
    from raystudy import console

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
