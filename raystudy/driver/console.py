"""What a grid prints while it runs: one line per trial that ends, with progress and an ETA.

    [12/26] MHA digits_c lr 0.3 seed 1  val 74.8  test 72.7  13 s  | 2 running, 12 pending, ETA 1 min 20 s

A grid of more than ``EVERY_TRIAL_UP_TO`` trials prints a status line at each ``STATUS_PERCENT``
of the grid done (or after ``STATUS_EVERY_S`` without one) instead, plus the line of each trial
that did not finish:

    [1000/2000] 50% done, 3 did not finish (2 failed, 1 diverged)  | 7 running, 993 pending, ETA 2 h 04 min

Trials that wait for resources the cluster does not have free, while none of the grid's trials
runs, are said in a line of their own after ``WAIT_S`` (and again each ``STATUS_EVERY_S`` while
they wait, or when what they wait for changes):

    3 trials waiting for resources: each needs 2 x {CPU: 1}; free: {CPU: 0} on 2 nodes

Tune's own output (a configuration and a result table per trial, a live table of truncated
dicts) is off by default; ``ConsoleTrials`` prints these lines from the driver instead. The
formatting and the ETA are pure functions of what the driver measured.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterable
from typing import Any

from ray import tune

from raystudy.driver import placement
from raystudy.models import components

# Config keys shown in a trial's line only when the grid varies them (condition, dataset, lr and
# seed always are).
VARYING = ("model", "optimizer", "low_data")

# Up to this many trials a grid prints a line per trial that ends; above, status lines. The demo
# grid (104 trials) and most spaces stay under it; 200 lines already fill several screens, and the
# paper's grid (825 trials) or ten times it would scroll every line of interest away.
EVERY_TRIAL_UP_TO = 200
# A large grid's status line at each 1% of its trials done: at most 100 lines whatever its size,
# frequent enough to watch; and at least every 5 minutes, for a grid whose 1% takes hours.
STATUS_PERCENT = 1
STATUS_EVERY_S = 300.0
# A trial pending (or a multi-worker trial whose workers are not placed) this long waits for resources
# (RAYSTUDY_WAIT_S, seconds); the driver looks at most every WAIT_CHECK_S.
WAIT_S = float(os.environ.get("RAYSTUDY_WAIT_S", "60"))
WAIT_CHECK_S = min(10.0, WAIT_S)


def seconds(s: float) -> str:
    """``13 s``, ``4 min 05 s``, ``2 h 07 min``."""
    s = max(0, int(round(s)))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def eta(durations: Iterable[float], running_elapsed: Iterable[float], pending: int, slots: int) -> float | None:
    """Seconds until the grid ends, from the trials measured so far: each pending trial takes the
    mean measured duration, each running one what it has left of it, spread over ``slots``
    concurrent trials. None before any trial has been measured."""
    durations = list(durations)
    if not durations:
        return None
    mean = sum(durations) / len(durations)
    work = pending * mean + sum(max(mean - e, 0.0) for e in running_elapsed)
    return work / max(slots, 1)


def pace_eta(ended: int, span_s: float, remaining: int, slots: int) -> float | None:
    """Seconds until the grid ends at the pace so far: ``ended`` trials ended over ``span_s``
    seconds from the first of them, the ``remaining`` ones at the same rate. It counts what the
    trials' durations miss: slots the driver leaves empty, a Tune run's start between parts.
    None until twice ``slots`` (and at least 10) have ended after the first."""
    if ended - 1 < max(2 * slots, 10) or span_s <= 0:
        return None
    return remaining * span_s / (ended - 1)


def varying(configs: Iterable[dict[str, Any]]) -> tuple[str, ...]:
    """The keys of ``VARYING`` that take more than one value across a grid's trial configs."""
    seen: dict[str, set] = {k: set() for k in VARYING}
    for c in configs:
        for k in VARYING:
            seen[k].add(str(c.get(k)))
    return tuple(k for k in VARYING if len(seen[k]) > 1)


