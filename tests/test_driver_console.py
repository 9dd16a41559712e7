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
    assert console.error_line("raystudy.data.datasets.DatasetUnavailable: no pets") == "DatasetUnavailable: no pets"
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
