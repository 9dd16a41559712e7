"""The driver at scale: raystudy's grid against Ray Tune with Ray's stock MLflow callback and bare
Tune, on the same rehearsal trials, side by side in one run.

    python benchmarks/bench_scale.py                          # N = 100, 1,275, 10,000 (hours on 2 cores)
    python benchmarks/bench_scale.py --trials 100             # one size (minutes)
    python benchmarks/bench_scale.py --trials 13 --datasets 1 --seconds 0.5 --concurrency 4   # toy size (the test's)

Every variant runs the same trials: the demo grid's schedule (120 steps, a step report every 20
and an evaluation every 20, so 7 results a trial reach Tune) with as many seeds as make about N
trials, each trial ``raystudy.train.rehearsal.rehearse_trial`` lasting ``--seconds`` on a local Ray
of ``--concurrency`` logical CPUs (the trials sleep; a 2-core machine holds many at once). Each
variant is a process of its own with a Ray of its own:

    raystudy  ``python -m raystudy.grid --rehearse SECONDS`` (lock, Tune, raystudy's MLflow
              callback, checkpoints, console) into a SQLite store
    raystudy_pg  the same grid through a tracking server on PostgreSQL, as a cluster's head runs it
              (``mlflow server`` with 4 workers; the driver reads what is done from the database,
              ``RAYSTUDY_TRACKING_STORE``); the server's CPU is not in the driver's figures
    stock     a Tuner over the same trial dicts and trainable, ``reuse_actors=True``, with
              ``ray.air.integrations.mlflow.MLflowLoggerCallback`` into a SQLite store: what a
              user would otherwise write (it logs each result's numbers; the step reports that
              travel in a result's ``history`` list it skips, so it records less per trial)
    bare      the same Tuner with no callback

Printed per N: wall seconds and their ratio to the minimum (N x SECONDS / CONCURRENCY) and to each
other; the driver's CPU seconds per trial (the driver process alone, and with the Ray processes it
started: GCS, raylet, workers); the driver's peak and final RSS (raystudy's also after 1,000
finished trials, where N > 1,000, and after all N, before its closing ranking); the store's size per trial;
the worker processes each variant's Ray started a trial (``worker-*.out`` in its session's logs); the
pace, N x SECONDS trial-seconds completed a wall second (``bench_search.py``'s figure beside it); and,
on raystudy's store, what a resumed grid reads to know what is done (``query.known_statuses``),
the report's load (``analysis.load.from_mlflow``), the report itself (``python -m raystudy report
--no-figures``, a process of its own) and the MLflow runs page's query (one page of
100 runs, newest first). ``--profile`` adds py-spy's top frames of raystudy's driver.

``--kill-at F[,F2,...]`` adds, after the side-by-side runs (``--variants ""``: instead of them),
raystudy's grid once more in a fresh store, on a Ray that outlives its driver (as a cluster's does;
``--address``): the driver is SIGKILLed once ``F`` of the trials have finished, the same command
started again, SIGKILLed again at ``F2``, and so on; the last runs to the end. Printed: the first
driver's trials a second and its RSS after 1,000 trials and when it was killed (one process over
most of the grid); for each start after a kill, the seconds to its first new trial (a run opened
after it) and to its first recorded report; whether the store then holds every trial once,
finished, nothing RUNNING, no metric step twice; and the store's waits, as for raystudy's variant.
``--kill-store postgresql`` runs that grid through the head's tracking server on PostgreSQL (as
``raystudy_pg``) instead of into SQLite.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
PER_CELL = 13  # demo grid trials of one seed on one dataset: 6 conditions x 2 lrs + the linear probe
VARIANTS = ("raystudy", "stock", "bare", "raystudy_pg")
# The driver's frames a profile is summed under: raystudy's callbacks and what they call.
WHERE = (
    "raystudy/driver/records",
    "raystudy/driver/backlog",
    "raystudy/tracking/",
    "raystudy/driver/console",
    "mlflow/store/tracking",
    "tune/execution/tune_controller.py",
    "tune/execution/experiment_state",
)


def space_file(n: int, folder: Path, datasets: int = 4) -> tuple[Path, int]:
    """The demo space on its first ``datasets`` datasets with as many seeds as make at least ``n``
    trials; (its file, its trials)."""
    space = yaml.safe_load((ROOT / "search_spaces" / "demo.yaml").read_text())
    space["datasets"] = dict(list(space["datasets"].items())[:datasets])
    per_seed = PER_CELL * len(space["datasets"])
    seeds = max(1, math.ceil(n / per_seed))
    space["study"] = f"scale{n}"
    space["grid"]["seed"] = {"grid_search": list(range(seeds))}
    space["base"]["probe_pairs"] = 0
    path = folder / f"scale{n}.yaml"
    path.write_text(yaml.safe_dump(space, sort_keys=False))
    return path, seeds * per_seed


def grid_args(space: Path, work: Path, seconds: float, concurrency: int, quiet: bool = True) -> list[str]:
    """``raystudy grid``'s flags for the rehearsal of ``space`` in ``work``; not ``quiet``: its
    console as a user sees it (above 200 trials, a status line at each 1% done)."""
    return [
        "--space", str(space), "--rehearse", str(seconds), "--num-cpus", str(concurrency),
        "--max-concurrent", str(concurrency), "--ray-temp-dir", str(work / "ray"), *(["--quiet"] if quiet else []),
        "--tracking-uri", f"sqlite:///{work / 'mlflow.db'}", "--storage", str(work / "runs"),
    ]  # fmt: skip


def tune_variant(space: Path, work: Path, seconds: float, concurrency: int, stock: bool) -> None:
    """The stock or bare Tuner over the trials raystudy's grid would run (this process is the driver)."""
    import ray
    from ray import tune

    from raystudy.commands import grid
    from raystudy.train import rehearsal

    job = grid.prepare(grid.build_parser().parse_args(grid_args(space, work, seconds, concurrency)))
    ray.init(num_cpus=concurrency, include_dashboard=False, _temp_dir=str(work / "ray"), log_to_driver=False)
    callbacks = []
    if stock:
        from ray.air.integrations.mlflow import MLflowLoggerCallback

        callbacks.append(
            MLflowLoggerCallback(
                tracking_uri=f"sqlite:///{work / 'mlflow.db'}", experiment_name="stock", save_artifact=False
            )
        )
    trainable = rehearsal.tune_trainable()
    tuner = tune.Tuner(
        trainable,
        param_space={
            "rehearse_s": seconds,
            "checkpoint_every_s": 60,
            "trial": tune.grid_search([t.as_dict() for t in job.trials]),
        },
        tune_config=tune.TuneConfig(reuse_actors=True, max_concurrent_trials=concurrency),
        run_config=tune.RunConfig(name="scale", storage_path=str(work / "runs"), verbose=0, callbacks=callbacks),
    )
    results = tuner.fit()
    print(json.dumps({"trials": len(results), "errors": len(results.errors)}), flush=True)
    ray.shutdown()