def describe(config: dict[str, Any], shown: Iterable[str] = ()) -> str:
    """``MHA digits_c lr 0.3 seed 1`` (plus the varying keys' values); the linear probe has no lr."""
    parts = [str(config.get("condition")), str(config.get("dataset"))]
    for k in shown:
        v = config.get(k)
        parts.append(("low_data" if v else "full_data") if k == "low_data" else str(v))
    if components.has_lr(str(config.get("condition"))):
        parts.append(f"lr {config.get('lr'):g}")
    parts.append(f"seed {config.get('seed')}")
    return " ".join(parts)


def outcome(result: dict[str, Any] | None, error: str | None = None, stopped_by: str | None = None) -> str:
    """What a trial ended with: accuracies in percent, or how it did not finish (stopped early:
    by ``stopped_by`` where the caller knows who stops trials, a search's ASHA)."""
    if error is not None:
        return f"FAILED: {error}"
    result = result or {}
    status = result.get("status", "finished")
    if status == "diverged":
        return f"diverged at step {int(result.get('steps_done', result.get('step', 0)))}"
    val, test = result.get("best_val_acc"), result.get("test_acc")
    acc = "  ".join(
        f"{name} {100 * v:.1f}" for name, v in (("val", val), ("test", test)) if isinstance(v, (int, float)) and v == v
    )
    if status == "stopped" or not result.get("final"):
        by = f" by {stopped_by}" if stopped_by else ""
        return f"stopped{by} at step {int(result.get('step', 0))}" + (f"  {acc}" if acc else "")
    return acc or status


def trial_line(
    index: int, total: int, what: str, how: str, took_s: float, running: int, pending: int, eta_s: float | None
) -> str:
    """The one line printed when a trial ends."""
    width = len(str(total))
    tail = f"{running} running, {pending} pending"
    if pending or running:
        tail += f", ETA {seconds(eta_s)}" if eta_s is not None else ""
    return f"[{index:>{width}}/{total}] {what}  {how}  {seconds(took_s)}  | {tail}"


def status_line(
    done: int, total: int, problems: dict[str, int], running: int, pending: int, eta_s: float | None
) -> str:
    """A large grid's line of progress: done, how many did not finish and why, running, pending, ETA."""
    width = len(str(total))
    head = f"[{done:>{width}}/{total}] {done * 100 // max(total, 1)}% done"
    bad = sum(problems.values())
    if bad:
        kinds = ", ".join(f"{n} {kind}" for kind, n in problems.items() if n)
        head += f", {bad} did not finish ({kinds})"
    tail = f"{running} running, {pending} pending"
    if (pending or running) and eta_s is not None:
        tail += f", ETA {seconds(eta_s)}"
    return f"{head}  | {tail}"


def waiting_line(n: int, needs: Iterable[str], free: dict[str, float], nodes: int) -> str:
    """The line of ``n`` trials waiting for resources: what each needs (``placement.Shape.describe``)
    and what the cluster's ``nodes`` have free in all, of what they ask."""
    needs = list(dict.fromkeys(needs))
    keys = [k for k in placement.SHOWN if any(f"{k}: " in need for need in needs)] or ["CPU"]
    trials = "1 trial" if n == 1 else f"{n} trials"
    return (
        f"{trials} waiting for resources: {'each needs ' if n > 1 else 'it needs '}{' or '.join(needs)}; "
        f"free: {placement.resources_text(free, keys)} on {nodes} node{'s' if nodes != 1 else ''}"
    )


def ray_state() -> tuple[list[dict[str, float]], list[list[dict[str, float]]]]:
    """The connected Ray's free resources per node, and the bundles of its placement groups that
    wait to be placed."""
    import ray
    from ray._private import state

    free = [dict(r) for r in state.available_resources_per_node().values()]
    pending = [
        list(g["bundles"].values())
        for g in ray.util.placement_group_table().values()
        if g.get("state") in ("PENDING", "RESCHEDULING")
    ]
    return free, pending


def error_line(text: str, limit: int = 160) -> str:
    """The last line of a trial's error (a traceback's exception line, its class without its
    module), shortened."""
    lines = [ln.strip() for ln in (text or "").strip().splitlines() if ln.strip()]
    last = re.sub(r"^[\w.]+\.(\w+): ", r"\1: ", lines[-1]) if lines else "unknown error"
    return last if len(last) <= limit else last[: limit - 3] + "..."


