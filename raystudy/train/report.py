"""How a trial's reports reach Ray: the one policy of the real trial and of its rehearsal.

Step measurements wait in ``pending`` and travel with the next evaluation (or the final) report
as its ``history``; ``score``, the best validation accuracy so far, is what schedulers such as
ASHA compare; a checkpoint goes with an evaluation when ``every_s`` seconds have passed since
the last one (0: every evaluation) or a preemption asks for one. Neither torch nor Ray is
imported here: the rehearsal imports neither, and the trial's state is written by its ``save``.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from typing import Any


class Reporter:
    """The engine's ``report`` on Ray: ``report_fn`` is Tune's or Train's ``report``,
    ``checkpoint_cls`` their ``Checkpoint`` (None: never a checkpoint, a DDP worker other than
    rank 0), ``save(state, folder)`` writes a state into a checkpoint's folder.

    Fewer reports, fewer round trips to the driver: a report costs a driver-side turn (Tune's
    bookkeeping, the MLflow write), which dominated a short trial's overhead. Seconds rather
    than steps for checkpoints: a 5-second demo trial needs none, a 3-hour ViT-H trial many.
    """

    def __init__(self, report_fn: Callable, checkpoint_cls, every_s: float, save: Callable[[dict, str], None]):
        self.report_fn, self.checkpoint_cls, self.every_s, self.save = report_fn, checkpoint_cls, every_s, save
        self.last, self.best, self.pending = time.monotonic(), 0.0, []

    def __call__(self, metrics: dict[str, Any], state: dict | None) -> None:
        """Report ``metrics`` (held back until a state or a divergence comes), with a checkpoint of
        ``state`` when the interval has passed or a preemption asks for one."""
        self.best = max(self.best, metrics.get("val_acc", 0.0))
        if state is None and not metrics.get("diverged"):
            self.pending.append(metrics)
            return
        out = {**metrics, "score": self.best, "history": self.pending}
        self.pending = []
        now = time.monotonic()
        if (
            state is None
            or self.checkpoint_cls is None
            or (now - self.last < self.every_s and not metrics.get("preempted"))
        ):
            self.report_fn(out)
            return
        # The interval runs from when this state was taken: the report's round trip to the driver
        # (seconds on a loaded head) must not stretch the work a lost node takes with it.
        self.last = now
        with tempfile.TemporaryDirectory() as d:
            self.save(state, d)
            self.report_fn(out, checkpoint=self.checkpoint_cls.from_directory(d))

    def final(self, results: dict[str, Any]) -> None:
        """Report the trial's final results, with the metrics still held back."""
        self.report_fn(
            {
                **results,
                "final": 1,
                "step": results["steps_done"],
                "score": results.get("best_val_acc", self.best),
                "history": self.pending,
            }
        )
        self.pending = []
