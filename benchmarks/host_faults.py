"""Faults only a cluster has, on test hosts: the demo grid run on a head and two worker hosts while
one worker host is cut off from the others for a while (then plugged back in) or lost (every
process on it killed), and what the study recorded checked afterwards.

    python benchmarks/host_faults.py --fault cut --seconds 60    # cut h2 off for 60 s, then heal
    python benchmarks/host_faults.py --fault lost                # kill everything on h2

Root only (network namespaces, cluster/hosts.py). The head (h1) has no CPUs for trials, each
worker host one; the grid runs on the head with its store and checkpoints in the hosts' shared
folder. The fault comes once the first trial has finished. Printed: the fault, the trials, whether
each was recorded exactly once and finished, metric steps recorded twice, runs left RUNNING, trials
retried, the seconds from the fault's end (the heal, or the kill) to the next trial finished, and
the grid's wall time. The same command a second time over the same folder would resume it; here
one run must complete the study.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def hosts_module():
    spec = importlib.util.spec_from_file_location("hosts", ROOT / "cluster" / "hosts.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def space(steps: int) -> dict:
    """The demo on one dataset: 4 conditions x 2 seeds, retried once when they fail."""
    return {
        "study": "faults",
        "base": {"model": "vit_demo", "steps": steps, "warmup_steps": 4, "eval_every": 20, "log_every": 10},
        "grid": {
            "condition": {"grid_search": ["MHA", "LN1", "FC1", "FC2"]},
            "lr": 0.1,
            "seed": {"grid_search": [0, 1]},
        },
        "datasets": {"digits_c": {}},
        "tune": {"max_failures": 2, "checkpoint_every_s": 0},
    }


def store_facts(db: Path) -> dict:
    """What the store says of the grid's trials."""
    with sqlite3.connect(db) as con:
        trials = con.execute(
            "SELECT r.run_uuid, r.status, r.end_time FROM runs r JOIN tags t ON t.run_uuid = r.run_uuid "
            "WHERE t.key = 'raystudy.role' AND t.value = 'trial' AND r.lifecycle_stage = 'active'"
        ).fetchall()
        ids = [t[0] for t in trials]
        marks = ",".join("?" * len(ids))
        keys = con.execute(f"SELECT value FROM tags WHERE key = 'raystudy.key' AND run_uuid IN ({marks})", ids)
        status = con.execute(f"SELECT value FROM tags WHERE key = 'raystudy.status' AND run_uuid IN ({marks})", ids)
        attempts = con.execute(f"SELECT value FROM tags WHERE key = 'raystudy.attempts' AND run_uuid IN ({marks})", ids)
        twice = con.execute(
            f"SELECT COUNT(*) FROM (SELECT run_uuid, key, step FROM metrics WHERE run_uuid IN ({marks}) "
            "GROUP BY run_uuid, key, step HAVING COUNT(*) > 1)",
            ids,
        ).fetchone()[0]
    return {
        "runs": len(trials),
        "keys": len({k for (k,) in keys}),
        "finished": sum(v == "finished" for (v,) in status),
        "running": sum(t[1] == "RUNNING" for t in trials),
        "retried": sum(int(v) > 1 for (v,) in attempts),
        "twice": twice,
        "ends": sorted(t[2] / 1000 for t in trials if t[2]),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fault", choices=["cut", "lost"], default="cut")
    ap.add_argument("--seconds", type=float, default=60, help="how long a cut lasts (default 60)")
    ap.add_argument("--steps", type=int, default=200, help="each trial's steps (default 200)")
    ap.add_argument("--dir", type=Path, default=None, help="the hosts' folder (default: a new one under /tmp)")
    args = ap.parse_args(argv)
    hosts_py = hosts_module()
    try:
        hosts_py.check_can_make_hosts()
    except hosts_py.HostsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    from raystudy.train import pretrain

    pretrain.ensure_weights("vit_demo")  # before the clock: a first use builds them
    root = args.dir or Path(tempfile.mkdtemp(prefix="host-faults-", dir="/tmp"))
    hosts = hosts_py.Hosts(3, root, keep=[ROOT, Path(sys.prefix)]).up()
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "PYTHONUNBUFFERED": "1"}
    env.pop("RAY_ADDRESS", None)
    env.pop("MLFLOW_TRACKING_URI", None)
    try:
        hosts.sh(1, "ray start --head --node-ip-address=10.77.0.1 --port=6379 --num-cpus=0", env=env, timeout=180)
        for k in (2, 3):
            join = f"ray start --address=10.77.0.1:6379 --node-ip-address=10.77.0.{k} --num-cpus=1"
            hosts.sh(k, join, env=env, timeout=180)
        work = hosts.shared / "study"
        work.mkdir()
        (work / "space.yaml").write_text(yaml.safe_dump(space(args.steps)))
        db = work / "mlflow.db"
        cmd = [sys.executable, "-m", "raystudy.grid", "--space", "space.yaml", "--address", "10.77.0.1:6379"]
        cmd += ["--storage", str(work / "checkpoints")]
        log = open(work / "grid.log", "w")
        t0 = time.time()
        grid = hosts.popen(1, cmd, cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT)
        while not (db.exists() and store_facts(db)["finished"] >= 1):
            if grid.poll() is not None:
                print(f"the grid ended before the fault (exit {grid.returncode}): {work / 'grid.log'}")
                return 1
            time.sleep(1)
        fault_at = time.time()
        if args.fault == "cut":
            hosts.cut(2)
            time.sleep(args.seconds)
            hosts.heal(2)
        else:
            hosts.kill(2)
        healed = time.time()
        grid.wait(timeout=1800)
        wall = time.time() - t0
        facts = store_facts(db)
        after = [e for e in facts["ends"] if e > healed]
        recover = f"{after[0] - healed:.1f}" if after else "none"
        expected = 8
        once = facts["runs"] == facts["keys"] == expected and facts["finished"] == expected
        what = f"h2 cut off for {args.seconds:.0f} s" if args.fault == "cut" else "h2 lost (every process killed)"
        flags = f"--fault {args.fault} --seconds {args.seconds:g} --steps {args.steps}"
        print(f"# python benchmarks/host_faults.py {flags}")
        print(f"# {date.today()}, grid exit {grid.returncode}, the fault {fault_at - t0:.0f} s into it")
        print("| fault | trials | exactly once | steps twice | RUNNING | retried | s to the next finish | wall s |")
        print("|---|---:|---|---:|---:|---:|---:|---:|")
        print(
            f"| {what} | {facts['finished']}/{expected} finished, {facts['runs']} runs | {'yes' if once else 'NO'} "
            f"| {facts['twice']} | {facts['running']} | {facts['retried']} | {recover} | {wall:.0f} |"
        )
        return 0 if once and grid.returncode == 0 and not facts["twice"] and not facts["running"] else 1
    finally:
        hosts.down()


if __name__ == "__main__":
    sys.exit(main())
