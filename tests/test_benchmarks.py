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
