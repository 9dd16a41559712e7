"""Ctrl-C in a driver: Tune's graceful stop raised as ``Stopped`` once MLflow is closed, and Ctrl-C
ignored while it is being closed."""

from __future__ import annotations

import contextlib
import signal
import threading


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
