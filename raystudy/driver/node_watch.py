"""The driver's own Ray node, watched while a Tune run goes: its loss said in one line and Tune
stopped gracefully, so that the same command resumes."""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable

_lost: dict[str, str] = {}  # the driver's Ray node found dead: its line


def watch(every: float = 1.0) -> Callable[[], None]:
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
                lose()
                return

    threading.Thread(target=loop, name="raystudy-node-watch", daemon=True).start()
    return done.set


def lose() -> None:
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


def lost() -> str | None:
    """The lost node's line, if this process has said it."""
    return _lost.get("line")
