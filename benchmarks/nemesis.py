"""A seeded nemesis over the dress rehearsal: a study run while faults drawn from a seed hit it,
several at once, then the shared checker (``benchmarks/checker.py``) over what it recorded.

    python benchmarks/nemesis.py --seeds 1-8             # 8 seeds x {grid, search} x {sqlite, postgresql}
    python benchmarks/nemesis.py --seeds 7 --workloads search --stores postgresql   # one run again
    python benchmarks/nemesis.py --toy --seeds 23 --workloads grid --stores sqlite  # the slow tier's
    python benchmarks/nemesis.py --hosts --seeds 1-4     # on two test hosts, with the partition

Workloads: a rehearsal grid (the demo space, ``--trials`` trials in Tune runs of
``--trials-per-run``) and a rehearsal search (Optuna and ASHA on the optimiser space), each a
command a user types, with its own local Ray (``--num-cpus``). Stores: a SQLite file (a laptop's)
or, as a cluster's head runs it, ``cluster/node.sh mlflow`` (the basic-auth tracking server on a
PostgreSQL of its own, snapshots of the store as the command ends). The storage (Tune's folders,
Optuna's study, the SQLite store, the snapshots) is a small tmpfs of its own where mount is
allowed (root), so that a fault can fill it.

Faults (``FAULTS``): SIGKILL of the driver, a trial worker, the raylet or the GCS; SIGSTOP then
SIGCONT of the driver, a worker, the tracking server or PostgreSQL; the tracking server killed
and started again; PostgreSQL restarted; the storage filled and freed; on two hosts (``--hosts``,
``nemesis_hosts``: the command on a Ray head host, a Ray worker host beside it), the worker host
cut off from the head for a while. Each fires at a time or on
an event seen from outside (a command restarted and restoring, a Tune run begun, its first
checkpoint saved, a snapshot being written, every trial recorded while the command closes), is
logged with the phase it hit and evidence that its target existed and was hit, and may overlap
the next. After a command ends other than cleanly, it is started again as a user (or SLURM's
requeue) would. Once the schedule is spent and the study complete, the checker reads the store,
Optuna's storage, the newest snapshot and every command's output that was not SIGKILLed. Printed
per run: the seed, the fault schedule as it fired, the anomalies; at the end, coverage (fault x
phase), the runs and the anomalies with the seeds that reproduce them. Exit 1 when any run found
one. Root for the tmpfs and PostgreSQL (run as its own user); without root the disk fault is left out.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import sqlalchemy
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import checker  # noqa: E402
import nemesis_hosts  # noqa: E402
from nemesis_hosts import TwoHosts, cmdline  # noqa: E402

NODE_SH = ROOT / "cluster" / "node.sh"
# fault -> the stores it applies to
FAULTS = {
    "kill_driver": ("sqlite", "postgresql"),
    "kill_worker": ("sqlite", "postgresql"),
    "kill_raylet": ("sqlite", "postgresql"),
    "kill_gcs": ("sqlite", "postgresql"),
    "pause_driver": ("sqlite", "postgresql"),
    "pause_worker": ("sqlite", "postgresql"),
    "fill_disk": ("sqlite", "postgresql"),
    "pause_server": ("postgresql",),
    "kill_server": ("postgresql",),
    "pause_postgres": ("postgresql",),
    "restart_postgres": ("postgresql",),
    "cut_host": ("sqlite", "postgresql"),  # two hosts only (--hosts)
}
EVENTS = ("restore", "tune_run", "first_save", "snapshot", "closing")
MAX_STARTS = 40  # a run that needs more starts than this is reported, not retried for ever
MARK = "RAYSTUDY_NEMESIS_RUN"  # in the environment of every process a run starts: its folder


@dataclasses.dataclass
class Fault:
    kind: str
    trigger: str  # "time" or an event of EVENTS
    at: float  # seconds from the run's start (time), or after the event
    hold: float  # a pause's or an outage's seconds (0: none)
    fired: dict | None = None


def schedule(
    seed: int, store: str, n: int, span: float, hold: tuple[float, float], disk: bool, hosts: bool = False
) -> list[Fault]:
    """``n`` faults drawn from ``seed`` for ``store``: each kind at most twice, about half on events,
    times spread over the first ``span`` seconds so that holds (``hold``: least and most seconds)
    overlap the faults after them. A cut (``hosts``) holds up to three times longer: Ray takes a
    node for dead after about 30 s, and both a cut it outlives and one it does not are wanted."""
    r = random.Random(f"{seed}:{store}" + (":hosts" if hosts else ""))
    kinds = [
        k
        for k, stores in FAULTS.items()
        if store in stores and (disk or k != "fill_disk") and (hosts or k != "cut_host")
    ]
    pool = r.sample(kinds * 2, len(kinds) * 2)
    out = []
    for i in range(n):
        kind = pool[i % len(pool)]
        paused = kind.startswith("pause") or kind in ("kill_server", "fill_disk", "restart_postgres", "cut_host")
        h = round(r.uniform(hold[0], hold[1] * (3 if kind == "cut_host" else 1)), 1) if paused else 0.0
        if r.random() < 0.5:
            ev = r.choice([e for e in EVENTS if e != "snapshot" or store == "postgresql"])
            out.append(Fault(kind, ev, round(r.uniform(0, 3), 1), h))
        else:
            out.append(Fault(kind, "time", round(r.uniform(2, span), 1), h))
    return out


def coverage(runs: list[dict]) -> Counter:
    """(fault, phase) -> how many times it fired and hit, over ``runs``."""
    return Counter((f["kind"], f["phase"]) for run in runs for f in run["faults"] if f.get("hit"))


# ---------------------------------------------------------------- processes


def _state(pid: int) -> str | None:
    """The process's state letter (R, S, T, Z...), None when it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if int(Path(d, "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(d.name))
            except (OSError, IndexError, ValueError):
                pass
    return out


