"""driver.tune_glue: Ctrl-C while the driver closes MLflow, Tune's output and its Ctrl-C handler."""

import os
import signal
import time

import pytest

from raystudy.driver import tune_glue


def test_closing_the_runs_is_not_cut_short_by_another_ctrl_c(ctrl_c):
    # A user who presses Ctrl-C again while the grid closes its MLflow runs must not interrupt
    # the closing (a KeyboardInterrupt inside the finally would leave runs RUNNING).

    closed = []
    with tune_glue.uninterrupted():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.1)  # the signal is delivered here, and ignored
        closed.append(True)
    assert closed == [True]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # Ctrl-C works again after
    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.1)


def test_the_first_ctrl_c_is_the_grids_line_and_tunes_other_warnings_stay_muted(capsys):
    # Tune's Ctrl-C warning names Tuner.restore, which a grid's user never calls: while the grid
    # keeps Tune quiet, the warning becomes one line of the grid's, and Tune's errors still show.
    import logging

    tune_log = logging.getLogger("ray.tune.tune")
    seen = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    keep = Keep()
    tune_log.addHandler(keep)
    try:
        with tune_glue.tune_output(0) as notice:
            tune_log.warning("Stop signal received (e.g. via SIGINT/Ctrl+C), ending Ray Tune run. Press CTRL+C")
            tune_log.warning("call Tuner.restore(...) to resume")
            tune_log.error("a trial failed")
        assert notice.received  # the driver then ends the command as stopped, not as done
        tune_log.warning("outside the grid's Tune run")
        with tune_glue.tune_output(1) as loud:  # --tune-output: Tune's own words
            tune_log.warning("call Tuner.restore(...) to resume")
            assert not loud.received
            tune_log.warning("Stop signal received (e.g. via SIGINT/Ctrl+C), ending Ray Tune run.")
        assert loud.received
    finally:
        tune_log.removeHandler(keep)
    assert seen == [
        "a trial failed",
        "outside the grid's Tune run",
        "call Tuner.restore(...) to resume",
        "Stop signal received (e.g. via SIGINT/Ctrl+C), ending Ray Tune run.",
    ]
    out = capsys.readouterr().out
    assert out == "\nstopping: saving Tune's state and ending the running trials; Ctrl-C again to stop at once\n"


def test_a_tune_runs_ctrl_c_handler_ends_with_it(ctrl_c):
    # Tune installs its Ctrl-C handler for a run and leaves it there when the run ends unstopped:
    # a search's next Ctrl-C (between studies, or in its next Tune run, whose handler hands the
    # second Ctrl-C to the stale one) then only set the ended run's flag, and the search went on.
    from ray.tune import tune as tune_run

    with tune_glue.tune_output(0):
        tune_run._setup_signal_catching()  # what each Tune run does first
        assert signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.1)


def test_a_full_disk_is_known_by_errno_by_sqlites_words_and_through_the_errors_it_caused():
    import errno

    assert tune_glue.disk_full(OSError(errno.ENOSPC, "No space left on device"))
    assert tune_glue.disk_full("sqlite3.OperationalError: database or disk is full")
    try:
        try:
            raise OSError(errno.ENOSPC, "write")
        except OSError as e:
            raise RuntimeError("saving the checkpoint failed") from e
    except RuntimeError as e:
        assert tune_glue.disk_full(e)
    assert not tune_glue.disk_full(OSError(errno.EACCES, "Permission denied")) and not tune_glue.disk_full(None)


def test_the_places_a_full_disk_may_be_are_those_known(tmp_path, monkeypatch):
    monkeypatch.setenv("RAYSTUDY_CACHE", str(tmp_path / "cache"))
    db = tmp_path / "mlflow.db"
    places = tune_glue.disk_places(f"sqlite:///{db}", {"storage": tmp_path / "ray"})
    assert list(places) == ["storage", "the store", "the tensor cache"] and places["the store"] == db
    # a tracking server has no file here, and an unknown storage is left out: the line still names a disk
    places = tune_glue.disk_places("http://127.0.0.1:5000", {"storage": None})
    assert list(places) == ["the tensor cache"]
    line = tune_glue.full_disk_line(places, "grid")
    assert line.startswith("error: the disk is full: /") and "holding the tensor cache" in line


