"""driver.faults: a fault point kills the process only where a test set it, at the count it names."""

import os
import subprocess
import sys

from raystudy.driver import faults

MARKED = """
from raystudy.driver import faults
for n in range(1, 4):
    print(n, flush=True)
    faults.kill_at(faults.KILL_AT_TRIAL_END, n)
"""


def _run(env: dict[str, str]) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in faults.POINTS}
    return subprocess.run([sys.executable, "-c", MARKED], env={**clean, **env}, capture_output=True, text=True)


def test_a_point_left_unset_does_nothing():
    p = _run({})
    assert (p.returncode, p.stdout.split()) == (0, ["1", "2", "3"]), p.stderr


def test_a_point_set_to_n_kills_the_process_at_its_nth_pass():
    p = _run({faults.KILL_AT_TRIAL_END: "2"})
    assert (p.returncode, p.stdout.split()) == (-9, ["1", "2"]), p.stderr


def test_at_says_whether_a_point_is_set_to_this_count(monkeypatch):
    monkeypatch.delenv(faults.LOSE_TRIAL_END, raising=False)
    assert not faults.at(faults.LOSE_TRIAL_END, 1)
    monkeypatch.setenv(faults.LOSE_TRIAL_END, "2")
    assert [faults.at(faults.LOSE_TRIAL_END, n) for n in (1, 2, 3)] == [False, True, False]
