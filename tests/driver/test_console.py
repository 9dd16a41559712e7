"""The grid's console: the line printed per trial, the ETA, and the callback that numbers them."""

from types import SimpleNamespace

import pytest

from raystudy.driver import console


def test_seconds_reads_as_a_person_would_say_it():
    assert console.seconds(12.6) == "13 s"
    assert console.seconds(245) == "4 min 05 s"
    assert console.seconds(2 * 3600 + 7 * 60 + 30) == "2 h 07 min"
    assert console.seconds(-3) == "0 s"


def test_eta_spreads_pending_and_the_rest_of_running_trials_over_the_slots():
    assert console.eta([], [5.0], pending=3, slots=2) is None  # nothing measured yet
    # mean 10 s; 4 pending = 40 s, running trials 3 s and 12 s in have 7 s and 0 s left; 2 slots
    assert console.eta([8.0, 12.0], [3.0, 12.0], pending=4, slots=2) == pytest.approx(47 / 2)
    assert console.eta([10.0], [], pending=0, slots=1) == 0.0
    assert console.eta([10.0], [], pending=3, slots=0) == 30.0  # never divides by zero


def test_pace_eta_is_the_remaining_trials_at_the_rate_they_ended_so_far():
    assert console.pace_eta(ended=21, span_s=100.0, remaining=50, slots=4) == pytest.approx(250.0)  # 0.2 trials/s
    assert console.pace_eta(ended=10, span_s=100.0, remaining=50, slots=4) is None  # 9 intervals: too few yet
    assert console.pace_eta(ended=16, span_s=100.0, remaining=50, slots=8) is None  # under two rounds of slots
    assert console.pace_eta(ended=30, span_s=0.0, remaining=5, slots=1) is None  # all at once: no pace


def test_trial_line_has_what_ran_its_accuracies_time_counts_and_eta():
    cfg = {"condition": "MHA", "dataset": "digits_c", "lr": 0.3, "seed": 1, "optimizer": "sgd"}
    how = console.outcome({"final": 1, "status": "finished", "best_val_acc": 0.748, "test_acc": 0.7271})
    line = console.trial_line(12, 28, console.describe(cfg), how, 13.2, running=2, pending=14, eta_s=95)
    assert (
        line == "[12/28] MHA digits_c lr 0.3 seed 1  val 74.8  test 72.7  13 s  | 2 running, 14 pending, ETA 1 min 35 s"
    )
    last = console.trial_line(28, 28, "x", "y", 1, running=0, pending=0, eta_s=0)
    assert last.endswith("| 0 running, 0 pending") and "ETA" not in last
    assert console.trial_line(3, 28, "x", "y", 1, 2, 23, None).startswith("[ 3/28]")  # aligned; no ETA yet


def test_describe_shows_the_axes_the_grid_varies_and_no_lr_for_the_linear_probe():
    grid = [{"optimizer": o, "model": "vit_demo", "low_data": False} for o in ("sgd", "adamw")]
    shown = console.varying(grid)
    assert shown == ("optimizer",)
    cfg = {"condition": "LN1", "dataset": "pets", "optimizer": "adamw", "lr": 1e-5, "seed": 0}
    assert console.describe(cfg, shown) == "LN1 pets adamw lr 1e-05 seed 0"
    assert (
        console.describe({"condition": "linear_probe", "dataset": "pets", "lr": 0.1, "seed": 2})
        == "linear_probe pets seed 2"
    )


def test_outcome_says_how_a_trial_ended():
    assert console.outcome({"final": 1, "status": "diverged", "steps_done": 10}) == "diverged at step 10"
    assert console.outcome({"step": 50, "val_acc": 0.5, "best_val_acc": 0.61}) == "stopped at step 50  val 61.0"
    assert console.outcome(None, "FileNotFoundError: no CIFAR-10-C") == "FAILED: FileNotFoundError: no CIFAR-10-C"
    tb = "Traceback (most recent call last):\n  File x\nFileNotFoundError: CIFAR-10-C not found\n\n"
    assert console.error_line(tb) == "FileNotFoundError: CIFAR-10-C not found"
    assert console.error_line("raystudy.data.source.DatasetUnavailable: no pets") == "DatasetUnavailable: no pets"
    assert len(console.error_line("E" * 500)) == 160 and console.error_line("") == "unknown error"


