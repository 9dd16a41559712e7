"""Tune's output as a driver wants it: quiet but for errors unless asked, its Ctrl-C warning said
the driver's way, and its result files only where they are read."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading

from raystudy.driver import full_disk


@contextlib.contextmanager
def shaped(verbose: int):
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
    full_disk.hush()
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


def result_files(verbose: int) -> list:
    """Tune's result files: only the JSON one, which Tune reads back at the end, unless Tune's
    own output is asked for (MLflow holds every result; its TensorBoard writer only warns)."""
    from ray.tune.logger import JsonLoggerCallback

    return [] if verbose else [JsonLoggerCallback()]
