"""Where the test suite's time goes: the CPU seconds of each test, every process it started counted.

    python benchmarks/suite_cpu.py -m slow               # the slow tier, one test at a time
    python benchmarks/suite_cpu.py -m "not slow" --top 40
    python benchmarks/suite_cpu.py tests/commands/test_grid_ray.py
    python benchmarks/suite_cpu.py -m slow --processes   # and by kind of process, how many started

Both tiers keep a 2-core machine busy under ``-n 2``, so a tier's wall time is about its CPU
seconds over 2, and a test's own wall time under xdist mostly measures its neighbour. This runs
the selected tests one at a time (no xdist) and charges each the machine's busy CPU time
(``/proc/stat``) while it ran: the drivers, Ray's workers and servers and the MLflow servers it
started count, which a per-process timer misses. Run it on a quiet machine: whatever else runs
is charged to the tests (the load average is printed first). A fixture of wider scope is charged
to the first test that sets it up. Arguments other than ``--top`` and ``--processes`` go to
pytest. Linux only.

``--processes`` also samples the processes the tests start (and theirs) twice a second and
prints, per kind (trial actor, grid driver, Ray's servers, ...), how many started and their CPU
seconds: fewest, median, most. A test's floor is its process starts times what each costs
before it does any work, which the per-test table cannot show. A process's CPU after its last
sample, a process that lives under half a second, and one whose parent ended before it was
seen are missed; the table says how much of the machine's busy time it covers.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import statistics
import sys
import threading
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def busy_cpu_s() -> float:
    """CPU seconds the whole machine has spent busy (not idle, not waiting on I/O) since boot."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


# What a process is, from its name and command line (``comm | cmdline``): the first match wins.
# Ray renames a worker process once it holds an actor (``ray::ImplicitFunc`` for a Tune trial);
# the kernel keeps 15 characters of a name, hence the cut names.
KINDS = [
    ("trial actor (Tune)", r"\bray::ImplicitFu"),
    ("Ray Train controller or worker", r"\bray::(RayTrainWo|TrainContr|_Inner)"),
    (
        "Ray's servers and agents",
        r"\bray::(DashboardA|RuntimeEnv)|gcs_server|/raylet |dashboard/dashboard\.py|"
        r"log_monitor\.py|autoscaler/_private/monitor\.py|runtime_env/agent/main\.py",
    ),
    ("Ray worker never given an actor", r"\bray::|workers/(setup|default)_worker\.py"),
    ("grid driver", r" -m raystudy[. ]grid\b"),
    ("search driver", r" -m raystudy search\b"),
    ("analysis command", r" -m raystudy (report|export|replay)\b"),
    ("other raystudy command", r" -m raystudy\b"),
    ("benchmark script", r"benchmarks/\w+\.py"),
    ("MLflow server", r" -m mlflow server|uvicorn|gunicorn|huey"),
    ("ray up / SSH", r"/bin/ray |sshd|\bssh |rsync"),
    ("other Python (test helpers)", r"python"),
    ("other", r""),
]


def kind(label: str) -> str:
    """The ``KINDS`` name of a process labelled ``comm | cmdline``."""
    return next(name for name, rx in KINDS if re.search(rx, label))


class Processes:
    """Every process this one starts while it runs, and their children, sampled from ``/proc``
    every ``every`` seconds in a thread: (pid, start time) -> [label, CPU seconds at its latest
    sample]. Other jobs' processes are left out; this process is counted apart (its tests and
    this sampler)."""

    def __init__(self, every: float = 0.5):
        self.every, self.seen = every, {}
        self.tick = os.sysconf("SC_CLK_TCK")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self):
        live = {}  # pid -> (key, ppid, fields)
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                stat = Path(f"/proc/{d}/stat").read_text()
            except OSError:
                continue  # gone between the listing and the read
            fields = stat[stat.rindex(")") + 2 :].split()
            live[int(d)] = ((int(d), fields[19]), int(fields[1]), fields)  # start time: a pid can be reused
        # ours: a process seen before as ours, or whose parent is this process or ours (a child
        # can be listed before its parent, so until nothing changes)
        ours, grew = {os.getpid()} | {pid for pid, (key, _, _) in live.items() if key in self.seen}, True
        while grew:
            new = {pid for pid, (_, ppid, _) in live.items() if pid not in ours and ppid in ours}
            ours |= new
            grew = bool(new)
        for pid in ours - {os.getpid()}:
            key, _, fields = live[pid]
            try:
                comm = Path(f"/proc/{pid}/comm").read_text().strip()
                if key not in self.seen or (comm.startswith("ray::") and not self.seen[key][0].startswith(comm)):
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                    self.seen[key] = [f"{comm} | {cmd}", 0.0]
            except OSError:
                continue
            self.seen[key][1] = (int(fields[11]) + int(fields[12])) / self.tick  # utime + stime

    def _run(self):
        while not self._stop.wait(self.every):
            self._sample()

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def by_kind(seen: dict, own_cpu: float, session_cpu: float) -> str:
    """The per-kind table ``--processes`` prints, from ``Processes.seen``."""
    groups: dict[str, list[float]] = {}
    for label, cpu in seen.values():
        groups.setdefault(kind(label), []).append(cpu)
    out = [
        f"{'procs':>6} {'CPU s':>8} {'fewest':>7} {'median':>7} {'most':>7}  kind of process (started during the run)"
    ]
    for name, _ in KINDS:
        if name in groups:
            c = groups[name]
            out.append(f"{len(c):6d} {sum(c):8.1f} {min(c):7.2f} {statistics.median(c):7.2f} {max(c):7.2f}  {name}")
    out.append(
        f"{1:6d} {own_cpu:8.1f} {'':>7} {'':>7} {'':>7}  pytest (this process: in-process tests, collection, sampling)"
    )
    seen_cpu = sum(c for _, c in seen.values()) + own_cpu
    out.append(
        f"{'':>6} {seen_cpu:8.1f}  in all: {seen_cpu / session_cpu:.0%} of the machine's busy CPU while it ran"
        if session_cpu > 0
        else f"{'':>6} {seen_cpu:8.1f}  in all"
    )
    return "\n".join(out)


class Charge:
    """A pytest plugin: each test's machine CPU seconds and wall seconds, setup and teardown included."""

    def __init__(self):
        self.rows: list[tuple[float, float, str, str]] = []  # cpu, wall, nodeid, outcome

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
    out += [
        "",
        f"{tests_cpu:8.1f} CPU s in {len(rows)} tests; "
        f"{session_cpu - tests_cpu:.1f} CPU s outside them (start-up, collection, the session's end); "
        f"{session_wall:.0f} s wall; about {session_cpu / cores:.0f} s on {cores} busy cores",
    ]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--top", type=int, default=25, help="tests listed by CPU (default 25)")
    ap.add_argument(
        "--processes", action="store_true", help="also count the processes the tests started, and their CPU, by kind"
    )
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
    os.chdir(ROOT)
    procs = Processes() if args.processes else None
    cpu0, own0, t0 = busy_cpu_s(), time.process_time(), time.perf_counter()
    with procs or contextlib.nullcontext():
        rc = pytest.main(["-q", "-p", "no:cacheprovider", "-p", "no:xdist", *pytest_args], plugins=[charge])
    session_cpu, own_cpu, wall = busy_cpu_s() - cpu0, time.process_time() - own0, time.perf_counter() - t0
    print()
    print(summary(charge.rows, session_cpu, wall, args.top))
    if procs:
        print()
        print(by_kind(procs.seen, own_cpu, session_cpu))
    return int(rc)


if __name__ == "__main__":
    sys.exit(main())
