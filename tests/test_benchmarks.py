"""Benchmarks are scripts, not tests; these run them at toy sizes so they cannot rot unseen."""

import glob
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_report_benchmark_runs_at_toy_size(tmp_path):
    p = subprocess.run(
        [
            sys.executable,
            "benchmarks/bench_report.py",
            "--models",
            "1",
            "--datasets",
            "2",
            "--seeds",
            "2",
            "--lrs",
            "2",
            "--bootstrap-reps",
            "50",
            "--keep",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    lines = {line.split()[0]: line for line in p.stdout.splitlines() if line.strip()}
    assert {"load", "search", "stats", "figures", "analysis", "total"} <= set(lines)
    assert "128 runs from MLflow" in lines["load"]  # 1 model x 2 optimizers x 2 x 8 conditions x 2 x 2
    assert "the same table" in lines["search"]  # the benchmark asserts both loads give one frame
    assert "of 2 studies" in lines["stats"]  # one per optimizer


def test_improvement_benchmark_checks_both_counts_and_times_the_report_with_each():
    cmd = [sys.executable, "benchmarks/bench_improvement.py", "--seeds", "3", "12", "--reps", "50", "--report", "2"]
    p = subprocess.run([*cmd, "--store", "2"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]  # it asserts the two counts agree
    rows = [line.split() for line in p.stdout.splitlines() if "seeds" in line and line.split()[0].isdigit()]
    assert [r[0] for r in rows] == ["3", "12"] and all(r[-1].endswith("x") for r in rows)
    assert "the report's statistics at 2 seeds (112 runs):" in p.stdout and "by pairs" in p.stdout
    assert "the report (--no-figures, a process) on a store of 112 runs (2 seeds):" in p.stdout
    same = re.search(r"(\d+) of (\d+) files the same byte for byte", p.stdout)  # read with SQL, and by search
    assert same and same.group(1) == same.group(2) and int(same.group(2)) > 10, p.stdout[-2000:]


@pytest.mark.slow
def test_suite_cpu_charges_each_test_and_totals_by_file():
    p = subprocess.run(
        [
            sys.executable,
            "benchmarks/suite_cpu.py",
            "--top",
            "2",
            "tests/analysis/test_stats.py",
            "-k",
            "holm or nemenyi",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    out = p.stdout.splitlines()
    tests = [ln for ln in out if "tests/analysis/test_stats.py::" in ln]
    assert len(tests) == 2 and all(float(ln.split()[0]) >= 0 for ln in tests), out
    more = next(ln for ln in out if "more," in ln).split("...")[1].split()  # ['N', 'more,', 'X', 'CPU', 's']
    assert int(more[0]) >= 1
    assert f"CPU s in {2 + int(more[0])} tests" in next(ln for ln in out if "CPU s in" in ln)
    # the file's total is its tests' CPU: the two listed and the rest
    file_total = next(float(ln.split()[0]) for ln in out if ln.strip().endswith("  tests/analysis/test_stats.py"))
    listed = sum(float(ln.split()[0]) for ln in tests) + float(more[2])
    assert abs(file_total - listed) <= 0.15, out
    bad = subprocess.run(
        [sys.executable, "benchmarks/suite_cpu.py", "--top", "-1"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert bad.returncode == 2 and bad.stderr.strip() == "error: --top must be >= 0, got -1"


def _suite_cpu():
    import importlib.util

    spec = importlib.util.spec_from_file_location("suite_cpu", ROOT / "benchmarks" / "suite_cpu.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_suite_cpu_names_each_kind_of_process():
    # labels as /proc gives them (comm | cmdline): Ray renames a worker once it holds an actor,
    # and the kernel cuts a name at 15 characters
    py, site = "/root/.pyenv/versions/3.11.7/bin/python", "/usr/lib/python3.11/site-packages/ray"
    kind = _suite_cpu().kind
    assert kind("ray::ImplicitFu | ray::ImplicitFunc.train") == "trial actor (Tune)"
    assert kind("ray::RayTrainWo | ray::RayTrainWorker") == "Ray Train controller or worker"
    assert kind("ray::TrainContr | ray::TrainController") == "Ray Train controller or worker"
    assert kind("ray::IDLE | ray::IDLE") == "Ray worker never given an actor"
    assert (
        kind(f"python | {py} {site}/_private/workers/setup_worker.py --language PYTHON")
        == "Ray worker never given an actor"
    )
    for label in (
        "ray::DashboardA | ray::DashboardAgent",
        f"gcs_server | {site}/core/src/ray/gcs/gcs_server --log_dir=/t",
        f"raylet | {site}/core/src/ray/raylet/raylet --raylet_socket_name=/t",
        f"python | {py} {site}/dashboard/dashboard.py --host=127.0.0.1",
        f"python | {py} -u {site}/_private/log_monitor.py --session-dir=/t",
    ):
        assert kind(label) == "Ray's servers and agents", label
    assert kind(f"python | {py} -m raystudy.grid --space space.yaml --address 10.0.0.1:6379") == "grid driver"
    assert kind(f"python | {py} -m raystudy search --space s.yaml") == "search driver"
    assert kind(f"python | {py} -m raystudy finetune --config c.yaml") == "other raystudy command"
    assert kind(f"python | {py} -m raystudy report --experiment e") == "analysis command"
    assert kind(f"python | {py} -m mlflow server --host 127.0.0.1 --port 5000") == "MLflow server"
    assert kind(f"python | {py} -c import sys, ray") == "other Python (test helpers)"
    assert kind("sshd | sshd: root [priv]") == "ray up / SSH"
    assert kind("bash | bash -c true") == "other"


def same_seconds(total: str, one: str) -> bool:
    """A kind's CPU seconds (printed to 0.1) and those of its one process (to 0.01): the same
    seconds, as far as the two roundings allow."""
    return abs(float(total) - float(one)) <= 0.05 + 0.005 + 1e-9


def same_ratio(now: float, before: float, ratio: float) -> bool:
    """A ratio printed to 0.01 and the ratio of its two times, each printed to 0.01: the same, as
    far as the three roundings allow."""
    return abs(ratio - now / before) <= 0.005 + 0.005 * (1 + now / before) / before + 1e-9


def test_printed_figures_agree_as_far_as_their_rounding_allows():
    # CI on a fresh clone of f82d87c: "1  1.9  1.95  1.95  1.95  other raystudy command" (1.95 s
    # prints as 1.9 to one decimal: the float is 1.9499...), which a tolerance of 0.05 refused
    assert same_seconds("1.9", "1.95") and same_seconds("2.0", "1.95")
    assert not same_seconds("1.8", "1.95")
    # 0.334999 / 0.455 prints 0.33, 0.46 and 0.74, where 0.33 / 0.46 is 0.717
    assert same_ratio(0.33, 0.46, 0.74) and not same_ratio(0.33, 0.46, 0.76)


@pytest.mark.slow
def test_suite_cpu_counts_the_processes_a_test_starts():
    # the probe's CLI test starts one `python -m raystudy probe`: one process of that kind
    p = subprocess.run(
        [
            sys.executable,
            "benchmarks/suite_cpu.py",
            "--processes",
            "--top",
            "1",
            "tests/commands/test_probe.py",
            "-k",
            "unknown_mode",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    out = p.stdout.splitlines()
    (row,) = [ln for ln in out if ln.endswith("  other raystudy command")]
    n, cpu, fewest, median, most = row.split()[:5]
    assert n == "1" and fewest == median == most and 0 < float(fewest) and same_seconds(cpu, fewest), row
    assert not [ln for ln in out if ln.endswith(("trial actor (Tune)", "grid driver"))], out
    # what it saw is part of what the machine did (less under another job's load: CI's other worker)
    share = next(ln for ln in out if "of the machine's busy CPU" in ln)
    assert 0 < int(share.split(":")[1].split("%")[0]) <= 110, share


@pytest.mark.slow
def test_startup_benchmark_prints_both_variants_and_their_ratio():
    p = subprocess.run(
        [sys.executable, "benchmarks/bench_startup.py", "--only", "driver", "--reps", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    now, before, ratio = (float(v) for v in p.stdout.splitlines()[-1].split()[1:])
    assert p.stdout.splitlines()[-1].startswith("driver") and now > 0 and before > 0
    assert same_ratio(now, before, ratio), (now, before, ratio)


PG_CTL = shutil.which("pg_ctl") or next(iter(sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))), None)
needs_pg = pytest.mark.skipif(
    PG_CTL is None, reason="no PostgreSQL server programs (pg_ctl): apt-get install -y postgresql (.ci/run installs it)"
)


def _number(token: str) -> float | None:
    try:
        return float(token.removesuffix("ms").removesuffix("s"))
    except ValueError:
        return None


def _rows(stdout: str, names) -> dict[str, list[float]]:
    """The figures of each named row of a side-by-side table (the words before its first number):
    its first two numbers, SQLite's and PostgreSQL's."""
    out = {}
    for line in stdout.splitlines():
        tokens = line.split()
        first = next((i for i, t in enumerate(tokens) if _number(t) is not None), len(tokens))
        if " ".join(tokens[:first]) in names:
            out[" ".join(tokens[:first])] = [v for v in map(_number, tokens[first:]) if v is not None][:2]
    return out


@pytest.mark.slow
@needs_pg
def test_store_benchmark_times_each_wait_in_sqlite_and_postgresql_at_toy_size():
    p = subprocess.run(
        [sys.executable, "benchmarks/bench_store.py", "--runs", "40", "--small", "10", "--steps", "5", "--reps", "2"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    assert p.stdout.splitlines()[2].split() == ["sqlite", "postgresql"], p.stdout
    names = ("fill", "page", "curves", "load", "done", "done by search", "trial@10", "trial@40", "open@10", "open@40")
    rows = _rows(p.stdout, names)
    assert set(rows) == set(names), p.stdout
    assert all(len(v) == 2 and min(v) > 0 for v in rows.values()), p.stdout
    # both stores hold the same records: the template trial and its clones, the driver's trials
    (sqlite_rows,) = [ln for ln in p.stdout.splitlines() if ln.startswith("measured sqlite:")]
    assert sqlite_rows.replace("sqlite", "postgresql") in p.stdout, p.stdout


@pytest.mark.slow
@needs_pg
def test_writers_benchmark_measures_a_real_server_on_each_store_at_toy_size():
    p = subprocess.run(
        [sys.executable, "benchmarks/bench_writers.py", "--writers", "2", "--trials", "2", "--steps", "3"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    assert "measured sqlite: every trial recorded exactly once" in p.stdout
    assert "measured postgresql: every trial recorded exactly once" in p.stdout
    names = ("workers", "writes/s", "wait p50", "wait p95", "wait max", "per trial", "span")
    rows = _rows(p.stdout, names)
    assert len(rows) == len(names) and all(len(v) == 2 and min(v) > 0 for v in rows.values()), p.stdout
    assert rows["workers"] == [1, 4]  # SQLite's one writer; PostgreSQL's default workers


@pytest.mark.parametrize(
    "script, args, message",
    [
        (
            "bench_store.py",
            ["--runs", "5", "--small", "10"],
            "error: --small 10 and --runs 5: need 2 <= small < runs <= 10560",
        ),
        ("bench_store.py", ["--stores", "mysql"], "error: --stores 'mysql': use sqlite, postgresql (comma-separated)"),
        ("bench_writers.py", ["--writers", "0"], "error: --writers, --trials, --steps and --pg-workers must be >= 1"),
    ],
)
def test_store_benchmarks_refuse_bad_input_in_one_line(script, args, message):
    p = subprocess.run(
        [sys.executable, f"benchmarks/{script}", *args], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 2 and p.stderr.strip() == message, p.stderr


@pytest.mark.slow
def test_scale_benchmark_runs_at_toy_size(tmp_path):
    """The drivers on the same 13 rehearsal trials (raystudy's also through a PostgreSQL tracking
    server): each runs them all, and raystudy's store holds each once, read back by what a resumed
    grid and the report read; raystudy's grid through the head's server, killed twice and resumed,
    holds each once too."""
    out = tmp_path / "scale.json"
    cmd = [sys.executable, "benchmarks/bench_scale.py", "--trials", "13", "--datasets", "1"]
    cmd += ["--seconds", "0.5", "--concurrency", "4", "--kill-at", "0.2,0.45", "--json", str(out)]
    cmd += ["--kill-store", "postgresql"]
    cmd += ["--variants", "raystudy,stock,bare,raystudy_pg"]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    (row,) = json.loads(out.read_text())
    assert row["n"] == 13
    for v in ("raystudy", "stock", "bare"):
        assert row[v]["wall"] > 13 * 0.5 / 4  # not under the minimum
        assert row[v]["cpu"] > 0 and row[v]["peak"] > 0
        assert 0 < row[v]["workers"] <= 13, row[v]  # its Ray's worker processes, from the session's logs
    assert row["raystudy"]["done_n"] == row["raystudy"]["load_n"] == 13 and row["raystudy"]["report_s"] > 0
    # through a tracking server on PostgreSQL, as a cluster's head runs it
    pg = row["raystudy_pg"]
    assert pg["wall"] > 13 * 0.5 / 4 and pg["done_n"] == pg["load_n"] == 13 and pg["store"] > 0, pg
    assert "raystudy_pg's store: what is done" in p.stdout
    assert row["stock"]["store"] > 0 and row["bare"]["store"] == 0  # bare Tune records nothing
    assert "N = 13 trials of 0.5 s, 4 at once: the minimum is 1.6 s" in p.stdout
    assert (
        "wall raystudy / stock:" in p.stdout and "pace (trial-seconds completed a wall second, 4 at once)" in p.stdout
    )
    # killed once 3 of 13 had finished in the store, then again at 6; the store holds each once,
    # finished, no step twice. A rerun's first new run is timed where it opens one: on a loaded
    # machine the killed driver can have run every trial, the store's records lagging behind
    # Tune's, and the rerun then records them from the trials' own results, opening none anew
    k = row["killed"]
    assert k["store_kind"] == "postgresql" and k["store"] > 0, k
    assert k["first_done"] >= 3 and k["killed_rss"] > 0, k
    (first, second) = k["restarts"]
    assert first["at"] >= 3 and second["at"] >= 6, k
    for r in k["restarts"]:
        if "first_run_s" in r:
            assert 0 < r["first_run_s"] < r["seconds"], k
    assert k["runs"] == k["keys"] == k["finished"] == 13 and k["running"] == 0 and k["steps_twice"] == 0, k
    assert k["done_n"] == k["load_n"] == 13, k
    assert k["anomalies"] == [] and "the checker: 0 anomalies" in p.stdout, k["anomalies"]  # benchmarks/checker.py
    assert (
        "raystudy killed and resumed (postgresql)" in p.stdout
        and "SIGKILLed at" in p.stdout
        and "13 trial runs, 13 keys, 13 finished, 0 RUNNING, 0 metric steps twice" in p.stdout
    )


@pytest.mark.slow
def test_search_benchmark_runs_both_searches_and_a_killed_one_at_toy_size(tmp_path):
    """raystudy's rehearsal search and Optuna alone over the same 20 trials, side by side, then
    raystudy's search SIGKILLed at half-way and run again: each trial once."""
    out = tmp_path / "search.json"
    cmd = [sys.executable, "benchmarks/bench_search.py", "--trials", "20", "--seconds", "0.2", "--concurrency", "4"]
    p = subprocess.run(
        [*cmd, "--kill-at", "0.5", "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=900
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    row = json.loads(out.read_text())
    rs, op, k = row["raystudy"], row["optuna"], row["killed"]
    assert set(rs["cpu"]) == set(op["cpu"]) == {"4", "10", "20"}  # the marks of 20 trials
    assert all(v > 0 for v in [*rs["cpu"].values(), *op["cpu"].values()]), (rs["cpu"], op["cpu"])
    assert rs["wall"] > 20 * 0.2 / 4 and rs["peak_kb"] > 0 and rs["optuna_mb"] > 0 and rs["mlflow_mb"] > 0
    assert rs["found"].startswith("rehearsal: known optimum 0.950; chosen config"), rs["found"]
    assert "growth from 4 to 20 trials: raystudy" in p.stdout
    # the worker processes its Ray started (Ray's session logs), the rehearsal seconds run a wall second
    assert 0 < rs["workers"] <= 20 and 0 < rs["pace"] <= 4, rs
    assert f"worker processes {rs['workers']} ({rs['workers'] / 20:.3f} a trial); pace" in p.stdout
    # killed once 10 of 20 were COMPLETE: the budget COMPLETE once, each ended in one run, none RUNNING
    assert k["killed_at"][0] >= 10 and k["complete"] == 20 and k["ended"] == 20, k
    assert len(k["first_new_s"]) == 1 and k["workers"] > 0, k
    assert k["runs"] == k["keys"] == 20 + k["interrupted"] and k["running"] == k["steps_twice"] == 0, k
    assert "exactly once: yes" in p.stdout
    assert k["anomalies"] == [] and "the checker: 0 anomalies" in p.stdout, k["anomalies"]  # benchmarks/checker.py


@pytest.mark.slow
def test_auth_benchmark_times_the_heads_server_with_and_without_its_credential_cache():
    p = subprocess.run(
        [sys.executable, "benchmarks/bench_auth.py", "--requests", "5"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    assert "| 0 s |" in p.stdout and "| 600 s |" in p.stdout and "cached / uncached, mean ms a request: " in p.stdout
    assert p.stdout.count(" | 401 |") == 2  # a wrong password refused, cached credentials or not