def watch(
    cmd: list[str], env: dict, log: Path, profile: Path | None = None, db: Path | str | None = None, n: int = 0
) -> dict:
    """Run ``cmd``, sampling the driver's RSS and CPU (alone and with its process tree) twice a
    second; with raystudy's store ``db``, also its RSS and peak RSS (VmHWM) once 1,000, half and
    all ``n`` trials have finished (before the grid's closing summary, which loads the runs for its
    ranking): the slope from half to all is what a grid twice the size would add."""
    import psutil

    if profile is not None:
        cmd = ["py-spy", "record", "-o", str(profile), "-f", "raw", "-r", "50", "--nonblocking", "--", *cmd]
    t0 = time.perf_counter()
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        lines: list[tuple[float, str]] = []  # (seconds since the start, line): the console's timing
        reader = threading.Thread(target=_stamp, args=(proc.stdout, out, t0, lines), daemon=True)
        reader.start()
        top = psutil.Process(proc.pid)
        driver, peak, rss, cpu, tree, at, polls = None, 0, 0, 0.0, {}, {}, 0
        marks = {1000, n // 2, n}
        while proc.poll() is None:
            polls += 1
            if db is not None and len(at) < len(marks) and polls % 4 == 0 and rss:
                done = _store_query(db, FINISHED_SQL) or 0
                for mark in marks:
                    if done >= mark and mark not in at:
                        at[mark] = (rss, _hwm(driver.pid) if driver is not None else 0)
            try:
                if driver is None:  # under py-spy the driver is its child
                    driver = top if profile is None else next(iter(top.children()), None)
                if driver is not None:
                    rss = driver.memory_info().rss or rss  # a process exiting reads 0
                    peak = max(peak, rss)
                    c = driver.cpu_times()
                    cpu = c.user + c.system
                    for p in driver.children(recursive=True):
                        c = p.cpu_times()
                        tree[p.pid] = c.user + c.system
            except psutil.Error:
                pass
            time.sleep(0.5)
        wall = time.perf_counter() - t0
        reader.join(timeout=30)
    if proc.returncode != 0:
        sys.exit(f"bench_scale: {cmd[:4]} exited {proc.returncode}; see {log}")
    out = {"wall": wall, "cpu": cpu, "tree_cpu": cpu + sum(tree.values()), "peak": peak, "rss": rss}
    out |= {f"rss_at_{mark}": v for mark, (v, _) in at.items()}
    return out | {f"hwm_at_{mark}": v for mark, (_, v) in at.items()} | eta_at_half(lines)


def _stamp(stream, out, t0: float, lines: list) -> None:
    """Each line of ``stream`` into ``out`` and ``lines``, with the seconds since ``t0`` it came at."""
    for line in stream:
        t = time.perf_counter() - t0
        lines.append((t, line.rstrip("\n")))
        out.write(f"{t:9.1f}  {line}")
    out.flush()


STATUS = re.compile(r"^\[\s*(\d+)/(\d+)\] \d+% done.*\| .*?(?:ETA (.+))?$")


def eta_at_half(lines: list[tuple[float, str]]) -> dict:
    """From a large grid's status lines: the ETA its first line at half-way or more gave, and the
    time the grid then took to its last status line (all done); {} without them."""
    status = [(t, m) for t, line in lines if (m := STATUS.match(line))]
    half = next(((t, m) for t, m in status if 2 * int(m[1]) >= int(m[2]) and m[3]), None)
    if half is None or int(status[-1][1][1]) != int(status[-1][1][2]):
        return {}
    t, m = half
    return {"eta_at": int(m[1]), "eta_s": _seconds(m[3]), "eta_real_s": status[-1][0] - t}


def _seconds(text: str) -> float:
    """``console.seconds``' ``13 s``, ``4 min 05 s``, ``2 h 07 min`` read back."""
    units = {"h": 3600, "min": 60, "s": 1}
    words = text.split()
    return float(sum(int(n) * units[u] for n, u in zip(words[::2], words[1::2], strict=True)))


def store_waits(work: Path, experiment: str, uri: str | None = None) -> dict:
    """On a finished grid's store (``uri``; default ``work``'s SQLite file): what is done, the
    report's load, the report, one runs page (seconds)."""
    from raystudy.tracking import connect, query

    uri = uri or f"sqlite:///{work / 'mlflow.db'}"
    out = {}
    t = time.perf_counter()
    query.known_statuses(uri, experiment)  # a resumed grid's first read: MLflow's client made, the store opened
    out["done_cold_s"] = time.perf_counter() - t
    t = time.perf_counter()
    done = query.known_statuses(uri, experiment)
    out["done_s"], out["done_n"] = time.perf_counter() - t, len(done)
    from analysis import load

    t = time.perf_counter()
    frame = load.from_mlflow(experiment, uri)
    out["load_s"], out["load_n"] = time.perf_counter() - t, len(frame)
    t = time.perf_counter()
    report = [sys.executable, "-m", "raystudy", "report", "--experiment", experiment, "--tracking-uri", uri]
    report += ["--no-figures", "--out", str(work / "report")]
    subprocess.run(report, cwd=ROOT, check=True, capture_output=True)
    out["report_s"] = time.perf_counter() - t
    cl = connect.client(uri)
    exp_id = cl.get_experiment_by_name(experiment).experiment_id
    t = time.perf_counter()
    cl.search_runs([exp_id], max_results=100, order_by=["attributes.start_time DESC"])
    out["page_s"] = time.perf_counter() - t
    return out


def _store_query(db: Path | str, sql: str, *args):
    """One value of ``sql`` (``?`` its arguments) on the store ``db``, a SQLite file read only or a
    database URI; None until it exists or answers."""
    if isinstance(db, str):
        import sqlalchemy

        for i in range(len(args)):
            sql = sql.replace("?", f":a{i}", 1)
        try:
            engine = _engines.get(db) or _engines.setdefault(db, sqlalchemy.create_engine(db))
            with engine.connect() as c:
                return c.execute(sqlalchemy.text(sql), {f"a{i}": a for i, a in enumerate(args)}).scalar()
        except sqlalchemy.exc.SQLAlchemyError:
            return None
    import sqlite3

    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1) as c:
            return c.execute(sql, args).fetchone()[0]
    except sqlite3.Error:
        return None