class ConsoleTrials(tune.Callback):
    """Prints one line per trial that ends (finished, diverged, stopped or failed) and one per
    retry; with ``quiet``, only the lines about trials that did not finish.

    A grid of more than ``EVERY_TRIAL_UP_TO`` trials (or ``every_trial=False``) prints, instead
    of the finished trials' lines, a status line (``status_line``) when the first trial ends, at
    each ``STATUS_PERCENT`` of the grid done, after ``STATUS_EVERY_S`` without one, and at the
    last trial; ``quiet`` leaves those out too.

    ``total`` counts the whole grid and ``done`` the trials MLflow already holds (``done_keys``),
    so a resumed grid numbers on from there; a restored trial whose key was already done is
    not counted twice. ``done_keys`` a number: that many done, and every trial's end counted (a
    search's trials are not restored, and two may draw the same config). ``by_name``: a trial is
    said by its name (a search's sampled values, as its MLflow run is named) rather than by its
    grid coordinates (``describe``); ``stopped_by``: who stops trials early (a search's ASHA),
    said in their lines.
    """

    def __init__(
        self,
        total: int,
        done_keys: Iterable[str] | int,
        shown: Iterable[str] = (),
        quiet: bool = False,
        log: Callable[[str], None] = print,
        clock: Callable[[], float] = time.time,
        every_trial: bool | None = None,
        state: Callable[[], tuple[list, list]] = ray_state,
        by_name: bool = False,
        stopped_by: str | None = None,
    ):
        self.total, self.shown, self.quiet = total, tuple(shown), quiet
        self.done_keys = None if isinstance(done_keys, int) else set(done_keys)
        self.by_name, self.stopped_by = by_name, stopped_by
        self.log, self.clock = log, clock
        self.every_trial = total <= EVERY_TRIAL_UP_TO if every_trial is None else every_trial
        self.done = done_keys if self.done_keys is None else len(self.done_keys)
        self.started: dict[str, float] = {}
        self.durations: list[float] = []
        self.slots = 1
        self.problems = {"failed": 0, "diverged": 0, "stopped": 0}
        self.last_status: float | None = None  # when the last status line was printed; None: none yet
        self.first_end: float | None = None  # when this session's first trial ended
        self.state = state  # the cluster's free resources and unplaced groups (``ray_state``)
        self.pending_since: dict[str, float] = {}  # trial id -> when first seen PENDING
        self.last_wait_check: float | None = None
        self.said_waiting: tuple[str, float] | None = None  # the waiting line last said, and when

    def __getstate__(self):  # Tune pickles callbacks with its experiment state; a resume gets a new one
        return {**self.__dict__, "log": print, "clock": time.time, "state": ray_state}

    def _what(self, trial) -> str:
        """How a trial is said in its line: its name (``by_name``), else its grid coordinates."""
        t = trial.config["trial"]
        named = t.get("name") if self.by_name else None
        return named or describe(t["finetune"], self.shown)

    def _running(self, trials, trial) -> list:
        return [t for t in trials if t is not trial and t.status == "RUNNING"]

    def on_trial_start(self, iteration, trials, trial, **info):
        """Notes when ``trial`` started, and how many trials run at once."""
        self.started.setdefault(trial.trial_id, self.clock())
        self.slots = max(self.slots, len(self._running(trials, trial)) + 1)

    def on_step_end(self, iteration, trials, **info):
        """Every ``WAIT_CHECK_S``: the line of the trials waiting for resources (``waiting``), if any."""
        now = self.clock()
        for t in trials:
            if t.status == "PENDING":
                self.pending_since.setdefault(t.trial_id, now)
            else:
                self.pending_since.pop(t.trial_id, None)
        if self.last_wait_check is not None and now - self.last_wait_check < WAIT_CHECK_S:
            return
        self.last_wait_check = now
        line = self.waiting(trials, now)
        if line is None:
            self.said_waiting = None
            return
        said = self.said_waiting
        if said is None or said[0] != line or now - said[1] >= STATUS_EVERY_S:
            self.said_waiting = (line, now)
            self.log(line)

    def waiting(self, trials, now: float) -> str | None:
        """The line of the trials waiting for resources, or None: trials pending over ``WAIT_S``
        that the free resources cannot hold, and multi-worker trials running that long without a
        result whose workers' group is not placed, while none of the grid's trials makes progress."""
        long_pending = [t for t in trials if now - self.pending_since.get(t.trial_id, now) >= WAIT_S]
        running = [t for t in trials if t.status == "RUNNING"]
        unplaced = [
            t
            for t in running
            if not t.last_result and _shape(t).worker and now - self.started.get(t.trial_id, now) >= WAIT_S
        ]
        if not long_pending and not unplaced:
            return None
        if len(unplaced) < len(running):  # a trial runs: the others wait for it, as a grid does
            return None
        free, groups = self.state()
        # a running trial waits for its workers only while a group of its workers' bundles is unplaced
        sizes = [len(g) for g in groups]
        waiting = []
        for t in unplaced:
            if _shape(t).workers in sizes:
                sizes.remove(_shape(t).workers)
                waiting.append(t)
        waiting += [t for t in long_pending if not placement.fits(_shape(t), free)]
        if not waiting:
            return None
        total: dict[str, float] = {}
        for node in free:
            for k, v in node.items():
                total[k] = total.get(k, 0.0) + v
        return waiting_line(len(waiting), [_shape(t).describe() for t in waiting], total, len(free))

    def _step(self) -> int:
        return self.done * 100 // (STATUS_PERCENT * max(self.total, 1))

    def _ended(self, trials, trial, how: str, problem: bool, kind: str | None = None) -> None:
        key = trial.config["trial"]["key"]
        if self.done_keys is not None:
            if key in self.done_keys:  # a restored trial MLflow already had: it records nothing
                return
            self.done_keys.add(key)
        now = self.clock()
        took = now - self.started.pop(trial.trial_id, now)
        self.durations.append(took)
        self.first_end = now if self.first_end is None else self.first_end
        step = self._step()
        self.done += 1
        if kind:
            self.problems[kind] += 1
        running = self._running(trials, trial)
        pending = max(self.total - self.done - len(running), 0)
        left = eta(self.durations, [now - self.started.get(t.trial_id, now) for t in running], pending, self.slots)
        if problem or (self.every_trial and not self.quiet):
            what = self._what(trial)
            self.log(trial_line(self.done, self.total, what, how, took, len(running), pending, left))
        if self.every_trial or self.quiet:
            return
        # a large grid's ETA from its pace, once it has one (a small grid's lines stay as they were)
        paced = pace_eta(len(self.durations), now - self.first_end, pending + len(running), self.slots)
        left = left if paced is None else paced
        # a status line when this trial crossed a step, the grid ended, or none for a while
        due = self.last_status is None or self._step() > step or self.done >= self.total
        if due or now - self.last_status >= STATUS_EVERY_S:
            self.last_status = now
            self.log(status_line(self.done, self.total, self.problems, len(running), pending, left))

    def on_trial_complete(self, iteration, trials, trial, **info):
        """The line of a trial that ended: finished, diverged or stopped."""
        result = trial.last_result or {}
        how = outcome(result, stopped_by=self.stopped_by)
        diverged = result.get("status") == "diverged"
        problem = diverged or not result.get("final")
        kind = ("diverged" if diverged else "stopped") if problem else None
        self._ended(trials, trial, how, problem=problem, kind=kind)

    def on_trial_error(self, iteration, trials, trial, **info):
        """The line of a trial that failed for good, with its error's last line."""
        self._ended(trials, trial, outcome(None, error_line(_error_text(trial))), problem=True, kind="failed")

    def on_trial_recover(self, iteration, trials, trial, **info):
        """The line of a failed attempt that Tune retries; none for a full disk (the grid stops,
        and says so in one line)."""
        from raystudy.errors import disk_full

        error = _error_text(trial)
        if disk_full(error):
            return
        what = self._what(trial)
        self.log(f"retrying {what}: {error_line(error)}")


def _shape(trial) -> placement.Shape:
    """What a Tune trial of the grid asks of Ray (a rehearsal's trial: one CPU)."""
    return placement.of_trial(trial.config["trial"], rehearse="rehearse_s" in trial.config)


def _error_text(trial) -> str:
    path = getattr(trial, "error_file", None)
    try:
        with open(path) as f:
            return f.read()
    except (TypeError, OSError):
        return "no error file"
