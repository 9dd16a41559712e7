"""The extended searches at scale: raystudy's rehearsal search against Optuna alone, side by side
in one run, and a rehearsal search killed and resumed.

    python benchmarks/bench_search.py --trials 2000                       # minutes on 2 cores
    python benchmarks/bench_search.py --trials 2000 --kill-at 0.3,0.6     # and SIGKILLs at 30% and 60% done
    python benchmarks/bench_search.py --trials 24 --seconds 0.2 --concurrency 4 --kill-at 0.5   # toy size (the test's)

Both variants draw from the same space (``search_spaces/optuna/optimiser.yaml``'s parameters, one
condition, MHA) with the same sampler (``TPESampler(seed=0)``, as ``raystudy search`` makes it) into
an Optuna storage of the same kind (SQLite), and score each config on the same known landscape
(``spaces.searches.landscape``):

    raystudy     ``python -m raystudy search --rehearse SECONDS``: Ray Tune's ``OptunaSearch``, ASHA,
                 MLflow (SQLite), each trial ``train.rehearsal``'s synthetic one on a Ray of
                 ``--concurrency`` logical CPUs that outlives the driver (as a cluster's does)
    optuna       ``study.ask()``, the landscape's score, ``study.tell()``: one process, no Ray, no
                 trial time, no MLflow: what the sampler and its storage cost alone

Printed for each: the driver's CPU seconds a trial (raystudy: the driver process alone, where Tune
and the sampler run; optuna: the process) over the trials before each mark (the last tenth of the
trials up to it), and the growth from the first mark to the last, with the ratio of the two
growths; raystudy's wall seconds a trial at each mark, its RSS then (peak, VmHWM), the sizes of the
Optuna storage and the MLflow store; the worker processes its Ray started (``worker-*.out`` in the
Ray session's logs, one each) a trial; its pace, the rehearsal seconds its trials ran (ASHA stops
most at a rung) a wall second, to set beside the grid's (``bench_scale.py``: N x SECONDS / wall);
and how near each search came to the known optimum.

``--kill-at F[,F2...]`` adds raystudy's search once more in a fresh folder, its driver SIGKILLed once F of
the trials are COMPLETE in Optuna's storage, the same command run again and SIGKILLed at F2, and so
on; the last runs to the end. Printed:
trials COMPLETE in Optuna (the budget, not more), MLflow's runs of the study (each key once),
those ended, interrupted (a killed trial's run: its config is not sampled again) and RUNNING, every
COMPLETE trial's run ended (none lost), metric steps logged twice, the seconds each rerun took
to its first new trial COMPLETE, and the worker processes its Ray started.
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from raystudy.driver import local_ray  # noqa: E402

STUDY = "bench"  # the search file's study: its Optuna study is bench-vit_demo-digits_c-MHA-rehearsal
OPTUNA_NAME = f"{STUDY}-vit_demo-digits_c-MHA-rehearsal"
EXPERIMENT = f"raystudy-{STUDY}-vit_demo-rehearsal"
STEPS = 120  # a trial's schedule: ASHA's first rung at 20
# The Ray a benchmark holds and the drivers that join it: no token to hand between them.
ENV = {**os.environ, "RAY_AUTH_MODE": "disabled"}
# A Ray that outlives the drivers joining it: started, its address printed, shut down when stdin closes.
HOLD_RAY = """
import sys, ray
ray.init(num_cpus=int(sys.argv[1]), _temp_dir=sys.argv[2], include_dashboard=False, log_to_driver=False)
print(ray.get_runtime_context().gcs_address, flush=True)
sys.stdin.read()
"""


def space_file(n: int, folder: Path) -> Path:
    """The optimiser space on MHA alone, ``n`` trials, a short schedule (6 evaluations) that ASHA
    can cut at its first rung."""
    raw = yaml.safe_load((ROOT / "search_spaces" / "optuna" / "optimiser.yaml").read_text())
    raw.update(
        study=STUDY,
        conditions=["MHA"],
        budget={"num_samples": n},
        scheduler={"grace_period": 20, "reduction_factor": 3},
        test_seeds=[100],
        tune={"max_failures": 1, "threads_per_trial": 1, "checkpoint_every_s": 0},
    )
    raw["base"].update(steps=STEPS, eval_every=20, log_every=20)
    path = folder / "space.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def marks(n: int) -> list[int]:
    """Trial counts at which costs are read: 1,000 and every 1,000 past it where ``n`` reaches
    2,000, else tenths of ``n`` (the first, the middle, the last)."""
    if n >= 2000:
        return [m for m in range(1000, n + 1, 1000)] + ([n] if n % 1000 else [])
    return sorted({max(1, n // 5), n // 2, n})


def window(n: int) -> int:
    """The trials each mark's cost is the mean over: the tenth of the trials before it."""
    return max(2, min(n // 10, 500))


def _sql(db: Path, query: str, *args):
    if not db.is_file():
        return None
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30) as c:
            return c.execute(query, args).fetchall()
    except sqlite3.OperationalError:  # created, its tables not yet
        return None


def complete_times(optuna_db: Path, study: str) -> list[float]:
    """The wall-clock times (epoch seconds) at which the study's trials became COMPLETE, in order."""
    rows = _sql(
        optuna_db,
        "select t.datetime_complete from trials t join studies s on s.study_id = t.study_id "
        "where s.study_name = ? and t.state = 'COMPLETE' order by t.datetime_complete",
        study,
    )
    return [datetime.fromisoformat(r[0]).timestamp() for r in rows or []]


def _complete(optuna_db: Path) -> int:
    rows = _sql(optuna_db, "select count(*) from trials where state = 'COMPLETE'")
    return rows[0][0] if rows else 0


def per_trial(samples: list[tuple[float, float]], done_at: list[float], n: int) -> dict[int, float]:
    """Seconds of the sampled quantity a trial at each mark: ``samples`` are (time, cumulative value)
    pairs, ``done_at`` the time each trial ended; over the ``window`` of trials before the mark."""

    times = [s for s, _ in samples]

    def value_at(t: float) -> float:
        """The sampled value at ``t``, linear between the samples either side (trials end faster
        than the samples come at toy size)."""
        i = bisect.bisect_right(times, t)
        if i == 0 or i == len(samples):
            return samples[max(i - 1, 0)][1]
        (t0, v0), (t1, v1) = samples[i - 1], samples[i]
        return v0 + (v1 - v0) * (t - t0) / (t1 - t0) if t1 > t0 else v1

    w, out = window(n), {}
    for m in marks(n):
        if m <= len(done_at) and m - w >= 1:
            out[m] = (value_at(done_at[m - 1]) - value_at(done_at[m - w - 1])) / w
    return out


def trial_seconds(mlflow_db: Path, seconds: float) -> float:
    """The rehearsal seconds the store's trials ran: each trial's last step over the schedule's
    ``STEPS``, times ``seconds`` (a rehearsal sleeps in proportion to its steps; ASHA ends most
    search trials at a rung)."""
    rows = _sql(
        mlflow_db,
        "select max(m.step) from metrics m join tags t on t.run_uuid = m.run_uuid "
        "where t.key = 'raystudy.role' and t.value = 'trial' and m.key = 'val_acc' group by m.run_uuid",
    )
    return sum(min(step, STEPS) / STEPS * seconds for (step,) in rows or [])


def rss_kb(pid: int, field: str) -> int:
    """``VmRSS`` or ``VmHWM`` (the peak) of ``pid`` in kB, from /proc."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def search_cmd(space: Path, work: Path, address: str, args) -> list[str]:
    return [
        sys.executable, "-m", "raystudy", "search", "--space", str(space), "--rehearse", str(args.seconds),
        "--storage", str(work / "runs"), "--tracking-uri", f"sqlite:///{work / 'mlflow.db'}",
        "--address", address, "--quiet",
    ]  # fmt: skip


class HeldRay:
    """``with HeldRay(cpus, folder) as address``: a local Ray of its own that outlives its drivers."""

    def __init__(self, cpus: int, folder: Path):
        self.cpus, self.folder = cpus, folder

    def __enter__(self) -> str:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", HOLD_RAY, str(self.cpus), str(self.folder)],
            text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True, env=ENV,
        )  # fmt: skip
        return self.proc.stdout.readline().strip()

    def __exit__(self, *exc) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, 9)


def run_raystudy(space: Path, work: Path, address: str, n: int, args, kill_at: float | None = None) -> dict:
    """raystudy's rehearsal search, its driver's CPU and RSS sampled twice a second; SIGKILLed
    once ``kill_at`` of the ``n`` trials are COMPLETE (then the caller starts it again)."""
    log = (work / "driver.log").open("a")
    t0, start = time.perf_counter(), time.time()
    cmd = search_cmd(space, work, address, args)
    proc = subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=log, stderr=subprocess.STDOUT)
    try:
        watched = _watch(proc, work, n, kill_at, t0)
    finally:
        if proc.poll() is None:  # the benchmark failed: its driver goes with it
            proc.kill()
            proc.wait()
        log.close()
    if kill_at is not None:
        return watched
    if proc.returncode != 0:
        sys.exit(f"bench_search: the search exited {proc.returncode}; see {work / 'driver.log'}")
    db = work / "runs" / "optuna" / "optuna.db"
    text = (work / "driver.log").read_text()
    found = [line.strip() for line in text.splitlines() if "rehearsal: known optimum" in line]
    done_at = complete_times(db, OPTUNA_NAME)
    samples = watched["samples"]
    wall = time.perf_counter() - t0
    return {
        "wall": wall,
        "pace": trial_seconds(work / "mlflow.db", args.seconds) / wall,
        "cpu": per_trial(samples, done_at, n),
        "wall_per": per_trial([(s, s - start) for s, _ in samples], done_at, n),
        "peak_kb": watched["peak_kb"],
        "optuna_mb": db.stat().st_size / 1e6,
        "mlflow_mb": (work / "mlflow.db").stat().st_size / 1e6,
        "found": found[-1] if found else "(no line)",
        "first_new_s": watched["first_new_s"],
    }


def _watch(proc, work: Path, n: int, kill_at: float | None, t0: float) -> dict:
    """``run_raystudy``'s watch of its driver ``proc`` (CPU, peak RSS, the first trial it completed),
    to its end, or SIGKILLed once ``kill_at`` of the ``n`` trials are COMPLETE."""
    import psutil

    db = work / "runs" / "optuna" / "optuna.db"
    me, cpu, peak, samples, first_new = psutil.Process(proc.pid), 0.0, 0, [], None
    already = _complete(db)
    while proc.poll() is None:
        try:
            c = me.cpu_times()
            cpu = c.user + c.system
            peak = max(peak, rss_kb(proc.pid, "VmHWM"))
        except psutil.Error:
            pass
        samples.append((time.time(), cpu))
        done = _complete(db)
        if first_new is None and done > already:
            first_new = time.perf_counter() - t0
        if kill_at is not None and done >= kill_at * n:
            proc.kill()
            proc.wait()
            return {"killed_at": done, "first_new_s": first_new}
        time.sleep(0.5)
    return {"samples": samples, "peak_kb": peak, "first_new_s": first_new}


def run_optuna(space_path: Path, work: Path, n: int) -> dict:
    """Optuna alone: the same sampler, storage kind, space and landscape; ask, score, tell."""
    import optuna

    from raystudy.driver import reconcile
    from raystudy.spaces import searches
    from raystudy.train import rehearsal

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = searches.load_search(str(space_path))
    sampler = searches.Sampler(space, "MHA", space.base, {"gpu": 0, "cpu": 1, "workers": 1})
    land = searches.landscape(space)
    (work / "optuna").mkdir(parents=True, exist_ok=True)
    study = optuna.create_study(
        study_name=OPTUNA_NAME,
        storage=optuna.storages.RDBStorage(f"sqlite:///{work / 'optuna' / 'optuna.db'}"),
        sampler=optuna.samplers.TPESampler(seed=space.seed),
        direction="maximize",
    )
    samples, done_at, t0 = [], [], time.perf_counter()
    for _ in range(n):
        t = study.ask()
        study.tell(t, rehearsal.landscape_score(land, sampler(t)["trial"]["sampled"]))
        now = time.process_time()
        samples.append((len(done_at), now))
        done_at.append(len(done_at))  # the trial's index stands for its time: one process, in order
    best = rehearsal.landscape_score(land, reconcile.drawn(sampler, study.best_trial)["sampled"])
    return {
        "wall": time.perf_counter() - t0,
        "cpu": per_trial(samples, done_at, n),
        "optuna_mb": (work / "optuna" / "optuna.db").stat().st_size / 1e6,
        "found": f"best trial {best:.3f}, known optimum {rehearsal.TOP:.3f} (regret {rehearsal.TOP - best:.3f})",
    }


def killed_and_resumed(space: Path, work: Path, n: int, args) -> dict:
    """raystudy's search SIGKILLed at ``--kill-at`` and run again to the end; what the stores then hold."""
    with HeldRay(args.concurrency, work / "ray") as address:
        starts = [run_raystudy(space, work, address, n, args, kill_at=at) for at in args.kill_at]
        starts.append(run_raystudy(space, work, address, n, args))
    optuna_db, mlflow_db = work / "runs" / "optuna" / "optuna.db", work / "mlflow.db"
    import checker

    store = f"sqlite:///{mlflow_db}"
    runs = checker.trial_runs(store, search=OPTUNA_NAME)
    c = checker.counts(runs, checker.SEARCH_ENDED)
    return {
        "killed_at": [r["killed_at"] for r in starts[:-1]],
        "workers": local_ray.worker_processes(work / "ray"),
        "complete": checker.optuna_states(optuna_db, OPTUNA_NAME).get("COMPLETE", 0),
        "runs": c["runs"],
        "keys": c["keys"],
        "ended": sum(r["status"] in ("finished", "stopped", "diverged", "failed") for r in runs),
        "interrupted": sum(r["status"] == "interrupted" for r in runs),
        "running": c["running"],
        "steps_twice": len(checker.steps_twice(store, [r["run"] for r in runs])),
        "anomalies": [str(a) for a in checker.check(store, search=OPTUNA_NAME, optuna_db=optuna_db)],
        "first_new_s": [r["first_new_s"] for r in starts[1:]],  # after each restart
        "found": starts[-1]["found"],
    }


def show(n: int, rs: dict | None, op: dict | None, args) -> None:
    when = time.strftime("%Y-%m-%d")
    print(f"\n## {n:,} trials ({args.seconds:g} s rehearsal trials, {args.concurrency} at once; {when})")
    for name, r in (("raystudy", rs), ("optuna", op)):
        if r is None:
            continue
        cpu = ", ".join(f"{m:,}: {v * 1000:.1f}" for m, v in r["cpu"].items())
        print(f"{name:<9} wall {r['wall']:.1f} s; CPU ms a trial at {cpu}; optuna.db {r['optuna_mb']:.1f} MB")
        if name == "raystudy":
            print(
                f"          worker processes {r['workers']:,} ({r['workers'] / n:.3f} a trial); pace "
                f"{r['pace']:.2f} trial-seconds completed a wall second ({args.concurrency} at once)"
            )
            wall = ", ".join(f"{m:,}: {v:.3f}" for m, v in r["wall_per"].items())
            print(f"          wall s a trial at {wall} (the trials alone: {args.seconds / args.concurrency:.3f})")
            print(f"          driver peak RSS (VmHWM) {r['peak_kb'] / 1024:.0f} MB; mlflow.db {r['mlflow_mb']:.1f} MB")
        print(f"          {r['found']}")
    if rs and op and len(rs["cpu"]) > 1 and len(op["cpu"]) > 1:
        (a, ra), (b, rb) = list(rs["cpu"].items())[0], list(rs["cpu"].items())[-1]
        oa, ob = op["cpu"][a], op["cpu"][b]
        grow, ogrow = rb - ra, ob - oa
        ratio = grow / ogrow if ogrow > 0 else float("inf")
        print(
            f"growth from {a:,} to {b:,} trials: raystudy {grow * 1000:+.1f} ms a trial, optuna alone "
            f"{ogrow * 1000:+.1f} ms a trial; ratio {ratio:.2f} (target <= 1.5)"
        )


def show_killed(k: dict, n: int) -> None:
    lost = k["complete"] - k["ended"]
    at = ", ".join(f"{c:,}" for c in k["killed_at"])
    first = ", ".join("never" if s is None else f"{s:.1f} s" for s in k["first_new_s"])
    print(
        f"killed at {at} of {n:,} COMPLETE, run again: {k['complete']:,} COMPLETE in Optuna; "
        f"MLflow {k['runs']:,} runs, {k['keys']:,} keys, {k['ended']:,} ended, {k['interrupted']} interrupted, "
        f"{k['running']} RUNNING; COMPLETE without an ended run: {max(lost, 0)}; steps twice {k['steps_twice']}; "
        f"first new trial COMPLETE after each restart: {first}; worker processes {k['workers']:,} "
        f"({k['workers'] / n:.3f} a trial)"
    )
    once = k["complete"] == n and k["keys"] == k["runs"] and k["ended"] == n and k["running"] == 0
    print(f"exactly once: {'yes' if once and not k['steps_twice'] else 'NO'}; {k['found']}")
    found = k.get("anomalies", [])
    print(f"the checker: {len(found)} anomalies" + "".join(f"\n  {a}" for a in found[:20]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--trials", type=int, default=2000, help="trials of the search (default 2,000)")
    ap.add_argument("--seconds", type=float, default=1.0, help="seconds of one rehearsal trial (default 1)")
    ap.add_argument("--concurrency", type=int, default=16, help="logical CPUs of the Ray: trials at once")
    ap.add_argument("--variants", default="raystudy,optuna", help="which side-by-side runs (default both; '' none)")
    ap.add_argument(
        "--kill-at", help="also a search SIGKILLed at each of these fractions done (F[,F2...]), then run to the end"
    )
    ap.add_argument("--keep", help="keep the work folders here")
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args(argv)
    variants = [v for v in args.variants.split(",") if v]
    bad = [v for v in variants if v not in ("raystudy", "optuna")]
    if args.trials < 10 or bad or not 0 < args.seconds <= 60 or args.concurrency < 1:
        print(
            "error: --trials >= 10, --variants from raystudy,optuna, 0 < --seconds <= 60, --concurrency >= 1",
            file=sys.stderr,
        )
        return 2
    if args.kill_at is not None:
        args.kill_at_text = args.kill_at
        try:
            args.kill_at = [float(f) for f in args.kill_at.split(",")]
        except ValueError:
            args.kill_at = []
        if not args.kill_at or any(not 0 < f < 1 for f in args.kill_at) or args.kill_at != sorted(set(args.kill_at)):
            print(
                f"error: --kill-at {args.kill_at_text}: fractions of the trials, each > 0 and < 1, rising",
                file=sys.stderr,
            )
            return 2
    base = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench_search-"))
    base.mkdir(parents=True, exist_ok=True)
    space = space_file(args.trials, base)
    print(f"bench_search: {' '.join(sys.argv)}; work in {base}", flush=True)
    rs = op = None
    if "raystudy" in variants:
        with HeldRay(args.concurrency, base / "ray") as address:
            (base / "raystudy").mkdir()
            rs = run_raystudy(space, base / "raystudy", address, args.trials, args)
        rs["workers"] = local_ray.worker_processes(base / "ray")
    if "optuna" in variants:
        op = run_optuna(space, base / "optuna", args.trials)
    show(args.trials, rs, op, args)
    killed = None
    if args.kill_at is not None:
        (base / "killed").mkdir()
        killed = killed_and_resumed(space, base / "killed", args.trials, args)
        show_killed(killed, args.trials)
    if args.json:
        Path(args.json).write_text(json.dumps({"n": args.trials, "raystudy": rs, "optuna": op, "killed": killed}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