_engines: dict = {}  # one SQLAlchemy engine a database, polled twice a second


TRIALS = "(select run_uuid from tags where key = 'raystudy.role' and value = 'trial')"
FINISHED_SQL = (
    f"select count(*) from tags where key = 'raystudy.status' and value = 'finished' and run_uuid in {TRIALS}"
)
KEYS_SQL = f"select count(distinct value) from tags where key = 'raystudy.key' and run_uuid in {TRIALS}"


# A Ray that outlives the drivers joining it, as a cluster's does: started, its address printed,
# shut down when stdin closes.
HOLD_RAY = """
import sys, ray
ray.init(num_cpus=int(sys.argv[1]), _temp_dir=sys.argv[2], include_dashboard=False, log_to_driver=False)
print(ray.get_runtime_context().gcs_address, flush=True)
sys.stdin.read()
"""


def killed_and_resumed(space: Path, env: dict, work: Path, n: int, args, head: tuple[str, str] | None = None) -> dict:
    """raystudy's grid on a Ray of its own (``HOLD_RAY``), its driver SIGKILLed at each fraction of
    ``--kill-at`` done and started again (``_kill_and_resume``); into ``work``'s SQLite store, or
    through ``head``'s tracking server (its database, its URI: ``a_head``)."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_RAY, str(args.concurrency), str(work / "ray")],
        env=env, text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    try:
        address = holder.stdout.readline().strip()
        flags = grid_args(space, work, args.seconds, args.concurrency)
        for flag in ("--num-cpus", "--ray-temp-dir"):  # the Ray's own, not the driver's
            i = flags.index(flag)
            del flags[i : i + 2]
        db: Path | str = work / "mlflow.db"
        if head is not None:
            db, flags[flags.index("--tracking-uri") + 1] = head
            env = env | {"RAYSTUDY_TRACKING_STORE": db}  # what is done read from the database, as on a head
        cmd = [sys.executable, "-m", "raystudy.grid", *flags, "--address", address]
        return _kill_and_resume(cmd, env, work, db, n, args.kill_at)
    finally:
        holder.stdin.close()
        try:
            holder.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(holder.pid, 9)


def _kill_and_resume(cmd: list[str], env: dict, work: Path, db: Path | str, n: int, fractions: list[float]) -> dict:
    """``killed_and_resumed``'s measurement, on a Ray ``cmd`` joins, its store ``db`` (a SQLite
    file or a database URI): the grid started, SIGKILLed once each fraction of its ``n`` trials has
    finished and started again; the last start runs to the end."""
    out: dict = {"restarts": []}
    for i, at in enumerate([*fractions, None]):
        t0, start_ms, since = time.perf_counter(), int(time.time() * 1000), _store_query(db, FINISHED_SQL) or 0
        restart = {"at": since} if i else None
        rss: dict[int, int] = {}
        with (work / f"driver{i}.log").open("w") as log:
            proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
            while proc.poll() is None:
                done = _store_query(db, FINISHED_SQL) or 0
                if restart is not None:
                    _first_new(db, restart, start_ms, time.perf_counter() - t0)
                if i == 0 and 1000 not in rss and done >= 1000:
                    rss[1000] = _rss(proc.pid)
                if at is not None and done >= at * n:
                    break
                time.sleep(0.2 if restart is not None and len(restart) < 3 else 0.5)
            if restart is not None:  # a rerun with a few trials left can open them and end between two polls
                _first_new(db, restart, start_ms, time.perf_counter() - t0)
            if at is not None:
                if proc.poll() is not None:
                    sys.exit(f"bench_scale: the grid ended before {at:g} of its trials finished; see {log.name}")
                if i == 0:
                    out.update(first_s=time.perf_counter() - t0, first_done=done, rss_at=rss, killed_rss=_rss(proc.pid))
                proc.kill()
            proc.wait()
        if at is None and proc.returncode != 0:
            sys.exit(f"bench_scale: the resumed grid exited {proc.returncode}; see {work / f'driver{i}.log'}")
        if restart is not None:
            out["restarts"].append(restart | {"seconds": time.perf_counter() - t0})
    return out | once(db if isinstance(db, str) else f"sqlite:///{db}", n)


def once(store: str, n: int) -> dict:
    """The exactly-once counts of the store's trial runs and the checker's anomalies (``benchmarks/checker.py``)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import checker

    runs = checker.trial_runs(store)
    c = checker.counts(runs)
    return {
        "runs": c["runs"],
        "keys": c["keys"],
        "finished": sum(r["status"] == "finished" for r in runs),
        "running": c["running"],
        "steps_twice": len(checker.steps_twice(store, [r["run"] for r in runs])),
        "anomalies": [str(a) for a in checker.check(store, expected=n)],
    }