def _trial(i, key, status="RUNNING", result=None, error_file=None, condition="MHA"):
    """What the callback reads of a Tune trial."""
    cfg = {"condition": condition, "dataset": "digits_c", "lr": 0.1, "seed": i, "optimizer": "sgd"}
    return SimpleNamespace(
        trial_id=f"t{i}",
        status=status,
        last_result=result,
        error_file=error_file,
        config={"trial": {"key": key, "finetune": cfg}},
    )


def test_callback_numbers_on_from_what_mlflow_holds_and_skips_restored_done_keys(tmp_path):
    now = [100.0]
    out = []
    cb = console.ConsoleTrials(5, done_keys={"k0"}, log=out.append, clock=lambda: now[0])
    a, b = _trial(1, "k1"), _trial(2, "k2")
    again = _trial(0, "k0")  # a restored Tune trial whose key finished before the interruption
    cb.on_trial_start(0, [a, b], a)
    cb.on_trial_start(0, [a, b], b)  # two at once: 2 slots
    cb.on_trial_start(0, [again], again)
    now[0] = 110.0
    cb.on_trial_complete(0, [a, b, again], again)
    assert out == []
    ok = {"final": 1, "status": "finished", "best_val_acc": 0.5, "test_acc": 0.25}
    a.last_result = ok
    cb.on_trial_complete(0, [a, b], a)
    # 2 pending x 10 s, and b, 10 s in, has nothing left of the mean: 20 s over 2 slots
    assert out == ["[2/5] MHA digits_c lr 0.1 seed 1  val 50.0  test 25.0  10 s  | 1 running, 2 pending, ETA 10 s"]
    err = tmp_path / "error.txt"
    err.write_text("Traceback\nRuntimeError: out of memory\n")
    b.error_file = str(err)
    now[0] = 130.0
    cb.on_trial_recover(0, [b], b)
    cb.on_trial_error(0, [b], b)
    assert out[1] == "retrying MHA digits_c lr 0.1 seed 2: RuntimeError: out of memory"
    # measured 10 s and 30 s: 2 pending x 20 s over 2 slots
    assert out[2] == (
        "[3/5] MHA digits_c lr 0.1 seed 2  FAILED: RuntimeError: out of memory  30 s  | 0 running, 2 pending, ETA 20 s"
    )


def test_quiet_callback_prints_only_trials_that_did_not_finish():
    out = []
    cb = console.ConsoleTrials(2, done_keys=(), quiet=True, log=out.append, clock=lambda: 0.0)
    ok = _trial(1, "k1", result={"final": 1, "status": "finished", "best_val_acc": 0.5, "test_acc": 0.5})
    bad = _trial(2, "k2", result={"final": 1, "status": "diverged", "steps_done": 7})
    cb.on_trial_complete(0, [ok, bad], ok)
    cb.on_trial_complete(0, [bad], bad)
    assert out == ["[2/2] MHA digits_c lr 0.1 seed 2  diverged at step 7  0 s  | 0 running, 0 pending"]


def test_a_searchs_trials_are_said_by_their_names_and_ashas_stops_as_its():
    # a search numbers each study's trials over its budget, says a trial as its MLflow run is named
    # (its sampled values), and an ASHA stop (no final result) among the trials that did not finish
    out = []
    cb = console.ConsoleTrials(12, {"k0"}, log=out.append, clock=lambda: 0.0, by_name=True, stopped_by="ASHA")
    named = _trial(1, "k1", result={"final": 1, "status": "finished", "best_val_acc": 0.5, "test_acc": 0.5})
    named.config["trial"]["name"] = "MHA·adamw·lr0.0031·wd1e-05"
    stopped = _trial(2, "k2", result={"step": 10, "val_acc": 0.3, "best_val_acc": 0.3})
    stopped.config["trial"]["name"] = "MHA·sgd·lr0.1·wd0"
    unnamed = _trial(3, "k3", result={"final": 1, "status": "diverged", "steps_done": 4})
    for t in (named, stopped, unnamed):
        cb.on_trial_complete(0, [t], t)
    assert [line.split("  ")[:2] for line in out] == [
        ["[ 2/12] MHA·adamw·lr0.0031·wd1e-05", "val 50.0"],
        ["[ 3/12] MHA·sgd·lr0.1·wd0", "stopped by ASHA at step 10"],
        ["[ 4/12] MHA digits_c lr 0.1 seed 3", "diverged at step 4"],  # no name: its coordinates
    ]
    assert cb.problems == {"failed": 0, "diverged": 1, "stopped": 1}