def test_the_drivers_own_full_disk_is_said_unless_a_trial_said_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("RAYSTUDY_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(tune_glue, "_full", {})  # nothing said yet in this process
    first = {"storage": tmp_path / "ray", "the Optuna storage": tmp_path / "ray" / "optuna"}
    tune_glue.say_full_disk(f"sqlite:///{tmp_path / 'mlflow.db'}", first, "search")
    out = capsys.readouterr().out
    assert out.startswith("error: the disk is full: /") and out.count("\n") == 1, out
    assert "holding storage, the Optuna storage, the store, the tensor cache" in out, out
    tune_glue._full["line"] = "error: the disk is full: (a trial's line)"  # a trial met it first: said
    tune_glue.say_full_disk(f"sqlite:///{tmp_path / 'mlflow.db'}", first, "search")
    assert capsys.readouterr().out == ""


def test_mlflows_own_traceback_of_a_full_store_stays_out_of_a_tune_run(tmp_path, small_disk, capfd):
    # Seen in CI: a trial's MLflow run, opened on a full store before anything else had met the
    # full disk, printed MLflow's traceback of the failed INSERT ahead of the driver's one line.
    from raystudy.errors import disk_full
    from raystudy.tracking import connect
    from tests.helpers import fill

    cl = connect.client(f"sqlite:///{small_disk / 'mlflow.db'}")
    experiment = cl.create_experiment("full")
    fill(small_disk)
    capfd.readouterr()
    with tune_glue.tune_output(0), pytest.raises(Exception) as failed:
        for i in range(10_000):  # until SQLite needs a page the disk no longer has
            cl.create_run(experiment, tags={"i": str(i) * 64})
    assert disk_full(failed.value), failed.value
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err and "database or disk is full" not in out + err, err[-3000:]


def test_tunes_failed_save_of_its_state_after_the_run_stays_out_once_the_full_disk_is_said(
    small_disk, monkeypatch, capfd
):
    # Seen by the nemesis (seeds 1 and 2, grids on SQLite and PostgreSQL): a trial met the full disk,
    # the driver said so in one line and stopped Tune, and Tune's failed save of its state, logged
    # as the run ended, printed its traceback: a driver's local Ray has no handler on Ray's logger
    # (Ray's logging is not set up), so its records reached Python's last resort, past every filter.
    import logging

    import ray  # noqa: F401

    monkeypatch.setattr(tune_glue, "_full", {})  # nothing said yet in this process
    monkeypatch.setattr(logging.getLogger("ray"), "handlers", [])  # as in a driver whose local Ray started
    save = logging.getLogger("ray.tune.execution.experiment_state")  # where Tune logs it
    full = OSError("[Errno 28] Error writing bytes to file. Detail: [errno 28] No space left on device")
    capfd.readouterr()
    with tune_glue.tune_output(0):
        tune_glue.stop_on_full_disk({"storage": small_disk}, "grid")
    for error in (full, ValueError("a bug")):
        try:
            raise error
        except (OSError, ValueError):
            save.error("Saving experiment state to storage at 'x' failed with exception: ", exc_info=True)
    logging.getLogger("ray.tune.tune").warning("Trials did not complete: [t1]")  # the stop's, said in the last line
    out, err = capfd.readouterr()
    assert out.count("error: the disk is full: ") == 1, out
    assert "No space left on device" not in err and "Trials did not complete" not in err, err[-3000:]
    assert "ValueError: a bug" in err, err[-3000:]  # what a full disk did not cause is still said


def test_a_tune_state_without_its_first_save_or_its_last_search_is_not_restored(tmp_path):
    import pickle

    (tmp_path / "tuner.pkl").write_bytes(pickle.dumps({"__flattened_param_space_keys": ["trial/grid_search"]}))
    # tuner.pkl alone: the driver was killed before Tune's first save
    assert tune_glue.restore(tmp_path, None) == (
        None,
        "it has no experiment state: the driver stopped before Tune's first save",
    )
    # a session's trials saved, its search not (Tune saves them in that order): the older session's
    # search would not know the trials made since
    for name in ("experiment_state-2026-12-04_10-00-00", "basic-variant-state-2026-12-04_10-00-00"):
        (tmp_path / f"{name}.json").write_text("{}")
    (tmp_path / "experiment_state-2026-12-04_11-00-00.json").write_text("{}")
    assert tune_glue.restore(tmp_path, None) == (
        None,
        "its search state of the last session is missing: the driver stopped while Tune saved",
    )
    # both of the last session there: what Tune makes of the (here fake) state decides
    _search_state(tmp_path, "2026-12-04_11-00-00")
    tuner, why = tune_glue.restore(tmp_path, None)
    assert tuner is None and "experiment state" not in why and "search state" not in why, why


def _trainable(config):
    """A grid's trial, never run here."""


def _search_state(folder, session: str):
    """The search state Tune saves for a grid (a real ``BasicVariantGenerator``'s), returned."""
    from ray import tune
    from ray.tune.search.basic_variant import BasicVariantGenerator

    gen = BasicVariantGenerator()
    gen.add_configurations([tune.Experiment("grid", _trainable, config={"trial": tune.grid_search(list(range(300)))})])
    gen.save_to_dir(str(folder), session)
    return folder / f"basic-variant-state-{session}.json"


def test_a_tune_state_whose_search_state_a_full_disk_cut_short_is_not_restored(tmp_path):
    # seen in the nemesis (seed 5, grid, SQLite): the disk filled as a Tune run began; Tune copies
    # its state from the driver's staging folder to the storage and the copy left the search's file
    # cut at a page, under its final name. Restored, Tune made trials with no config (KeyError 'trial')
    import pickle

    (tmp_path / "tuner.pkl").write_bytes(pickle.dumps({"__flattened_param_space_keys": ["trial/grid_search"]}))
    (tmp_path / "experiment_state-2026-12-06_15-47-18.json").write_text("{}")
    search = _search_state(tmp_path, "2026-12-06_15-47-18")
    whole = search.read_bytes()
    search.write_bytes(whole[: len(whole) // 4096 * 4096 or len(whole) // 2])
    assert tune_glue.restore(tmp_path, None) == (
        None,
        f"its search state of the last session is cut short ({search.stat().st_size} bytes): "
        "the disk filled as Tune saved",
    )
    search.write_bytes(whole)  # whole, it is not what refuses the (here fake) state
    assert "search state" not in tune_glue.restore(tmp_path, None)[1]


def test_an_ended_tune_run_lets_go_of_the_log_once_keys_of_what_tunes_encoder_pickled():
    # Tune's JSON encoder pickles what JSON cannot hold (a trial's storage context at each save)
    # and keeps a log-once key of its text for the life of the process: a few kB a trial.
    import json

    from ray.tune.utils.serialization import TuneFunctionEncoder
    from ray.util import debug

    class Unwritable:
        def __str__(self):
            return "a trial's storage context at checkpoint 7"

    json.dumps({"storage": Unwritable()}, cls=TuneFunctionEncoder)
    debug.log_once("raystudy test: another key")
    assert tune_glue.ENCODED + "a trial's storage context at checkpoint 7" in debug._logged
    tune_glue.let_go()
    assert not [k for k in debug._logged if k.startswith(tune_glue.ENCODED)]
    assert "raystudy test: another key" in debug._logged  # Ray's other once-only warnings stay once-only


def test_rays_unhandled_error_of_a_trial_that_met_a_full_disk_stays_out_during_and_after_a_run():
    # Seen: a grid stopped by a full disk printed, between its first and last lines, Ray's
    # "Unhandled error" with the trial actor's traceback: Ray logs it when it lets go of a failed
    # task's result, which may be after the Tune run, as the driver closes its runs.
    import logging

    from ray._private import worker
    from ray.exceptions import RayTaskError

    trace = 'Traceback (most recent call last):\n  File "trial.py", line 1, in save\n'
    trace += "OSError: [Errno 28] No space left on device"
    full = RayTaskError("ImplicitFunc.train", trace, OSError(28, "No space left on device"))
    other = RayTaskError("ImplicitFunc.train", "Traceback (most recent call last):\nValueError: a bug", ValueError("x"))
    said = []
    shown = logging.Handler()
    shown.emit = lambda record: said.append(record.getMessage())
    log = logging.getLogger("ray._private.worker")  # where Ray logs it
    log.addHandler(shown)
    try:
        with tune_glue.tune_output(0):
            worker._unhandled_error_handler(full)
        worker._unhandled_error_handler(full)  # after the run
        worker._unhandled_error_handler(other)
    finally:
        log.removeHandler(shown)
    assert len(said) == 1 and "a bug" in said[0], said  # what a full disk did not cause is still said