def _first_new(db: Path, restart: dict, start_ms: int, elapsed: float) -> None:
    """Into ``restart``: the seconds to the first run opened and the first metric logged since ``start_ms``."""
    if "first_run_s" not in restart and _store_query(db, "select count(*) from runs where start_time > ?", start_ms):
        restart["first_run_s"] = elapsed
    if "first_report_s" not in restart and _store_query(
        db, "select count(*) from metrics where timestamp > ?", start_ms
    ):
        restart["first_report_s"] = elapsed


def _rss(pid: int) -> int:
    import psutil

    try:
        return psutil.Process(pid).memory_info().rss
    except psutil.Error:
        return 0


def _hwm(pid: int) -> int:
    """The process's peak RSS so far (VmHWM), in bytes; 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM"))
    except (OSError, StopIteration):
        return 0


def top_frames(profile: Path, k: int = 12) -> list[str]:
    """py-spy's raw profile: the share of samples under the raystudy frames that weigh most."""
    from collections import Counter

    total, under = 0, Counter()
    for line in profile.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not n.isdigit():
            continue
        total += int(n)
        for f in {f for f in stack.split(";") if any(m in f for m in WHERE)}:
            under[f] += int(n)
    return [f"{100 * v / total:5.1f}%  {f}" for f, v in under.most_common(k)]


