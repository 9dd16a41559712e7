"""Several drivers at once against one tracking server: SQLite (one worker) vs PostgreSQL (several).

    python benchmarks/bench_writers.py    # 3 drivers × 20 trials × 20 reports; PostgreSQL with 4 workers
    python benchmarks/bench_writers.py --writers 6 --pg-workers 8
    python benchmarks/bench_writers.py --writers 2 --trials 2 --steps 3   # toy size (the test's)

For each store a real ``mlflow server`` is started on it (a SQLite file with ``--workers 1``, as
the cluster runs it; a PostgreSQL server of its own with ``--pg-workers``), then ``--writers``
processes, started together, each write the records of ``--trials`` trials to an experiment of
their own (a grid each) through the server's HTTP API, as the grid's driver writes them:
``open_trial``, ``logged_upto``, ``log_steps`` once per report, ``finish_trial``. A write is
one of those calls. Printed per store: the server's writes per second (all writers' writes over
the span from the first write to the last), the writers' wait per write (median, 95th
percentile, slowest) and per trial. Afterwards every experiment is checked to hold each trial
exactly once, finished.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

STORES = ("sqlite", "postgresql")


def writer(uri: str, index: int, trials: int, steps: int, barrier, results) -> None:
    """One driver's writes (module docstring), timed; puts [(start, seconds, call)] on ``results``."""
    from bench_store import reports

    from raystudy.tracking import connect, query, record
    from raystudy.train.config import FinetuneConfig, trial_key

    os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] = "true"  # a line per run would bury the table
    cl = connect.client(uri)
    exp_id = connect.experiment_id(cl, f"bench-writers-{index}")
    parent = record.parent_run(cl, exp_id, f"grid-{index}", f"grid-{index}", {"space": "bench"})
    done: list[tuple[float, float, str]] = []

    def timed(name, f, *a):
        t0, t = time.time(), time.perf_counter()
        out = f(*a)
        done.append((t0, time.perf_counter() - t, name))
        return out

    barrier.wait()
    for i in range(trials):
        cfg = FinetuneConfig(
            model="vit_demo", pretrained=False, dataset="digits", condition="MHA", lr=0.1, seed=i
        ).to_dict()
        run = timed("open_trial", record.open_trial, cl, exp_id, parent, trial_key(cfg), cfg)
        upto = timed("logged_upto", query.logged_upto, cl, run)
        for r in reports(steps, i):
            timed("log_steps", record.log_steps, cl, run, [r], upto)
        result = {"status": "finished", "best_val_acc": 0.8, "test_acc": 0.7, "best_step": 10}
        timed("finish_trial", record.finish_trial, cl, run, result)
    results.put(done)


def serve(store_uri: str, workers: int, root: Path) -> tuple[subprocess.Popen, str]:
    """A real ``mlflow server`` over ``store_uri`` in a session of its own, answering /health;
    returns (process, its URI)."""
    from pg_server import free_port

    port = free_port()
    cmd = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--workers", str(workers), "--backend-store-uri", store_uri, "--artifacts-destination", str(root / "art")]
    log = open(root / "server.log", "w")
    # Without the job runner it starts in seconds and leaves no children behind when stopped.
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=log, stderr=log, start_new_session=True)
    uri = f"http://127.0.0.1:{port}"
    deadline = time.time() + 180
    while True:
        try:
            urllib.request.urlopen(f"{uri}/health", timeout=2)
            return proc, uri
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                stop(proc)
                raise RuntimeError(f"mlflow server did not start; its log: {root / 'server.log'}") from None
            time.sleep(0.5)


def stop(proc: subprocess.Popen) -> None:
    """The server and its workers stopped, by its session's process group."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


def run_writers(uri: str, args) -> list[tuple[float, float, str]]:
    """Every write of ``--writers`` processes started together against ``uri``."""
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(args.writers), ctx.Queue()
    procs = [
        ctx.Process(target=writer, args=(uri, i, args.trials, args.steps, barrier, results))
        for i in range(args.writers)
    ]
    for p in procs:
        p.start()
    writes = [w for _ in procs for w in results.get(timeout=3600)]
    for p in procs:
        p.join(timeout=60)
        if p.exitcode != 0:
            raise RuntimeError(f"a writer process ended with status {p.exitcode}")
    return writes


def check_once(uri: str, args) -> None:
    """Every writer's experiment holds each of its trials exactly once, finished."""
    from raystudy.tracking import connect, query, tags

    cl = connect.client(uri)
    for i in range(args.writers):
        exp_id = cl.get_experiment_by_name(f"bench-writers-{i}").experiment_id
        found = query.find_runs(cl, exp_id, raystudy__role="trial")
        keys = {r.data.tags[tags.KEY] for r in found}
        status = {r.data.tags[tags.STATUS] for r in found}
        if len(found) != args.trials or len(keys) != args.trials or status != {"finished"}:
            raise RuntimeError(f"writer {i}: {len(found)} runs of {len(keys)} trials, statuses {status}")


