"""Benchmarks are scripts, not tests; these run them at toy sizes so they cannot rot unseen."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_report_benchmark_runs_at_toy_size(tmp_path):
    p = subprocess.run([sys.executable, "benchmarks/bench_report.py", "--models", "1", "--datasets", "2",
                        "--seeds", "2", "--lrs", "2", "--bootstrap-reps", "50", "--keep", str(tmp_path)],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    lines = {line.split()[0]: line for line in p.stdout.splitlines() if line.strip()}
    assert {"load", "stats", "figures", "analysis", "total"} <= set(lines)
    assert "128 runs from MLflow" in lines["load"]  # 1 model x 2 optimizers x 2 x 8 conditions x 2 x 2
    assert "of 2 studies" in lines["stats"]  # one per optimizer


@pytest.mark.slow
def test_suite_cpu_charges_each_test_and_totals_by_file():
    p = subprocess.run([sys.executable, "benchmarks/suite_cpu.py", "--top", "2", "tests/test_analysis_stats.py",
                        "-k", "holm or nemenyi"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    out = p.stdout.splitlines()
    tests = [ln for ln in out if "tests/test_analysis_stats.py::" in ln]
    assert len(tests) == 2 and all(float(ln.split()[0]) >= 0 for ln in tests), out
    more = next(ln for ln in out if "more," in ln).split("...")[1].split()   # ['N', 'more,', 'X', 'CPU', 's']
    assert int(more[0]) >= 1
    assert f"CPU s in {2 + int(more[0])} tests" in next(ln for ln in out if "CPU s in" in ln)
    # the file's total is its tests' CPU: the two listed and the rest
    file_total = next(float(ln.split()[0]) for ln in out if ln.strip().endswith("  tests/test_analysis_stats.py"))
    listed = sum(float(ln.split()[0]) for ln in tests) + float(more[2])
    assert abs(file_total - listed) <= 0.15, out
    bad = subprocess.run([sys.executable, "benchmarks/suite_cpu.py", "--top", "-1"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.strip() == "error: --top must be >= 0, got -1"


@pytest.mark.slow
def test_startup_benchmark_prints_both_variants_and_their_ratio():
    p = subprocess.run([sys.executable, "benchmarks/bench_startup.py", "--only", "driver", "--reps", "1"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    now, before, ratio = (float(v) for v in p.stdout.splitlines()[-1].split()[1:])
    assert p.stdout.splitlines()[-1].startswith("driver") and now > 0 and before > 0
    assert ratio == pytest.approx(now / before, abs=0.01)