def one_size(n: int, args, folder: Path) -> dict:
    from raystudy.driver import local_ray

    space, real_n = space_file(n, folder, args.datasets)
    env = {
        **os.environ,
        "RAY_AUTH_MODE": "disabled",
        # Tune's own result files (JSON, CSV, TensorBoard) off in every variant, as raystudy's grid
        # has them: what differs is the MLflow callback alone.
        "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "1",
        "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
    }
    row = {"n": real_n}
    for v in args.variants:
        work = folder / f"{v}{n}"
        work.mkdir()
        print(f"  N={real_n} {v}: running", flush=True)
        if v == "raystudy_pg":
            row[v] = through_a_server(space, env, work, n, real_n, args)
            continue
        if v == "raystudy":
            flags = grid_args(space, work, args.seconds, args.concurrency, quiet=False)
            cmd = [sys.executable, "-m", "raystudy.grid", *flags]
        else:
            cmd = [sys.executable, __file__, "--variant", v, "--space", str(space), "--work", str(work)]
            cmd += ["--seconds", str(args.seconds), "--concurrency", str(args.concurrency)]
        prof = work / "profile.txt" if args.profile and v == "raystudy" else None
        row[v] = watch(cmd, env, work / "driver.log", prof, work / "mlflow.db" if v == "raystudy" else None, real_n)
        db = work / "mlflow.db"
        row[v]["store"] = db.stat().st_size if db.is_file() else 0
        if v == "raystudy":
            row[v].update(store_waits(work, f"raystudy-scale{n}-vit_demo-rehearsal"))
            if prof is not None and prof.is_file():
                row[v]["profile"] = top_frames(prof)
        row[v]["workers"] = local_ray.worker_processes(work / "ray")
        shutil.rmtree(work / "ray", ignore_errors=True)
    if args.kill_at:
        work = folder / f"killed{n}"
        work.mkdir()
        at = ", ".join(f"{f:g}" for f in args.kill_at)
        print(f"  N={real_n} raystudy ({args.kill_store}), killed at {at} and resumed: running", flush=True)
        if args.kill_store == "sqlite":
            row["killed"] = killed_and_resumed(space, env, work, real_n, args)
            row["killed"].update(store_waits(work, f"raystudy-scale{n}-vit_demo-rehearsal"))
        else:
            with a_head(work) as (db, uri):
                row["killed"] = killed_and_resumed(space, env, work, real_n, args, (db, uri))
                row["killed"].update(_head_waits(work, n, db, uri))
        row["killed"]["store_kind"] = args.kill_store
        row["killed"]["workers"] = local_ray.worker_processes(work / "ray")
        shutil.rmtree(work / "ray", ignore_errors=True)
    return row