def figures(writes: list[tuple[float, float, str]], args) -> dict[str, float]:
    """The table's figures from every write (start, seconds, call)."""
    waits = sorted(s for _, s, _ in writes)
    span = max(t + s for t, s, _ in writes) - min(t for t, _, _ in writes)
    per_trial = sum(waits) / (args.writers * args.trials)
    return {
        "writes/s": len(writes) / span,
        "wait p50": waits[len(waits) // 2],
        "wait p95": waits[min(len(waits) - 1, int(0.95 * len(waits)))],
        "wait max": waits[-1],
        "per trial": per_trial,
        "span": span,
    }


def measure(store: str, root: Path, args) -> dict[str, float]:
    """The figures of one store: its server started, the writers run, the records checked."""
    from pg_server import postgres

    from raystudy.tracking import connect

    with contextlib.ExitStack() as stack:
        if store == "sqlite":
            store_uri, workers = f"sqlite:///{root / 'mlflow.db'}", 1
        else:
            store_uri = stack.enter_context(postgres(root, max_connections=max(100, 20 * args.pg_workers)))
            workers = args.pg_workers
        # The schema made once here: the server's workers would otherwise race to make it.
        connect.client(store_uri).search_experiments(max_results=1)
        server, uri = serve(store_uri, workers, root)
        stack.callback(stop, server)
        out = figures(run_writers(uri, args), args)
        check_once(uri, args)
    out["workers"] = workers
    return out


ROWS = (
    ("workers", "{:>12.0f}", "server workers"),
    ("writes/s", "{:>12.1f}", "the server's writes per second, all writers together"),
    ("wait p50", "{:>10.1f}ms", "a writer's wait per write: median"),
    ("wait p95", "{:>10.1f}ms", "95th percentile"),
    ("wait max", "{:>10.1f}ms", "slowest"),
    ("per trial", "{:>11.2f}s", "a writer's writes for one finished trial"),
    ("span", "{:>11.2f}s", "first write to last"),
)


def parse(argv: list[str] | None):
    """The arguments, or one ``error:`` line and exit status 2."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--writers", type=int, default=3, help="driver processes writing at once")
    ap.add_argument("--trials", type=int, default=20, help="trials each writer records")
    ap.add_argument("--steps", type=int, default=20, help="reports per trial (11 step metrics each)")
    ap.add_argument("--pg-workers", type=int, default=4, help="the PostgreSQL-backed server's workers")
    ap.add_argument("--stores", default=",".join(STORES), help=f"comma-separated, of {', '.join(STORES)}")
    args = ap.parse_args(argv)
    problem = None
    if min(args.writers, args.trials, args.steps, args.pg_workers) < 1:
        problem = "--writers, --trials, --steps and --pg-workers must be >= 1"
    from pg_server import stores_problem

    stores, problem = stores_problem(args.stores, STORES, problem)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        raise SystemExit(2)
    args.stores = stores
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark (module docstring); prints the table."""
    args = parse(argv)
    results = {}
    for store in args.stores:
        with tempfile.TemporaryDirectory() as tmp:
            results[store] = measure(store, Path(tmp), args)
        print(f"measured {store}: every trial recorded exactly once", flush=True)
    print(f"{args.writers} writers × {args.trials} trials × {args.steps} reports")
    print(f"{'':10}" + "".join(f"{s:>12}" for s in args.stores))
    for key, fmt, what in ROWS:
        scale = 1000 if fmt.endswith("ms") else 1
        print(f"{key:10}" + "".join(fmt.format(scale * results[s][key]) for s in args.stores) + f"   {what}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
