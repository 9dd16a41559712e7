"""A study command's session, the same for a grid and a search: from the lock to the exit status.

A study runs in a ``session.Session`` (one driver per study, Ray, the weights). However it ends,
the command ends the same way: refused before it started (what the nodes cannot hold or see:
nothing written), a config or weights that fail (one line), stopped (Ctrl-C, or a full disk
whose first sign was the driver's own write: the command's stop line, exit 130), or done (the
command's summary); and, on a cluster, once it had started, a snapshot of MLflow's store.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from raystudy.driver import full_disk, placement, snapshot
from raystudy.errors import ConfigError, disk_full, fail
from raystudy.models import registry


def run(
    s,
    what: str,
    inside: Callable[[], Any],
    after: Callable[[Any], int],
    stopped: Callable[[], int],
    places: tuple[str, dict[str, Any]],
) -> int:
    """``inside()`` in the session ``s`` of a ``what`` (a grid, a search), then ``after`` its
    result, outside the session: the exit status. ``stopped()``: the command's stop line and
    status, on Ctrl-C (the first once Tune has stopped, ``interrupt.Stopped``, or a second) or a
    full disk. ``places``: the tracking URI and the driver's own places a full disk may be
    (``full_disk.places``)."""
    started = True
    try:
        try:
            with s:  # one driver per study: a second one refuses before starting anything
                result = inside()
        except placement.Refused:  # said below, and no snapshot taken
            raise
        except (ConfigError, registry.WeightsUnavailable) as e:
            return fail(e)
        except KeyboardInterrupt:
            return stopped()
        except Exception as e:
            if not disk_full(e):
                raise
            # the first sign was the driver's own write (its lock, Tune's state, Optuna's storage,
            # MLflow's store), not a trial's: said in one line as a trial's is
            full_disk.say(*places, what)
            return stopped()
        return after(result)
    except placement.Refused as e:  # what the nodes cannot hold or see: nothing ran
        started = False
        return fail(e)
    finally:
        if s.started is not None and started:  # it held the lock: a study refused before it started wrote nothing
            snapshot.take(what=what)
