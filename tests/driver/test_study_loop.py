"""driver.study_loop: a source's study put right, run and counted in one order, whatever the source."""

import pytest

from raystudy.driver import study_loop


class Source:
    """A source whose Tune runs are none: what the loop asks of it, in order."""

    name = "s"

    def __init__(self, left: int):
        self.left, self.asked = left, []

    def after_a_kill(self):
        self.asked.append("after_a_kill")

    def tune_runs(self):
        self.asked.append("tune_runs")
        return iter(())

    def close(self):
        self.asked.append("close")

    def after_run(self):
        self.asked.append("after_run")

    def unfinished(self):
        self.asked.append("unfinished")
        return self.left


@pytest.mark.parametrize("left", [0, 3])
def test_a_study_is_put_right_before_its_runs_then_counted_and_unfinished_trials_are_the_callers(left):
    # no Tune run was stopped: trials left without an end are returned, for the command to say
    source = Source(left)
    assert study_loop.run(source, verbose=0) == left
    assert source.asked == ["after_a_kill", "tune_runs", "unfinished"]
