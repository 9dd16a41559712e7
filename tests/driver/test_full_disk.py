"""driver.full_disk: a full disk known, said in one line naming the fullest place, kept out of the logs."""

import pytest

from raystudy import errors
from raystudy.driver import full_disk, tune_output


def test_a_full_disk_is_known_by_errno_by_sqlites_words_and_through_the_errors_it_caused():
    import errno

    assert errors.disk_full(OSError(errno.ENOSPC, "No space left on device"))
    assert errors.disk_full("sqlite3.OperationalError: database or disk is full")
    try:
        try:
            raise OSError(errno.ENOSPC, "write")
        except OSError as e:
            raise RuntimeError("saving the checkpoint failed") from e
    except RuntimeError as e:
        assert errors.disk_full(e)
    assert not errors.disk_full(OSError(errno.EACCES, "Permission denied")) and not errors.disk_full(None)


def test_the_places_a_full_disk_may_be_are_those_known(tmp_path, monkeypatch):
    monkeypatch.setenv("RAYSTUDY_CACHE", str(tmp_path / "cache"))
    db = tmp_path / "mlflow.db"
    places = full_disk.places(f"sqlite:///{db}", {"storage": tmp_path / "ray"})
    assert list(places) == ["storage", "the store", "the tensor cache"] and places["the store"] == db
    # a tracking server has no file here, and an unknown storage is left out: the line still names a disk
    places = full_disk.places("http://127.0.0.1:5000", {"storage": None})
    assert list(places) == ["the tensor cache"]
    line = full_disk.line(places, "grid")
    assert line.startswith("error: the disk is full: /") and "holding the tensor cache" in line


def test_the_drivers_own_full_disk_is_said_unless_a_trial_said_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("RAYSTUDY_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(full_disk, "_full", {})  # nothing said yet in this process
    first = {"storage": tmp_path / "ray", "the Optuna storage": tmp_path / "ray" / "optuna"}
    full_disk.say(f"sqlite:///{tmp_path / 'mlflow.db'}", first, "search")
    out = capsys.readouterr().out
    assert out.startswith("error: the disk is full: /") and out.count("\n") == 1, out
    assert "holding storage, the Optuna storage, the store, the tensor cache" in out, out
    full_disk._full["line"] = "error: the disk is full: (a trial's line)"  # a trial met it first: said
    full_disk.say(f"sqlite:///{tmp_path / 'mlflow.db'}", first, "search")
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
    with tune_output.shaped(0), pytest.raises(Exception) as failed:
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

    monkeypatch.setattr(full_disk, "_full", {})  # nothing said yet in this process
    monkeypatch.setattr(logging.getLogger("ray"), "handlers", [])  # as in a driver whose local Ray started
    save = logging.getLogger("ray.tune.execution.experiment_state")  # where Tune logs it
    full = OSError("[Errno 28] Error writing bytes to file. Detail: [errno 28] No space left on device")
    capfd.readouterr()
    with tune_output.shaped(0):
        full_disk.stop({"storage": small_disk}, "grid")
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
        with tune_output.shaped(0):
            worker._unhandled_error_handler(full)
        worker._unhandled_error_handler(full)  # after the run
        worker._unhandled_error_handler(other)
    finally:
        log.removeHandler(shown)
    assert len(said) == 1 and "a bug" in said[0], said  # what a full disk did not cause is still said