def test_a_count_of_done_trials_numbers_on_from_it_and_counts_every_end_even_of_a_config_drawn_twice():
    # a search's done trials are a count (Optuna's): two trials that drew the same config end twice
    out = []
    cb = console.ConsoleTrials(6, 2, log=out.append, clock=lambda: 0.0, by_name=True, stopped_by="ASHA")
    first = _trial(1, "k1", result={"final": 1, "status": "finished", "best_val_acc": 0.5, "test_acc": 0.5})
    again = _trial(2, "k1", result={"final": 1, "status": "finished", "best_val_acc": 0.5, "test_acc": 0.5})
    for t in (first, again):
        cb.on_trial_complete(0, [t], t)
    assert [line.split("  ")[0] for line in out] == [
        "[3/6] MHA digits_c lr 0.1 seed 1",
        "[4/6] MHA digits_c lr 0.1 seed 2",
    ]
    assert cb.done == 4


def _simulate(cb, total, slots, duration, fail=(), diverge=(), stop=(), refill=0.0, part=None, gap=0.0):
    """Runs a grid of ``total`` trials through ``cb`` as Tune would, ``slots`` at once, on a fake
    clock: each trial takes ``duration(i)`` seconds; trials numbered in ``fail`` fail, in
    ``diverge`` diverge, in ``stop`` are stopped early. A slot's next trial starts ``refill``
    seconds after its last ended (a driver too busy to keep every slot full); with ``part``, the
    grid runs as Tune runs of that many trials, each drained before the next starts ``gap``
    seconds later. Returns (printed (time, line) pairs, end)."""
    import heapq

    now, out = [0.0], []
    cb.clock, cb.log = (lambda: now[0]), (lambda line: out.append((now[0], line)))
    ok = {"final": 1, "status": "finished", "best_val_acc": 0.5, "test_acc": 0.5}
    running, events, nxt, free = [], [], 0, 0  # events: (time, order, trial or None: a slot free)

    def start():
        nonlocal nxt
        t = _trial(nxt, f"k{nxt}")
        running.append(t)
        cb.on_trial_start(0, list(running), t)
        heapq.heappush(events, (now[0] + duration(nxt), nxt, t))
        nxt += 1

    while nxt < min(slots, total):
        start()
    while events:
        now[0], i, t = heapq.heappop(events)
        if t is None:  # a slot free again
            free += 1
        else:
            if i in fail:
                cb.on_trial_error(0, list(running), t)
            else:
                t.last_result = {"final": 1, "status": "diverged", "steps_done": 3} if i in diverge else ok
                t.last_result = {"step": 5, "best_val_acc": 0.4} if i in stop else t.last_result
                cb.on_trial_complete(0, list(running), t)
            t.status = "TERMINATED"
            running.remove(t)
            if refill:
                heapq.heappush(events, (now[0] + refill, total + i, None))
            else:
                free += 1
        if part and nxt % part == 0 and nxt < total:  # the next trial opens a new Tune run
            if running or any(e[2] is not None for e in events):
                continue  # this run drains first
            now[0] += gap
            events[:] = []  # the drained run's slots come back all at once
            free = slots
        while free and nxt < total and not (part and nxt % part == 0 and running):
            free -= 1
            start()
    return out, now[0]


def _seconds_of(text):
    """``2 h 05 min``, ``4 min 05 s``, ``13 s`` back to seconds."""
    import re

    h = re.fullmatch(r"(\d+) h (\d+) min", text)
    m = re.fullmatch(r"(\d+) min (\d+) s", text)
    if h:
        return 3600 * int(h[1]) + 60 * int(h[2])
    if m:
        return 60 * int(m[1]) + int(m[2])
    return int(text.removesuffix(" s"))


