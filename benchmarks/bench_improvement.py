"""P(X > Y) over a grid's seeds: counted from ranks against every pair, side by side in one run.

    python benchmarks/bench_improvement.py                  # 5, 50 and 193 seeds (the 10,036-trial rehearsal's)
    python benchmarks/bench_improvement.py --seeds 5 20 --report 20
    python benchmarks/bench_improvement.py --seeds 193 --report 0 --store 193   # the report process, 10,808 runs

``analysis.intervals.improvement`` is called on every bootstrap replicate (R, D, S) of each pair
the report compares: counting every pair of seeds costs S² per dataset and replicate, Mann-Whitney's
U from ranks a sort of 2S. Both must give the same numbers bit for bit; this checks that too.
``--report S`` also times the report's statistics (``analysis.reporting.analyse_runs``, no figures)
on a synthetic study of the rehearsal's shape (4 datasets, 7 conditions, 2 lrs, S seeds: 14 runs
a seed and dataset) with each method. ``--store S`` writes such a study into an MLflow SQLite
store (``bench_report.build_store``: runs as the grid writes them) and times the report as a user
runs it, ``python -m raystudy report --no-figures``, a process of its own: load and statistics,
once reading the runs with SQL and once through MLflow's search, and compares the two reports'
files byte for byte.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def timed(f, *args) -> tuple[float, np.ndarray]:
    t = time.perf_counter()
    out = f(*args)
    return time.perf_counter() - t, out


def study(seeds: int):
    """The rehearsal's shape: 4 datasets, 7 conditions, 2 lrs (the linear probe's too), ``seeds``."""
    from analysis.synthetic import fake_runs

    conditions = ("LN1", "MHA", "LN2", "FC1", "FC2", "full", "linear_probe")
    return fake_runs(4, conditions, (0.1, 0.3), tuple(range(seeds)))


def report_seconds(seeds: int) -> tuple[float, int]:
    from analysis import reporting

    runs = study(seeds)
    with tempfile.TemporaryDirectory() as out:
        t = time.perf_counter()
        reporting.analyse_runs(runs, out, draw_figures=False)
        return time.perf_counter() - t, len(runs)


# The report as a user runs it, in a process of its own; with ``search`` its trial runs read through
# MLflow's search (bench_report.by_search), as from a store SQL cannot reach.
REPORT = """
import sys
sys.path.insert(0, {bench!r})
from bench_report import by_search
from analysis.commands import report
if {search}:
    with by_search():
        sys.exit(report.main(sys.argv[1:]))
sys.exit(report.main(sys.argv[1:]))
"""


def report_process(seeds: int) -> tuple[float, float, int, int, int]:
    """(seconds of the report reading the runs with SQL, with MLflow's search, runs, files that
    differ byte for byte between the two reports, files)."""
    import filecmp
    import subprocess

    from bench_report import EXPERIMENT, build_store

    runs = study(seeds)
    with tempfile.TemporaryDirectory() as tmp:
        uri, _ = build_store(Path(tmp), runs)
        seconds = []
        for search in (False, True):
            code = REPORT.format(bench=str(ROOT / "benchmarks"), search=search)
            cmd = [sys.executable, "-c", code, "--experiment", EXPERIMENT, "--tracking-uri", uri]
            cmd += ["--no-figures", "--out", str(Path(tmp) / f"report-{search}")]
            t = time.perf_counter()
            subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True)
            seconds.append(time.perf_counter() - t)
        a, b = Path(tmp) / "report-False", Path(tmp) / "report-True"
        names = sorted(str(f.relative_to(a)) for f in a.rglob("*") if f.is_file())
        assert names == sorted(str(f.relative_to(b)) for f in b.rglob("*") if f.is_file())
        _, differ, errors = filecmp.cmpfiles(a, b, names, shallow=False)
        return seconds[0], seconds[1], len(runs), len(differ) + len(errors), len(names)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[5, 50, 193])  # 193: the 10,036-trial rehearsal's seeds
    ap.add_argument("--reps", type=int, default=2000, help="bootstrap replicates (the report's default)")
    ap.add_argument("--report", type=int, default=193, help="seeds of the report timed with each; 0: none")
    ap.add_argument("--store", type=int, default=0, help="seeds of the store the report process reads; 0: none")
    args = ap.parse_args(argv)

    from analysis import intervals

    rng = np.random.default_rng(0)
    print(f"one pair, {args.reps} replicates x 4 datasets    ranks     pairs   pairs / ranks")
    for s in args.seeds:
        x, y = (np.round(rng.random((args.reps, 4, s)), 3) for _ in range(2))  # ties, as accuracies have
        x[:, :, -1] = np.nan  # an absent seed
        t_rank, by_rank = timed(intervals.improvement, x, y)
        t_pairs, by_pairs = timed(intervals._improvement_by_pairs, x, y)
        assert np.array_equal(by_rank, by_pairs, equal_nan=True), "the two counts differ"
        print(f"  {s:4d} seeds {'':29s}{t_rank:7.3f} s {t_pairs:8.3f} s   {t_pairs / t_rank:7.1f}x")
    if args.report:
        ranked, n = report_seconds(args.report)
        fast = intervals.improvement
        intervals.improvement = intervals._improvement_by_pairs
        try:
            paired, _ = report_seconds(args.report)
        finally:
            intervals.improvement = fast
        print(
            f"the report's statistics at {args.report} seeds ({n} runs): "
            f"{ranked:.1f} s from ranks, {paired:.1f} s by pairs ({paired / ranked:.1f}x)"
        )
    if args.store:
        sql, searched, n, differ, files = report_process(args.store)
        print(
            f"the report (--no-figures, a process) on a store of {n} runs ({args.store} seeds): {sql:.1f} s "
            f"reading the runs and curves with SQL, {searched:.1f} s through MLflow's search and calls "
            f"({sql / searched:.2f}x); "
            f"{files - differ} of {files} files the same byte for byte"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
