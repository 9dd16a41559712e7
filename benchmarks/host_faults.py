"""Faults only a cluster has, on test hosts: the demo grid run on a head and two worker hosts while
one worker host is cut off from the others for a while (then plugged back in) or lost (every
process on it killed), and what the study recorded checked afterwards.

    python benchmarks/host_faults.py --fault cut --seconds 60    # cut h2 off for 60 s, then heal
    python benchmarks/host_faults.py --fault lost                # kill everything on h2
    python benchmarks/host_faults.py --fault slurm-head          # a SLURM job's head node lost

Root only (network namespaces, cluster/hosts.py). The head (h1) has no CPUs for trials, each
worker host one; the grid runs on the head with its store and checkpoints in the hosts' shared
folder. The fault comes once the first trial has finished. Printed: the fault, the trials, whether
each was recorded exactly once and finished, metric steps recorded twice, runs left RUNNING, trials
retried, the seconds from the fault's end (the heal, or the kill) to the next trial finished, and
the grid's wall time. The same command a second time over the same folder would resume it; here
one run must complete the study.

``slurm-head``: three hosts, each a 1-CPU SLURM node (n1 on h1, which also runs slurmctld, n2, n3);
`raystudy slurm --nodes 2` with n1 drained, so the job's head (its Ray head, MLflow, the grid) is
on n2 and a Ray node on n3. Once a trial has finished, every process on h2 is killed. n1 is
resumed; the controller takes n2 for down (``RAYSTUDY_SLURMD_TIMEOUT``, 20 s here) and requeues
the job (``--requeue``), whose next run, on n1 and n3, restores the store from the shared folder's
newest snapshot and completes the study. Checked in the snapshot it ends with.
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


def report(fault: str, flags: str, t0: float, healed: float, facts: dict, expected: int, rc: int) -> bool:
    """Print the figures as a table row, with the command; whether the study is exactly once."""
    after = [e for e in facts["ends"] if e > healed]
    recover = f"{after[0] - healed:.1f}" if after else "none"
    once = facts["runs"] == facts["keys"] == expected and facts["finished"] == expected
    print(f"# python benchmarks/host_faults.py {flags}")
    print(f"# {date.today()}, exit {rc}, the fault's end {healed - t0:.0f} s in")
    print("| fault | trials | exactly once | steps twice | RUNNING | retried | s to the next finish | wall s |")
    print("|---|---:|---|---:|---:|---:|---:|---:|")
    print(
        f"| {fault} | {facts['finished']}/{expected} finished, {facts['runs']} runs | {'yes' if once else 'NO'} "
        f"| {facts['twice']} | {facts['running']} | {facts['retried']} | {recover} | {time.time() - t0:.0f} |"
    )
    return once and rc == 0 and not facts["twice"] and not facts["running"]


def slurm_head(hosts, args) -> int:
    """The ``slurm-head`` fault (the module's doc); the exit status."""
    import gzip
    import re

    folder = hosts.root / "slurm"  # on every host; munged's socket is under it: open to all
    folder.mkdir()
    for f in (hosts.root, folder):
        f.chmod(0o755)
    env = {
        **os.environ,
        "RAY_AUTH_MODE": "disabled",
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAYSTUDY_RAY_DASHBOARD": "false",
        "PYTHONPATH": str(ROOT),
        "RAYSTUDY_SLURM_NODES": "n1:h1=10.77.0.1 n2:h2=10.77.0.2 n3:h3=10.77.0.3",
        "RAYSTUDY_SLURM_CPUS": "1",
        "RAYSTUDY_SLURMD_TIMEOUT": "20",
        "SLURM_CONF": str(folder / "slurm.conf"),
    }
    for k in ("RAY_ADDRESS", "MLFLOW_TRACKING_URI"):
        env.pop(k, None)
    local_sh = str(ROOT / "cluster" / "slurm" / "local.sh")

    def on(k, *argv, timeout=120):
        return hosts.run(k, list(argv), env=env, capture_output=True, text=True, timeout=timeout)

    def job_state(job):
        fields = dict(f.split("=", 1) for f in on(1, "scontrol", "-o", "show", "job", job).stdout.split() if "=" in f)
        return fields.get("JobState", "UNKNOWN"), int(fields.get("Restarts", 0)), fields.get("Reason", "")

    try:
        for k in (1, 2, 3):
            hosts.as_node(k)
        p = on(1, "bash", local_sh, "start", str(folder))
        assert p.returncode == 0, p.stdout + p.stderr
        for k in (2, 3):
            p = on(k, "bash", local_sh, "node", str(folder))
            assert p.returncode == 0, p.stdout + p.stderr
        end = time.monotonic() + 60
        while sorted(on(1, "sinfo", "-h", "-N", "-o", "%N %T").stdout.split("\n")) != [
            "",
            "n1 idle",
            "n2 idle",
            "n3 idle",
        ]:
            assert time.monotonic() < end, on(1, "sinfo", "-N").stdout
            time.sleep(1)
        on(1, "scontrol", "update", "nodename=n1", "state=drain", "reason=the job's head goes elsewhere")
        study = hosts.shared / "study"
        (study / "shared").mkdir(parents=True)
        (study / "space.yaml").write_text(yaml.safe_dump({**space(args.steps), "tune": {"max_failures": 2}}))
        cmd = [sys.executable, "-m", "raystudy", "slurm", "--shared", str(study / "shared"), "--nodes", "2"]
        cmd += ["--cpus-per-node", "1", "--", "grid", "--space", str(study / "space.yaml")]
        p = hosts.run(1, cmd, cwd=study, env=env, capture_output=True, text=True, timeout=120)
        job = re.search(r"submitted job (\d+)", p.stdout).group(1)

        def job_log():
            found = list((study / "shared" / "logs").glob(f"*-{job}.out"))
            return found[0].read_text() if found else ""

        t0 = time.time()
        while not re.search(r"^\[\s*\d+/8\] .* val ", job_log(), re.M):  # a trial's line: it finished
            state = job_state(job)[0]
            assert state in ("PENDING", "RUNNING", "CONFIGURING"), (state, job_log()[-3000:])
            assert time.time() - t0 < 900, job_log()[-3000:]
            time.sleep(1)
        assert "on h2:" in job_log(), job_log()[-3000:]  # the head where we meant it
        hosts.kill(2)
        killed = time.time()
        ended_before = len(re.findall(r"^\[\s*\d+/8\] .* val ", job_log(), re.M))
        on(1, "scontrol", "update", "nodename=n1", "state=resume")
        pushed = 0
        while True:
            state, restarts, reason = job_state(job)
            if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"):
                break
            if state == "PENDING" and restarts > pushed and reason == "BeginTime":
                pushed = restarts  # SLURM holds a requeued job two minutes: it may start now
                on(1, "scontrol", "update", f"jobid={job}", "StartTime=now+5")
            assert time.time() - killed < 1200, (state, job_log()[-3000:])
            time.sleep(2)
        text = job_log()
        print(text[-2500:])
        newest = sorted((study / "shared" / "mlflow-backups").glob("mlflow-*.sqlite.gz"))[-1]
        db = folder / "restored.db"
        db.write_bytes(gzip.decompress(newest.read_bytes()))
        facts = store_facts(db)
        rc = 0 if state == "COMPLETED" and restarts >= 1 else 1
        redone = re.findall(r"\((\d+) were already done\)", text)
        print(f"# the job: {state} after {restarts} requeue(s); {ended_before} trial(s) had finished before the loss, ")
        print(f"# of which the requeued run found {redone[-1] if redone else '?'} done (the rest trained again)")
        ok = report("a SLURM job's head node (h2) lost", "--fault slurm-head", t0, killed, facts, 8, rc)
        return 0 if ok else 1
    finally:
        hosts.run(1, ["bash", local_sh, "stop", str(folder)], env=env, capture_output=True, timeout=120)
        for k in (3, 2):
            hosts.run(k, ["bash", local_sh, "stop", str(folder)], env=env, capture_output=True, timeout=120)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fault", choices=["cut", "lost", "slurm-head"], default="cut")
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
    if args.fault == "slurm-head":
        try:
            return slurm_head(hosts, args)
        finally:
            hosts.down()
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
        if args.fault == "cut":
            hosts.cut(2)
            time.sleep(args.seconds)
            hosts.heal(2)
        else:
            hosts.kill(2)
        healed = time.time()
        grid.wait(timeout=1800)
        what = f"h2 cut off for {args.seconds:.0f} s" if args.fault == "cut" else "h2 lost (every process killed)"
        flags = f"--fault {args.fault} --seconds {args.seconds:g} --steps {args.steps}"
        ok = report(what, flags, t0, healed, store_facts(db), 8, grid.returncode)
        return 0 if ok else 1
    finally:
        hosts.down()


if __name__ == "__main__":
    sys.exit(main())
