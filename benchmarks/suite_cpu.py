"""Where the test suite's time goes: the CPU seconds of each test, every process it started counted.

    python benchmarks/suite_cpu.py -m slow               # the slow tier, one test at a time
    python benchmarks/suite_cpu.py -m "not slow" --top 40
    python benchmarks/suite_cpu.py tests/test_grid_ray.py

Both tiers keep a 2-core machine busy under ``-n 2``, so a tier's wall time is about its CPU
seconds over 2, and a test's own wall time under xdist mostly measures its neighbour. This runs
the selected tests one at a time (no xdist) and charges each the machine's busy CPU time
(``/proc/stat``) while it ran: the drivers, Ray's workers and servers and the MLflow servers it
started count, which a per-process timer misses. Run it on a quiet machine: whatever else runs
is charged to the tests (the load average is printed first). A fixture of wider scope is charged
to the first test that sets it up. Arguments other than ``--top`` go to pytest. Linux only.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def busy_cpu_s() -> float:
    """CPU seconds the whole machine has spent busy (not idle, not waiting on I/O) since boot."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


class Charge:
    """A pytest plugin: each test's machine CPU seconds and wall seconds, setup and teardown included."""

    def __init__(self):
        self.rows: list[tuple[float, float, str, str]] = []   # cpu, wall, nodeid, outcome

    def pytest_runtest_logstart(self, nodeid, location):
        self._start = (busy_cpu_s(), time.perf_counter())
        self._outcome = "passed"

    def pytest_runtest_logreport(self, report):
        if report.outcome != "passed" and self._outcome == "passed":
            self._outcome = report.outcome

    def pytest_runtest_logfinish(self, nodeid, location):
        cpu0, t0 = self._start
        self.rows.append((busy_cpu_s() - cpu0, time.perf_counter() - t0, nodeid, self._outcome))


def summary(rows, session_cpu: float, session_wall: float, top: int) -> str:
    """The table printed at the end: the ``top`` tests by CPU, each file's total, the totals."""
    rows = sorted(rows, key=lambda r: -r[0])
    out = [f"{'CPU s':>8} {'wall s':>8}  test (machine CPU while it ran, setup and teardown included)"]
    out += [f"{c:8.1f} {w:8.1f}  {n}" + ("" if o == "passed" else f"  [{o}]") for c, w, n, o in rows[:top]]
    if len(rows) > top:
        out.append(f"{'':>8} {'':>8}  ... {len(rows) - top} more, {sum(r[0] for r in rows[top:]):.1f} CPU s")
    files = Counter()
    for c, _, n, _ in rows:
        files[n.split("::")[0]] += c
    out += ["", f"{'CPU s':>8}  file"] + [f"{c:8.1f}  {f}" for f, c in files.most_common()]
    tests_cpu, cores = sum(r[0] for r in rows), os.cpu_count() or 1
    out += ["", f"{tests_cpu:8.1f} CPU s in {len(rows)} tests; "
                f"{session_cpu - tests_cpu:.1f} CPU s outside them (start-up, collection, the session's end); "
                f"{session_wall:.0f} s wall; about {session_cpu / cores:.0f} s on {cores} busy cores"]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--top", type=int, default=25, help="tests listed by CPU (default 25)")
    args, pytest_args = ap.parse_known_args(argv)
    if not Path("/proc/stat").is_file():
        print("error: suite_cpu.py reads /proc/stat: Linux only", file=sys.stderr)
        return 2
    if args.top < 0:
        print(f"error: --top must be >= 0, got {args.top}", file=sys.stderr)
        return 2
    import pytest

    print(f"load average before: {os.getloadavg()[0]:.2f} (1 min); a busy machine charges its load to the tests")
    charge = Charge()
    cpu0, t0 = busy_cpu_s(), time.perf_counter()
    os.chdir(ROOT)
    rc = pytest.main(["-q", "-p", "no:cacheprovider", "-p", "no:xdist", *pytest_args], plugins=[charge])
    print()
    print(summary(charge.rows, busy_cpu_s() - cpu0, time.perf_counter() - t0, args.top))
    return int(rc)


if __name__ == "__main__":
    sys.exit(main())