def ray_processes(ray_dir: Path) -> dict:
    """The Ray of ``ray_dir``: its raylet's and GCS's pids and its trial workers' (the raylet's
    children that run a trial's actor: Tune's function trainable, ``ray::ImplicitFunc``)."""
    out: dict = {"raylets": [], "gcs": None, "workers": []}
    needle = str(ray_dir)
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        cmd = cmdline(int(d.name))
        if needle in cmd and "/raylet" in cmd.split(" ")[0]:
            out["raylets"] = [int(d.name)]
        elif needle in cmd and "gcs_server" in cmd.split(" ")[0]:
            out["gcs"] = int(d.name)
    if out["raylets"]:
        for pid in _children(out["raylets"][0]):
            cmd = cmdline(pid)
            if cmd.startswith("ray::ImplicitFunc"):  # a trial's actor (not an idle worker, not Ray's agents)
                out["workers"].append(pid)
    return out


def _gone(pid: int, within: float = 10.0) -> bool:
    end = time.time() + within
    while time.time() < end:
        if _state(pid) in (None, "Z", "X"):
            return True
        time.sleep(0.05)
    return False


def _stopped(pid: int, within: float = 5.0) -> bool:
    end = time.time() + within
    while time.time() < end:
        if _state(pid) in ("T", "t"):
            return True
        time.sleep(0.05)
    return False


# ---------------------------------------------------------------- the world a run lives in