def test_a_large_grid_prints_status_lines_and_the_trials_that_did_not_finish_with_a_sound_eta():
    import random

    rng = random.Random(0)
    took = [rng.uniform(40, 80) for _ in range(2000)]  # a uniform grid: one kind of trial, some spread
    fail, diverge, stop = {17, 900, 1500}, {5, 1234}, {1999}
    cb = console.ConsoleTrials(2000, done_keys=())
    assert not cb.every_trial  # from the trial count alone
    out, end = _simulate(cb, 2000, 8, took.__getitem__, fail, diverge, stop)
    lines = [line for _, line in out]
    status = [line for line in lines if " done" in line.split("|")[0] and "[" in line]
    problems = [line for line in lines if line not in status]
    assert len(problems) == 6 and all(("FAILED" in p) or ("diverged" in p) or ("stopped" in p) for p in problems)
    # the first trial that ends, each 1% of the grid: 101 status lines, 107 lines for 2,000 trials
    assert len(status) == 101 and len(lines) == 107
    assert status[0].startswith("[   1/2000] 0% done  | 7 running, 1992 pending, ETA ")
    assert (
        status[-1]
        == "[2000/2000] 100% done, 6 did not finish (3 failed, 2 diverged, 1 stopped)  | 0 running, 0 pending"
    )
    (when, half), *_ = [(t, line) for t, line in out if line.startswith("[1000/2000] 50% done")]
    assert half.startswith("[1000/2000] 50% done, 3 did not finish (2 failed, 1 diverged)  | 7 running, 993 pending")
    estimate, truth = _seconds_of(half.split("ETA ")[1]), end - when
    assert abs(estimate - truth) <= 0.2 * truth, (estimate, truth)


def test_a_large_grid_whose_slots_are_not_all_full_and_that_runs_in_parts_gets_a_sound_eta():
    # As bench_scale measured a 1,300-trial rehearsal on 2 cores: the driver keeps 11 of 16 slots
    # busy, and each Tune run of 500 trials drains and starts its workers again. An ETA from the
    # trials' durations over the slots said 123 s at half-way for 158 s; from the trials ended
    # per second so far it holds.
    import random

    rng = random.Random(1)
    took = [rng.uniform(40, 80) for _ in range(2000)]
    cb = console.ConsoleTrials(2000, done_keys=())
    out, end = _simulate(cb, 2000, 8, took.__getitem__, refill=30.0, part=500, gap=120.0)
    (when, half), *_ = [(t, line) for t, line in out if line.startswith("[1000/2000] 50% done")]
    estimate, truth = _seconds_of(half.split("ETA ")[1]), end - when
    assert abs(estimate - truth) <= 0.2 * truth, (estimate, truth)
    first = out[0][1]
    assert first.startswith("[   1/2000] 0% done  | 7 running, 1992 pending, ETA "), first


def test_a_large_grid_whose_percent_takes_long_still_says_where_it_stands_every_five_minutes():
    cb = console.ConsoleTrials(1000, done_keys=())
    out, _ = _simulate(cb, 30, 1, lambda i: 100.0)  # only the first 30 of 1,000 trials, 100 s each
    assert console.STATUS_EVERY_S == 300
    # the first; 300 s after it (trials 4, 7); 1% at trial 10, then each 300 s and 1% again at 20, 30
    assert [int(line[1:5]) for _, line in out] == [1, 4, 7, 10, 13, 16, 19, 20, 23, 26, 29, 30]
    assert out[3][1] == "[  10/1000] 1% done  | 0 running, 990 pending, ETA 27 h 30 min"


def test_a_grid_up_to_the_threshold_prints_a_line_per_trial_as_before_and_quiet_only_problems():
    n = console.EVERY_TRIAL_UP_TO
    assert n == 200
    out, _ = _simulate(console.ConsoleTrials(n, done_keys=()), n, 3, lambda i: 10.0 + i % 7, diverge={50})
    lines = [line for _, line in out]
    # byte for byte what the console printed before large grids had status lines
    assert len(lines) == n
    assert (
        lines[0]
        == "[  1/200] MHA digits_c lr 0.1 seed 0  val 50.0  test 50.0  10 s  | 2 running, 197 pending, ETA 10 min 57 s"
    )
    assert (
        lines[50]
        == "[ 51/200] MHA digits_c lr 0.1 seed 50  diverged at step 3  11 s  | 2 running, 147 pending, ETA 10 min 35 s"
    )
    assert lines[-1] == "[200/200] MHA digits_c lr 0.1 seed 199  val 50.0  test 50.0  13 s  | 0 running, 0 pending"
    quiet, _ = _simulate(console.ConsoleTrials(n + 1, (), quiet=True), n + 1, 3, lambda i: 10.0, diverge={50})
    assert [line for _, line in quiet] == [quiet[0][1]] and "diverged at step 3" in quiet[0][1]
    forced, _ = _simulate(console.ConsoleTrials(n + 1, (), every_trial=True), n + 1, 3, lambda i: 10.0)
    assert len(forced) == n + 1


