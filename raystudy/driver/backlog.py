"""The driver's writes to a tracking server that is away: held in memory, in order, written when it is back.

A grid's trial runs are written by one callback in the driver (``mlflow_trials.MlflowTrials``). When the
tracking server stops answering past the MLflow client's own retries, each write is kept in a
``Backlog`` instead of failing the grid; the trials go on. The backlog is written, in order, as
soon as the server answers ``/health`` again. A server away longer than ``limit_s()``
(``RAYSTUDY_TRACKING_OUTAGE_S``) stops the grid as a Ctrl-C does; the driver then waits as long
again for the server to write what it holds and close its runs, and otherwise gives up with one line.
"""

from __future__ import annotations

import math
import os
import signal
import time
import urllib.request
from collections import deque
from collections.abc import Callable
from typing import Any
from urllib.parse import urlparse

from raystudy.driver.interrupt import sigint_as
from raystudy.errors import ConfigError
from raystudy.tracking.connect import TrackingUnavailable

LIMIT_ENV = "RAYSTUDY_TRACKING_OUTAGE_S"
DEFAULT_LIMIT_S = 600.0
PROBE_EVERY_S = 2.0  # while the server is away, how often /health is asked (a write would cost the retries)


class TrackingOutage(TrackingUnavailable):
    """The tracking server stayed away past the limit and past the wait for it after the grid stopped."""


def limit_s() -> float:
    """The outage limit in seconds: ``$RAYSTUDY_TRACKING_OUTAGE_S``, else ``DEFAULT_LIMIT_S``;
    raises ``ConfigError`` for anything but a finite number > 0."""
    raw = os.environ.get(LIMIT_ENV, "").strip()
    if not raw:
        return DEFAULT_LIMIT_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(f"{LIMIT_ENV} must be a number of seconds > 0 (default {DEFAULT_LIMIT_S:g}), got {raw!r}")
    return value


def is_away(error: BaseException) -> bool:
    """Whether ``error`` (or what caused it) says the tracking server could not be reached, as
    opposed to a server that answered with an error."""
    import requests

    seen = 0
    while error is not None and seen < 10:
        if isinstance(error, (requests.exceptions.ConnectionError, requests.exceptions.Timeout)):
            return True
        text = str(error)
        if text.startswith("API request to") and ("failed with exception" in text or "timeout exception" in text):
            return True
        error, seen = error.__cause__ or error.__context__, seen + 1
    return False


class Backlog:
    """Writes (callables of an MLflow client) to a tracking server at ``uri``, run in order;
    while the server is away they wait here. ``limit`` s away and ``expired()`` says so."""

    def __init__(self, uri: str, limit: float, clock: Callable[[], float] = time.monotonic):
        self.uri, self.limit, self.clock = uri, limit, clock
        self.pending: deque[Callable[[Any], Any]] = deque()
        self.away_since: float | None = None
        self._probed = -math.inf
        self.remote = urlparse(uri).scheme in ("http", "https")

    def put(self, write: Callable[[Any], Any], cl) -> None:
        """Queue ``write`` behind what waits, then write what can be written."""
        self.pending.append(write)
        self.flush(cl)

    def flush(self, cl) -> None:
        """Run the waiting writes in order until one finds the server away (it stays first)."""
        if self.away_since is not None and not self._answers():
            return
        while self.pending:
            started = self.clock()
            try:
                self.pending[0](cl)
            except Exception as e:
                if not (self.remote and is_away(e)):
                    raise
                if self.away_since is None:
                    self.away_since = started
                    print(
                        f"tracking server {self.uri} unreachable: keeping what the trials report in memory, "
                        f"for up to {self.limit:g} s ({LIMIT_ENV})",
                        flush=True,
                    )
                return
            self.pending.popleft()
        if self.away_since is not None:
            print(
                f"tracking server {self.uri} back after {self.away_for():.0f} s; what was held is written", flush=True
            )
            self.away_since = None

    def away_for(self) -> float:
        """Seconds since the server was first found away (0 while it answers)."""
        return 0.0 if self.away_since is None else self.clock() - self.away_since

    def expired(self) -> bool:
        """Whether the server has been away longer than the limit."""
        return self.away_for() > self.limit

    def settle(self, cl, wait: float, sleep: Callable[[float], None] = time.sleep) -> None:
        """Write everything held, waiting up to ``wait`` s for the server (Ctrl-C ends the wait);
        raises ``TrackingOutage`` if it is still away then."""
        deadline, why = self.clock() + wait, ""
        self.flush(cl)
        with sigint_as(signal.default_int_handler):  # the driver's closing ignores Ctrl-C; this wait may be long
            try:
                while self.away_since is not None and self.clock() < deadline:
                    sleep(PROBE_EVERY_S)
                    self.flush(cl)
            except KeyboardInterrupt:
                why = " (Ctrl-C ended the wait)"
        if self.away_since is not None:
            raise TrackingOutage(
                f"tracking server {self.uri} still unreachable after {self.away_for():.0f} s{why}: "
                f"{len(self.pending)} write(s) of the grid's trials were not recorded; its runs stay RUNNING "
                "until the same command, run with the server back, resumes the grid"
            )

    def _answers(self) -> bool:
        """Whether the server answers ``/health`` now; asked at most every ``PROBE_EVERY_S``."""
        now = self.clock()
        if now - self._probed < PROBE_EVERY_S:
            return False
        self._probed = now
        try:
            with urllib.request.urlopen(self.uri.rstrip("/") + "/health", timeout=PROBE_EVERY_S) as r:
                return r.status == 200
        except OSError:
            return False


_HELD: dict[tuple[str, ...], Backlog] = {}


def of(uri: str, *grid: str | None) -> Backlog:
    """The ``Backlog`` of one grid (``grid``: its experiment and parent run) in this process: the
    driver's callback and its closing share it, a callback Tune restored from its state too."""
    key = (uri, *(g or "" for g in grid))
    if key not in _HELD:
        _HELD[key] = Backlog(uri, limit_s())
    return _HELD[key]