class World:
    """One run's study: its folders, store, Ray and the command started and restarted."""

    def __init__(self, workload: str, store: str, args, work: Path):
        self.workload, self.store, self.args, self.work = workload, store, args, work
        self.disk = work / "disk"
        self.disk.mkdir()
        self.mounted = _mount(self.disk, args.disk_mb)
        self.state, self.env = work / "state", {**os.environ, "PYTHONUNBUFFERED": "1", "RAY_AUTH_MODE": "disabled"}
        for k in ("MLFLOW_TRACKING_URI", "RAY_ADDRESS", "RAYSTUDY_TRACKING_STORE", "RAYSTUDY_SNAPSHOT_CMD"):
            self.env.pop(k, None)
        # what this run starts carries it (Ray's processes inherit the command's environment): its
        # processes are found by it, never by a pid seen earlier (pids are reused within minutes)
        self.env[MARK] = str(work)
        self.driver: subprocess.Popen | None = None
        self.starts, self.logs, self.killed_logs = 0, [], set()  # the commands' log files, in order
        self.paused: set[int] = set()
        self.server_pid: int | None = None
        self.events: dict[str, float] = {}
        self.t0 = time.time()
        self.cluster: TwoHosts | None = None

    def open_hosts(self) -> None:
        """Two hosts and their Ray (--hosts), made after the disk is mounted, so that both see it."""
        self.cluster = TwoHosts(self.work / "hosts", self.env, max(1, self.args.num_cpus // 2))
        self.cluster.start_ray()

    def ray(self) -> dict:
        """The run's Ray as the faults see it: the GCS, the raylets, the trial workers."""
        return self.cluster.processes() if self.cluster else ray_processes(self.work / "ray")

    def on_head(self, argv: list[str], **kw) -> subprocess.CompletedProcess:
        """``argv`` run where the command runs: this machine, or the head host."""
        return self.cluster.run(argv, **kw) if self.cluster else subprocess.run(argv, **kw)

    # -- the store
    def open_store(self) -> None:
        if self.store == "sqlite":
            self.uri = f"sqlite:///{self.disk / 'mlflow.db'}"
            self.db_uri = self.uri
            return
        self.state.mkdir()
        self.state.chmod(0o711)  # PostgreSQL's socket folder, reached by its own user
        home = self.work / "home"
        home.mkdir()
        self.node_env = {**self.env, "RAYSTUDY_STATE": str(self.state), "HOME": str(home)}
        self.node_env["RAYSTUDY_PG_PORT"] = str(_free_port())
        self.mlflow_port = _free_port()
        self.start_server()
        creds = {}
        for line in (self.state / "mlflow-credentials").read_text().splitlines():
            if line.startswith("export "):
                k, _, v = line[7:].partition("=")
                creds[k] = v.strip("'\"")
        head_uri = self.db_uri = (self.state / "mlflow-store").read_text().strip()
        if self.cluster:  # PostgreSQL listens on the head's loopback: read here through its socket
            self.db_uri = self._through_socket(head_uri)
        os.environ["PGPASSFILE"] = str(self.state / "pgpass")  # the checker's reads
        self.env.update(creds, PGPASSFILE=str(self.state / "pgpass"), RAYSTUDY_TRACKING_STORE=head_uri)
        self.env["RAYSTUDY_SNAPSHOT_CMD"] = f"RAYSTUDY_STATE={self.state} bash {NODE_SH} snapshot"

    def _through_socket(self, uri: str) -> str:
        """``uri`` (the head's, by 127.0.0.1) by PostgreSQL's socket in its data folder, the
        password in it (pgpass matches a socket by the name localhost, not 127.0.0.1)."""
        url = sqlalchemy.engine.make_url(uri)
        secret = (self.state / "pgpass").read_text().splitlines()[0].rsplit(":", 1)[1]
        query = {"host": str(self.state / "postgres"), "port": str(url.port)}
        return url.set(host=None, port=None, password=secret, query=query).render_as_string(hide_password=False)

    def start_server(self) -> None:
        backups = self.disk / "backups"
        p = self.on_head(
            ["bash", str(NODE_SH), "mlflow", str(self.mlflow_port), "postgres", str(self.work / "art"), str(backups)],
            env=self.node_env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        m = re.search(r"MLflow tracking server: (http://\S+)", p.stdout)
        if p.returncode != 0 or not m:
            raise RuntimeError(f"node.sh mlflow failed: {p.stdout[-1500:]}{p.stderr[-1500:]}")
        self.uri = m.group(1)
        self.server_pid = int((self.state / "mlflow.pid").read_text())

    def postmaster(self) -> int | None:
        try:
            return int((self.state / "postgres" / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def node_sh(self, *args: str) -> subprocess.CompletedProcess:
        return self.on_head(
            ["bash", str(NODE_SH), *args], env=self.node_env, capture_output=True, text=True, timeout=300
        )

    # -- the command
    def command(self) -> list[str]:
        a = self.args
        common = ["--rehearse", str(a.seconds), "--storage", str(self.disk / "runs"), "--tracking-uri", self.uri]
        if self.cluster:
            common += ["--address", self.cluster.address, "--quiet"]
        else:
            common += ["--num-cpus", str(a.num_cpus), "--ray-temp-dir", str(self.work / "ray"), "--quiet"]
        if self.workload == "grid":
            return [
                sys.executable,
                "-m",
                "raystudy.grid",
                "--space",
                str(self.space),
                "--max-concurrent",
                str(a.num_cpus),
                *common,
            ]
        return [sys.executable, "-m", "raystudy", "search", "--space", str(self.space), *common]

    def start(self) -> None:
        self.starts += 1
        log = self.work / f"command{self.starts}.log"
        self.log = log
        self.logs.append(log.name)
        with log.open("w") as f:
            run = self.cluster.popen if self.cluster else subprocess.Popen
            self.driver = run(self.command(), cwd=ROOT, env=self.env, stdout=f, stderr=subprocess.STDOUT)
        self.started_at = time.time()

    def tune_runs(self) -> set[str]:
        """The Tune runs' folders in the storage (beside a search's Optuna study and its results)."""
        try:
            return {
                p.name for p in (self.disk / "runs").iterdir() if p.is_dir() and p.name not in ("optuna", "results")
            }
        except OSError:
            return set()

    def saves(self, run: str) -> bool:
        return any((self.disk / "runs" / run).glob("*/checkpoint_*"))

    def snapshotting(self) -> bool:
        return self.store == "postgresql" and any(self.state.glob("snapshot.??????"))

    def watch_store(self) -> None:
        """Count, in a thread of its own, the trial runs ended as the study counts them into
        ``self.recorded``: a query to a paused PostgreSQL waits for it, the nemesis does not."""
        import threading

        self.recorded, self.watching = 0, True
        ended = checker.SEARCH_ENDED if self.workload == "search" else checker.ENDED

        def loop():
            while self.watching:
                try:
                    self.recorded = checker.counts(checker.trial_runs(self.db_uri), ended)["ended"]
                except (sqlite3.Error, sqlalchemy.exc.SQLAlchemyError):
                    pass  # the store down, paused or full: a fault of this run
                time.sleep(1)

        threading.Thread(target=loop, daemon=True).start()

    def _ours(self, pid: int) -> bool:
        """A process this run started: its environment carries the run's mark, or it holds a file
        of the run's folder open (Ray's agents, which a killed driver's Ray leaves behind, start
        with an environment of their own but keep their logs in its session folder)."""
        try:
            if f"{MARK}={self.work}".encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                return True
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
        except OSError:
            return False
        for fd in fds:
            try:
                if os.readlink(fd).startswith(f"{self.work}/"):
                    return True
            except OSError:
                continue
        return False

    def close(self) -> None:
        """Everything the run started stopped: its command, its servers (by node.sh), then every
        process that carries its mark (Ray's, orphans included), and its tmpfs."""
        self.watching = False
        for pid in list(self.paused):
            _signal(pid, signal.SIGCONT)
        if self.driver and self.driver.poll() is None:
            self.driver.kill()
            self.driver.wait()
        if self.store == "postgresql" and self.state.exists():
            self.node_sh("stop-mlflow")
            pm = self.postmaster()
            if pm:
                for p in [pm, *_children(pm)]:
                    _signal(p, signal.SIGCONT)
            self.node_sh("stop-postgres")
        for d in Path("/proc").iterdir():
            if d.name.isdigit() and int(d.name) != os.getpid() and self._ours(int(d.name)):
                _signal(int(d.name), signal.SIGKILL)
        if self.cluster:
            self.cluster.down()
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.disk)], capture_output=True)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _signal(pid: int, sig) -> bool:
    try:
        os.kill(pid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _mount(disk: Path, mb: int) -> bool:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={mb}m", "tmpfs", str(disk)], capture_output=True)
    return p.returncode == 0


# ---------------------------------------------------------------- the workloads


def write_space(world: World, args) -> tuple[Path, object, str]:
    """The workload's space file in the run's folder; (path, what the checker expects, the
    experiment or the Optuna study)."""
    if world.workload == "grid":
        from bench_scale import space_file

        path, n = space_file(args.trials, world.work, datasets=args.datasets)
        raw = yaml.safe_load(path.read_text())
        raw["tune"] = {**raw.get("tune", {}), "trials_per_run": args.trials_per_run, "checkpoint_every_s": 0.01}
        path.write_text(yaml.safe_dump(raw, sort_keys=False))
        return path, n, f"raystudy-{raw['study']}-vit_demo-rehearsal"
    from bench_search import OPTUNA_NAME, space_file

    path = space_file(args.trials, world.work)
    raw = yaml.safe_load(path.read_text())
    raw["tune"].update(trials_per_run=args.trials_per_run, max_failures=2, checkpoint_every_s=0.01)
    path.write_text(yaml.safe_dump(raw))
    return path, args.trials, OPTUNA_NAME


# ---------------------------------------------------------------- firing


def phase(world: World, recorded: int, expected: int) -> str:
    """Where the run is: no command, a command starting or restoring (its first seconds), its
    trials, or closing (every trial recorded, the command still running)."""
    if world.driver is None or world.driver.poll() is not None:
        return "between"
    if expected and recorded >= expected:
        return "closing"
    if time.time() - world.started_at < 8:
        return "start" if world.starts == 1 else "restore"
    return "trials"


def fire(f: Fault, world: World, heals: list) -> dict:
    """Hit ``world`` with ``f`` now; evidence of the target before and after. Holds are healed later (``heals``)."""
    kind, out = f.kind, {"kind": f.kind, "hit": False}
    ray = world.ray()
    if kind in ("kill_driver", "pause_driver"):
        pid = world.driver.pid if world.driver and world.driver.poll() is None else None
    elif kind in ("kill_worker", "pause_worker"):
        pid = random.Random(f.at).choice(ray["workers"]) if ray["workers"] else None
    elif kind == "kill_raylet":
        pid = random.Random(f.at).choice(ray["raylets"]) if ray["raylets"] else None
    elif kind == "kill_gcs":
        pid = ray["gcs"]
    elif kind == "cut_host":
        pid = world.cluster.raylet(2) if world.cluster and not world.cluster.cut_now else None
    elif kind in ("pause_server", "kill_server"):
        pid = world.server_pid if world.server_pid and _state(world.server_pid) else None
    elif kind in ("pause_postgres", "restart_postgres"):
        pid = world.postmaster()
    else:  # fill_disk
        pid = 0 if world.mounted else None
    if pid is None:
        return out | {"why": "no target"}
    out["pid"] = pid
    if kind.startswith("kill_") and kind != "kill_server":
        if kind == "kill_driver":
            world.killed_logs.add(world.log.name)
        out["hit"] = _signal(pid, signal.SIGKILL) and _gone(pid)
    elif kind.startswith("pause_"):
        group = [pid, *(_children(pid) if kind in ("pause_server", "pause_postgres") else [])]
        for p in group:
            _signal(p, signal.SIGSTOP)
        world.paused.update(group)
        out["hit"] = _stopped(pid)
        heals.append((time.time() + f.hold, "cont", group))
    elif kind == "kill_server":
        os.killpg(pid, signal.SIGKILL)
        out["hit"] = _gone(pid)
        heals.append((time.time() + f.hold, "server", None))
    elif kind == "cut_host":
        out["hit"] = world.cluster.cut()
        heals.append((time.time() + f.hold, "plug", None))
    elif kind == "restart_postgres":
        p = world.node_sh("stop-postgres")
        out["hit"] = p.returncode == 0 and _gone(pid, 30)
        heals.append((time.time() + f.hold, "postgres", None))
    else:
        _fill(world.disk)
        out["hit"] = shutil.disk_usage(world.disk).free < 1 << 16
        heals.append((time.time() + f.hold, "free", None))
    return out


def heal(what: str, arg, world: World, pending: list) -> None:
    """End a fault's hold; a process two pauses hold, or a disk filled twice, waits for the later."""
    if what == "cont":
        held = {p for h in pending if h[1] == "cont" for p in h[2]}
        for p in arg:
            if p not in held:
                _signal(p, signal.SIGCONT)
                world.paused.discard(p)
    elif what in ("free", "plug") and any(h[1] == what for h in pending):
        return
    elif what == "plug":
        world.cluster.heal()
    elif what == "server":
        world.start_server()
    elif what == "postgres":
        world.node_sh("postgres", world.node_env["RAYSTUDY_PG_PORT"])
    elif what == "free":
        (world.disk / "filler").unlink(missing_ok=True)


def _fill(disk: Path) -> None:
    """Every free byte of ``disk`` taken by one file, written until the filesystem refuses."""
    fd = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        for size in (1 << 20, 1 << 12, 1):
            try:
                while True:
                    os.write(fd, b"\0" * size)
            except OSError:
                pass
    finally:
        os.close(fd)


# ---------------------------------------------------------------- one run


def run_one(seed: int, workload: str, store: str, args) -> dict:
    """One seeded run: the study under its faults to its end, then the checker; what happened."""
    # two hosts each have a /tmp of their own: their run's folder (its disk mounted inside) elsewhere
    work = Path(tempfile.mkdtemp(prefix="nem", dir="/var/tmp" if args.hosts else "/tmp"))
    work.chmod(0o711)  # PostgreSQL's user reaches its folder below it
    world = World(workload, store, args, work)
    t0, faults = time.time(), []
    try:
        if args.hosts:
            world.open_hosts()
        world.open_store()
        world.space, expected, name = write_space(world, args)
        hold = (args.hold_min, args.hold_max)
        faults = schedule(seed, store, args.faults, args.span, hold, world.mounted, hosts=args.hosts)
        ended = drive(world, faults, expected, args)
        time.sleep(1)  # the last command's store writes settle
        logs = {n: (work / n).read_text(errors="replace") for n in world.logs if n not in world.killed_logs}
        snaps = list((world.disk / "backups").glob("mlflow-*")) if store == "postgresql" else []
        found = checker.check(
            world.db_uri,
            None if workload == "search" else name,
            expected=expected,
            search=name if workload == "search" else None,
            optuna_db=world.disk / "runs" / "optuna" / "optuna.db" if workload == "search" else None,
            logs=logs,
            snapshots=snaps,
            pg_uri=world.db_uri if store == "postgresql" else None,
        )
        if ended is not None:
            found.append(checker.Anomaly("unfinished", ended))
    except (OSError, RuntimeError, subprocess.SubprocessError, sqlite3.Error, sqlalchemy.exc.SQLAlchemyError) as e:
        # the harness's own failure: said, and the next run goes on
        found = [checker.Anomaly("harness", f"{type(e).__name__}: {e}")]
    finally:
        world.close()
    out = {
        "seed": seed, "workload": workload, "store": store, "starts": world.starts,
        "wall_s": round(time.time() - t0, 1),
        "faults": [f.fired | {"trigger": f.trigger, "at": f.at, "hold": f.hold} for f in faults if f.fired],
        "missed": [f"{f.kind} on {f.trigger}" for f in faults if not f.fired or not f.fired.get("hit")],
        "events": {k: round(v - world.t0, 1) for k, v in world.events.items()},
        "anomalies": [str(a) for a in found], "folder": str(work),
    }  # fmt: skip
    if not found and not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return out


def drive(world: World, faults: list[Fault], expected: int, args) -> str | None:
    """Start the command and restart it after each end that is not clean, firing ``faults`` as
    they come due; returns why the study did not complete (None: it did)."""
    heals: list = []
    pending = list(faults)
    seen: dict[str, float] = world.events  # event -> when it first came
    runs_seen, saved, mended = set(), set(), 0.0
    world.watch_store()
    t0 = world.t0 = time.time()  # the store is up: faults are timed from the command's first start
    world.start()
    while time.time() - t0 < args.timeout:
        now = time.time()
        for h in sorted((h for h in heals if h[0] <= now), key=lambda h: h[1] != "cont"):  # pauses end first
            if h[1] in ("server", "postgres") and any(c[1] == "cont" for c in heals if c[0] > now):
                continue  # a start would wait on a process still paused, and hold this loop: after it
            heals.remove(h)
            heal(h[1], h[2], world, heals)
        for run in world.tune_runs() - runs_seen:
            runs_seen.add(run)
            seen.setdefault("tune_run", now)
        for run in runs_seen - saved:
            if world.saves(run):
                saved.add(run)
                seen.setdefault("first_save", now)
        if world.snapshotting():
            seen.setdefault("snapshot", now)
        if world.cluster and now - mended > 2:
            mended = now
            world.cluster.mend()  # a worker node that ended joins again, once its host is back
        recorded = world.recorded
        alive = world.driver.poll() is None
        if alive and recorded >= expected:
            seen.setdefault("closing", now)
        for f in list(pending):
            due = f.at + (seen[f.trigger] if f.trigger in seen else t0 if f.trigger == "time" else float("inf"))
            if f.trigger != "time" and f.trigger not in seen and now - t0 > args.span + 15:
                due = now  # its event never came: it fires now, as a time fault
            if now < due:
                continue
            where = phase(world, recorded, expected)
            got = fire(f, world, heals)
            if got.get("why") == "no target" and now - due < args.patience:
                continue  # its target is not there yet (Ray starting, or gone with its GCS): tried again
            f.fired = got | {"phase": where, "t": round(now - t0, 1)}
            pending.remove(f)
            _say(f)
        if not alive and world.driver.returncode == 0 and not heals:
            return None  # a clean end with nothing held: the study is complete
        if not alive and world.driver.returncode != 0:
            if world.starts >= MAX_STARTS:
                return f"the command was started {world.starts} times"
            # then the same command again, as a user or SLURM's requeue would: at once after a
            # kill, a few seconds after a command that said why it stopped
            time.sleep(1 if world.driver.returncode < 0 else 5)
            if world.cluster:
                world.cluster.ensure()  # its Ray up again first, as an operator would
            world.start()
            seen["restore"] = time.time()
        time.sleep(0.1)
    return f"not complete after {args.timeout:g} s"


def _say(f: Fault) -> None:
    got = f.fired
    what = "hit" if got.get("hit") else f"missed ({got.get('why', 'no evidence')})"
    hold = f", held {f.hold:g} s" if f.hold else ""
    print(
        f"  +{got['t']:6.1f} s {f.kind:<16} on {f.trigger:<10} in {got['phase']:<8} "
        f"pid {got.get('pid', '-')}{hold}: {what}",
        flush=True,
    )


# ---------------------------------------------------------------- the command


def parse_seeds(text: str) -> list[int]:
    """``1-10``, ``3,7`` or both: the seeds, in order."""
    out = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out += list(range(int(lo), int(hi or lo) + 1))
    return out


def parse(argv: list[str] | None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--seeds", default="1", help="seeds, e.g. 1-10 or 3,7 (default 1)")
    p.add_argument("--workloads", default="grid,search", help="grid, search or both (default)")
    p.add_argument("--stores", default="sqlite,postgresql", help="sqlite, postgresql or both (default)")
    p.add_argument("--faults", type=int, default=7, help="faults drawn a run (default 7)")
    p.add_argument("--trials", type=int, default=104, help="trials a study (default 104)")
    p.add_argument("--datasets", type=int, default=1, help="the grid's datasets (default 1)")
    p.add_argument("--trials-per-run", type=int, default=25, help="trials a Tune run (default 25)")
    p.add_argument("--seconds", type=float, default=1.0, help="seconds a rehearsal trial (default 1)")
    p.add_argument("--num-cpus", type=int, default=4, help="trials at once (default 4)")
    p.add_argument("--span", type=float, default=45.0, help="seconds over which timed faults are drawn (default 45)")
    p.add_argument("--hold-min", type=float, default=5.0, help="least seconds a pause or outage holds (default 5)")
    p.add_argument("--hold-max", type=float, default=20.0, help="most seconds a pause or outage holds (default 20)")
    p.add_argument("--patience", type=float, default=90.0, help="seconds a fault waits for its target (default 90)")
    p.add_argument("--disk-mb", type=int, default=256, help="the storage's tmpfs in MiB (default 256)")
    p.add_argument("--timeout", type=float, default=1200.0, help="seconds a run may take (default 1200)")
    p.add_argument("--hosts", action="store_true", help="each run on two test hosts, with the cut fault (root)")
    p.add_argument("--toy", action="store_true", help="a toy run (the slow tier's): 13 four-second trials, short holds")
    p.add_argument("--out", type=Path, help="append each run's record to this file (JSON lines)")
    p.add_argument("--keep", action="store_true", help="keep every run's folder (one with anomalies is always kept)")
    args = p.parse_args(argv)
    if args.toy:
        # four waves of 4-second trials outlast the 15 s span on any machine: every timed fault
        # falls on a study still running (1-second trials ended first on a fast one)
        args.trials, args.datasets, args.trials_per_run, args.num_cpus, args.seconds = 13, 1, 5, 4, 4.0
        args.span, args.hold_min, args.hold_max, args.faults, args.disk_mb = 15.0, 2.0, 6.0, 5, 64
    workloads, stores = args.workloads.split(","), args.stores.split(",")
    problem = None
    if set(workloads) - {"grid", "search"}:
        problem = f"--workloads {args.workloads!r}: use grid, search or grid,search"
    elif set(stores) - {"sqlite", "postgresql"}:
        problem = f"--stores {args.stores!r}: use sqlite, postgresql or sqlite,postgresql"
    elif not re.fullmatch(r"\d+(-\d+)?(,\d+(-\d+)?)*", args.seeds):
        problem = f"--seeds {args.seeds!r}: use numbers and ranges, e.g. 1-10 or 3,7"
    elif args.faults < 1 or args.trials < 1 or args.num_cpus < 1 or not 0 < args.hold_min <= args.hold_max:
        problem = "--faults, --trials and --num-cpus at least 1; 0 < --hold-min <= --hold-max"
    elif "postgresql" in stores and not (
        shutil.which("pg_ctl") or list(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))
    ):
        problem = "no PostgreSQL server programs (pg_ctl): apt-get install -y postgresql, or --stores sqlite"
    elif args.hosts:
        problem = _cannot_make_hosts()
    if problem:
        p.exit(2, f"nemesis: {problem}\n")
    return args, parse_seeds(args.seeds), workloads, stores


def _cannot_make_hosts() -> str | None:
    hosts_py = nemesis_hosts.hosts_module()
    try:
        hosts_py.check_can_make_hosts()
    except hosts_py.HostsError as e:
        return f"--hosts: {e}"
    return None


def main(argv: list[str] | None = None) -> int:
    args, seeds, workloads, stores = parse(argv)
    # a TERM (a stopped batch) unwinds as an exit does: the run's world is closed (its Ray, its
    # servers, its tmpfs), its folder kept
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    runs = []
    for seed in seeds:
        for workload in workloads:
            for store in stores:
                print(f"seed {seed}, {workload} on {store}:", flush=True)
                out = run_one(seed, workload, store, args)
                runs.append(out)
                for a in out["anomalies"]:
                    print(f"  ANOMALY {a}", flush=True)
                hits = sum(f.get("hit", False) for f in out["faults"])
                print(f"  {hits} faults hit, {out['starts']} starts, {out['wall_s']:.0f} s, "
                      f"{len(out['anomalies'])} anomalies"
                      + (f" (kept: {out['folder']})" if out["anomalies"] else ""), flush=True)  # fmt: skip
                if args.out:
                    with args.out.open("a") as f:
                        f.write(json.dumps(out) + "\n")
    summary(runs, flags=(" --hosts" if args.hosts else "") + (" --toy" if args.toy else ""))
    return 1 if any(r["anomalies"] for r in runs) else 0


def summary(runs: list[dict], flags: str = "") -> None:
    cov = coverage(runs)
    phases = sorted({p for _, p in cov})
    print(f"\ncoverage (faults hit, by phase), {len(runs)} runs:")
    print("| fault | " + " | ".join(phases) + " |")
    print("|---|" + "---:|" * len(phases))
    for kind in FAULTS:
        if any(k == kind for k, _ in cov):
            print(f"| {kind} | " + " | ".join(str(cov.get((kind, p), 0)) for p in phases) + " |")
    bad = [r for r in runs if r["anomalies"]]
    print(f"{sum(len(r['anomalies']) for r in runs)} anomalies in {len(bad)} of {len(runs)} runs")
    for r in bad:
        print(f"  seed {r['seed']} {r['workload']} {r['store']}: {'; '.join(r['anomalies'])[:500]}")
        print(
            f"    again: python benchmarks/nemesis.py{flags} --seeds {r['seed']} "
            f"--workloads {r['workload']} --stores {r['store']}"
        )


if __name__ == "__main__":
    sys.exit(main())
