"""driver.tune_output: Tune's output: its Ctrl-C warning said the driver's way, its Ctrl-C handler gone with its run."""

import os
import signal
import time

import pytest

from raystudy.driver import tune_output


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
        with tune_output.shaped(0) as notice:
            tune_log.warning("Stop signal received (e.g. via SIGINT/Ctrl+C), ending Ray Tune run. Press CTRL+C")
            tune_log.warning("call Tuner.restore(...) to resume")
            tune_log.error("a trial failed")
        assert notice.received  # the driver then ends the command as stopped, not as done
        tune_log.warning("outside the grid's Tune run")
        with tune_output.shaped(1) as loud:  # --tune-output: Tune's own words
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

    with tune_output.shaped(0):
        tune_run._setup_signal_catching()  # what each Tune run does first
        assert signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.1)