def test_a_resumed_large_grid_counts_on_from_what_mlflow_holds():
    cb = console.ConsoleTrials(1000, done_keys={f"old{i}" for i in range(500)})
    out, _ = _simulate(cb, 20, 2, lambda i: 10.0)
    assert out[0][1].startswith("[ 501/1000] 50% done  | 1 running, 498 pending")
    assert [int(line[1:5]) for _, line in out] == [501, 510, 520]


def _waiting_trial(i, status="PENDING", workers=1, cpu=1.0, result=None):
    t = _trial(i, f"w{i}", status=status, result=result)
    t.config["trial"].update(workers=workers, cpu=cpu, gpu=0.0)
    return t


def test_waiting_line_says_how_many_wait_what_each_needs_and_what_is_free():
    line = console.waiting_line(3, ["2 x {CPU: 1}"] * 3, {"CPU": 0.0, "GPU": 0.0, "memory": 2.0**33}, nodes=2)
    assert line == "3 trials waiting for resources: each needs 2 x {CPU: 1}; free: {CPU: 0} on 2 nodes"
    one = console.waiting_line(1, ["{CPU: 1, GPU: 1}"], {"CPU": 4.0}, nodes=1)
    assert one == "1 trial waiting for resources: it needs {CPU: 1, GPU: 1}; free: {CPU: 4, GPU: 0} on 1 node"


def test_trials_pending_past_the_wait_with_nothing_free_are_said_once_then_each_status_interval():
    now, out = [0.0], []
    free = [{"CPU": 0.0, "memory": 1e9}, {"CPU": 0.0, "memory": 1e9}]
    cb = console.ConsoleTrials(3, (), log=out.append, clock=lambda: now[0], state=lambda: (free, []))
    trials = [_waiting_trial(i) for i in range(3)]
    for t in range(0, int(console.WAIT_S), 5):  # pending, not yet for long: nothing said
        now[0] = float(t)
        cb.on_step_end(0, trials)
    assert out == []
    now[0] = console.WAIT_S + 1
    cb.on_step_end(0, trials)
    assert out == ["3 trials waiting for resources: each needs {CPU: 1}; free: {CPU: 0} on 2 nodes"]
    now[0] += console.WAIT_CHECK_S
    cb.on_step_end(0, trials)
    assert len(out) == 1  # the same wait: not said again before the status interval
    now[0] += console.STATUS_EVERY_S
    cb.on_step_end(0, trials)
    assert len(out) == 2
    # room on a node: the trials are about to start, not waiting
    free[0] = {"CPU": 1.0, "memory": 1e9}
    now[0] += console.STATUS_EVERY_S
    cb.on_step_end(0, trials)
    assert len(out) == 2


def test_a_running_trial_is_what_the_others_wait_for_not_the_cluster():
    now, out = [0.0], []
    cb = console.ConsoleTrials(3, (), log=out.append, clock=lambda: now[0], state=lambda: ([{"CPU": 0.0}], []))
    busy = _waiting_trial(0, status="RUNNING", result={"step": 10})
    trials = [busy, _waiting_trial(1), _waiting_trial(2)]
    cb.on_trial_start(0, trials, busy)
    for t in range(0, 200, 10):
        now[0] = float(t)
        cb.on_step_end(0, trials)
    assert out == []


def test_a_multi_worker_trial_whose_workers_are_not_placed_is_waiting_for_them():
    # its own process runs (Tune says RUNNING), its TorchTrainer's group of 2 x {CPU: 1} is unplaced
    now, out = [0.0], []
    groups = [[{"CPU": 1.0}, {"CPU": 1.0}]]
    state = lambda: ([{"CPU": 0.0}, {"CPU": 1.0}], groups)  # noqa: E731
    cb = console.ConsoleTrials(2, (), log=out.append, clock=lambda: now[0], state=state)
    t = _waiting_trial(0, status="RUNNING", workers=2)
    cb.on_trial_start(0, [t], t)
    now[0] = console.WAIT_S + 1
    cb.on_step_end(0, [t])
    assert out == ["1 trial waiting for resources: it needs 2 x {CPU: 1}; free: {CPU: 1} on 2 nodes"]
    groups.clear()  # its workers placed: loading, not waiting
    now[0] += console.STATUS_EVERY_S
    cb.on_step_end(0, [t])
    assert len(out) == 1