@contextlib.contextmanager
def a_head(work: Path):
    """``mlflow server`` (4 workers) on a PostgreSQL of its own, as a cluster's head runs them;
    yields (the database's URI, the server's URI)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_writers import serve, stop
    from pg_server import postgres

    # PostgreSQL's own folder where its user reaches it (it runs as postgres, the bench as root)
    with tempfile.TemporaryDirectory(prefix="rspg") as pg, postgres(Path(pg)) as db:
        server, uri = serve(db, 4, work)
        try:
            yield db, uri
        finally:
            stop(server)
            engine = _engines.pop(db, None)
            if engine is not None:
                engine.dispose()


def _head_waits(work: Path, n: int, db: str, uri: str) -> dict:
    """``store_waits`` through the head's server, what is done read from its database as on the
    head; and the database's size."""
    out = {"store": _store_query(db, "select pg_database_size('mlflow')") or 0}
    os.environ["RAYSTUDY_TRACKING_STORE"] = db
    try:
        return out | store_waits(work, f"raystudy-scale{n}-vit_demo-rehearsal", uri)
    finally:
        del os.environ["RAYSTUDY_TRACKING_STORE"]


def through_a_server(space: Path, env: dict, work: Path, n: int, real_n: int, args) -> dict:
    """raystudy's grid through the head's server (``a_head``); its figures as ``watch`` and
    ``store_waits`` give them."""
    with a_head(work) as (db, uri):
        flags = grid_args(space, work, args.seconds, args.concurrency, quiet=False)
        flags[flags.index("--tracking-uri") + 1] = uri
        cmd = [sys.executable, "-m", "raystudy.grid", *flags]
        out = watch(cmd, env | {"RAYSTUDY_TRACKING_STORE": db}, work / "driver.log", None, db, real_n)
        out.update(_head_waits(work, n, db, uri))
    shutil.rmtree(work / "ray", ignore_errors=True)
    return out


def show(row: dict, args) -> None:
    n = row["n"]
    least = n * args.seconds / args.concurrency
    print(f"\nN = {n:,} trials of {args.seconds:g} s, {args.concurrency} at once: the minimum is {least:.1f} s")
    cols = ("wall s", 9), ("x min", 8), ("trials/s", 10), ("drv CPU s/trial", 17), ("+Ray CPU s/trial", 18)
    cols += ("peak MB", 9), ("final MB", 9), ("store kB/trial", 15), ("workers/trial", 14)
    print(" " * 10 + "".join(f"{c:>{w}}" for c, w in cols))
    for v in args.variants:
        r = row[v]
        workers = f"{r['workers'] / n:14.3f}" if "workers" in r else f"{'-':>14}"  # raystudy_pg: not counted
        print(
            f"{v:10}{r['wall']:9.1f}{r['wall'] / least:8.1f}{n / r['wall']:10.2f}{r['cpu'] / n:17.3f}"
            f"{r['tree_cpu'] / n:18.3f}{r['peak'] / 2**20:9.0f}{r['rss'] / 2**20:9.0f}{r['store'] / 1024 / n:15.1f}"
            f"{workers}"
        )
    print(
        f"  pace (trial-seconds completed a wall second, {args.concurrency} at once): "
        + ", ".join(f"{v} {n * args.seconds / row[v]['wall']:.2f}" for v in args.variants)
    )
    names = args.variants
    for a, b in ((x, y) for i, x in enumerate(names) for y in names[i + 1 :]):
        print(f"  wall {a} / {b}: {row[a]['wall'] / row[b]['wall']:.2f}x")
    for v in ("raystudy", "raystudy_pg"):
        _show_store(v, row.get(v), n)
    k = row.get("killed")
    if k:
        _show_killed(k, n)


def _show_store(v: str, r: dict | None, n: int) -> None:
    if r and "done_s" in r:
        print(
            f"  {v}'s store: what is done {r['done_s']:.2f} s ({r['done_n']} runs; "
            f"{r['done_cold_s']:.2f} s as a process's first read), "
            f"the report's load {r['load_s']:.2f} s ({r['load_n']} rows), the report (--no-figures, "
            f"a process) {r['report_s']:.1f} s, a runs page {r['page_s']:.3f} s"
        )
        if "rss_at_1000" in r and f"rss_at_{n}" in r:
            a, b = r["rss_at_1000"] / 2**20, r[f"rss_at_{n}"] / 2**20
            print(
                f"  {v}'s driver RSS: {a:.0f} MB after 1,000 trials finished, {b:.0f} MB after all "
                f"{n:,} ({b - a:+.0f} MB), {r['rss'] / 2**20:.0f} MB at the end, after the closing ranking"
            )
        half = n // 2
        if f"rss_at_{half}" in r and f"rss_at_{n}" in r and half >= 1000:
            slope = (r[f"rss_at_{n}"] - r[f"rss_at_{half}"]) / 1024 / (n - half)
            hwm = (r[f"hwm_at_{n}"] - r[f"hwm_at_{half}"]) / 1024 / (n - half)
            print(
                f"  {v}'s driver RSS from {half:,} to {n:,} trials: {r[f'rss_at_{half}'] / 2**20:.0f} -> "
                f"{r[f'rss_at_{n}'] / 2**20:.0f} MB, {slope:+.1f} kB a trial; peak (VmHWM) "
                f"{r[f'hwm_at_{half}'] / 2**20:.0f} -> {r[f'hwm_at_{n}'] / 2**20:.0f} MB, {hwm:+.1f} kB a trial"
            )
        if "eta_s" in r:
            print(
                f"  {v}'s console: at {r['eta_at']:,} of {n:,} done its ETA said {r['eta_s']:.0f} s; the rest took "
                f"{r['eta_real_s']:.0f} s ({r['eta_s'] / r['eta_real_s']:.2f}x)"
            )
        for line in r.get("profile", []):
            print("   ", line)


def _show_killed(k: dict, n: int) -> None:
    def s(v):
        return "never" if v is None else f"{v:.1f} s"

    mb = 2**20
    rss = k["rss_at"].get("1000") or k["rss_at"].get(1000)  # a key read back from JSON is a string
    print(
        f"  raystudy killed and resumed ({k.get('store_kind', 'sqlite')}): its first driver ran "
        f"{k['first_done']:,} trials in {k['first_s']:.1f} s "
        f"({k['first_done'] / k['first_s']:.2f} trials/s); its RSS "
        + (f"{rss / mb:.0f} MB after 1,000 trials, " if rss else "")
        + f"{k['killed_rss'] / mb:.0f} MB at its kill"
    )
    for r in k["restarts"]:
        print(
            f"  SIGKILLed at {r['at']:,} finished, the same command again: its first new trial "
            f"{s(r.get('first_run_s'))} after its start, its first report recorded {s(r.get('first_report_s'))}, "
            f"until the next kill or the end {r['seconds']:.1f} s"
        )
    print(
        f"  the store: {k['runs']:,} trial runs, {k['keys']:,} keys, {k['finished']:,} finished, "
        f"{k['running']} RUNNING, {k['steps_twice']} metric steps twice; what is done {k['done_s']:.2f} s "
        f"({k['done_cold_s']:.2f} s cold), the report's load {k['load_s']:.2f} s, the report {k['report_s']:.1f} s, "
        f"a runs page {k['page_s']:.3f} s (of {n:,})"
    )
    print(f"  its Ray's worker processes: {k['workers']:,} ({k['workers'] / n:.3f} a trial)")
    found = k.get("anomalies", [])
    print(f"  the checker: {len(found)} anomalies" + "".join(f"\n    {a}" for a in found[:20]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", default="100,1275,10000", help="comma-separated sizes N")
    ap.add_argument("--seconds", type=float, default=2.0, help="seconds of one rehearsal trial")
    ap.add_argument("--concurrency", type=int, default=16, help="trials at once (logical CPUs of the local Ray)")
    ap.add_argument("--variants", default="raystudy,stock,bare", help=f"comma-separated of {', '.join(VARIANTS)}")
    ap.add_argument("--datasets", type=int, default=4, choices=range(1, 5), help="of the demo grid's four")
    ap.add_argument("--profile", action="store_true", help="py-spy's top frames of raystudy's driver")
    ap.add_argument(
        "--kill-at",
        default="",
        help="also: raystudy's grid SIGKILLed at each of these fractions done (F,F2,...), resumed",
    )
    ap.add_argument(
        "--kill-store",
        choices=("sqlite", "postgresql"),
        default="sqlite",
        help="the killed grid's store: SQLite, or the head's tracking server on PostgreSQL (default sqlite)",
    )
    ap.add_argument("--json", help="write the measurements here as well")
    ap.add_argument("--variant", choices=("stock", "bare"), help=argparse.SUPPRESS)
    ap.add_argument("--space", help=argparse.SUPPRESS)
    ap.add_argument("--work", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.variant:
        tune_variant(Path(args.space), Path(args.work), args.seconds, args.concurrency, args.variant == "stock")
        return 0
    try:
        args.kill_at = [float(f) for f in args.kill_at.split(",") if f]
    except ValueError:
        ap.error(f"--kill-at {args.kill_at}: comma-separated fractions of the trials done, 0 < F < 1")
    if any(not 0 < f < 1 for f in args.kill_at) or args.kill_at != sorted(set(args.kill_at)):
        ap.error(f"--kill-at {args.kill_at}: increasing fractions of the trials done, each 0 < F < 1")
    args.variants = [v for v in args.variants.split(",") if v]
    if bad := set(args.variants) - set(VARIANTS):
        ap.error(f"--variants: {', '.join(sorted(bad))} unknown; allowed: {', '.join(VARIANTS)}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as d:
        for n in (int(x) for x in args.trials.split(",")):
            rows.append(one_size(n, args, Path(d)))
            show(rows[-1], args)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
