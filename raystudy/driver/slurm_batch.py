"""SLURM for a study's batch job: what ``raystudy slurm`` checks on a login node (the store on
shared storage, the partition's GPUs), the ``sbatch`` command it submits, and the close of a
stopped job's runs."""

from __future__ import annotations

import importlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from raystudy.errors import ConfigError
from raystudy.tracking import connect, query, record, tags

JOB_SH = Path(__file__).resolve().parents[2] / "cluster" / "slurm" / "job.sh"
PROGRAMS = ("grid", "search")
# Where SQLite's file locks are not to be trusted: a store there gets corrupted under concurrent writers.
NETWORK_FS = {"nfs", "nfs4", "lustre", "gpfs", "beegfs", "cifs", "smb3", "ceph", "glusterfs", "panfs", "wekafs"}
SQLITE_WHY = (
    "SQLite's locks are unsafe on a network filesystem (a store there gets corrupted); use --store sqlite "
    "(the job's own, on node-local disk, snapshotted to the shared folder) or a PostgreSQL server "
    "(--store postgresql://USER@HOST:PORT/DB)"
)


def submission(args) -> tuple[list[str], dict[str, str]]:
    """The sbatch command and the environment it passes to the job, every flag checked first
    (the program and the counts by the command, ``raystudy.commands.slurm``; the rest here)."""
    program = args.program or ["grid"]
    shared = Path(args.shared).expanduser()
    if not shared.is_dir():
        raise ConfigError(f"--shared {args.shared}: no such folder; make it on a filesystem every node mounts")
    if not os.access(shared, os.W_OK):
        raise ConfigError(f"--shared {args.shared}: not writable by you; choose a folder of your own")
    shared = shared.resolve()
    store = check_store(args.store or os.environ.get("MLFLOW_TRACKING_URI") or "sqlite", shared)
    if shutil.which("sbatch") is None:
        raise ConfigError(
            "no SLURM here: sbatch is not on the PATH; run raystudy slurm on the cluster's login node "
            "(module load slurm), or raystudy grid for a Ray of your own"
        )
    check_server_packages(store)
    if args.nodes > 1 or args.gpus_per_node:
        check_partition(args.partition, args.nodes, args.gpus_per_node, sinfo_nodes())
    (shared / "logs").mkdir(exist_ok=True)
    cmd = ["sbatch", "--parsable", f"--job-name={args.job_name}", f"--nodes={args.nodes}", "--ntasks-per-node=1"]
    cmd += [f"--time={args.time}", f"--signal=B:USR1@{args.stop_before}", "--requeue", "--open-mode=append"]
    cmd += [f"--output={shared / 'logs' / '%x-%j.out'}"]
    cmd += [f"--partition={args.partition}"] if args.partition else []
    cmd += [f"--cpus-per-task={args.cpus_per_node}"] if args.cpus_per_node else []
    cmd += [f"--gpus-per-node={args.gpus_per_node}"] if args.gpus_per_node else []
    cmd += (["--wait"] if args.wait else []) + args.sbatch_arg + [str(JOB_SH), *program]
    src = str(JOB_SH.parent.parent.parent)
    env = {"RAYSTUDY_SHARED": str(shared), "RAYSTUDY_SRC": src, "RAYSTUDY_SLURM_STORE": store}
    return cmd, env


# What the job's own tracking server imports (cluster/node.sh: MLflow's basic-auth app; PostgreSQL's
# driver): the `cluster` extra. Missing, the job would fail seconds after it starts.
SERVER_PACKAGES = {"flask_wtf": "Flask-WTF (MLflow's basic-auth app)", "psycopg2": "psycopg2 (PostgreSQL's driver)"}


def check_server_packages(store: str) -> None:
    """The packages the job's tracking server needs, importable here (the job runs this environment):
    none for a server of yours (http(s)://), Flask-WTF for the job's own, and psycopg2 on PostgreSQL."""
    if store.startswith(("http://", "https://")):
        return
    needed = ["flask_wtf"] + (["psycopg2"] if store.startswith("postgres") else [])
    missing = []
    for name in needed:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(SERVER_PACKAGES[name])
    if missing:
        raise ConfigError(
            f"the job's MLflow server needs {' and '.join(missing)}, not installed in this environment "
            f'({sys.executable}): pip install -e ".[cluster]" (or --store http(s)://... a tracking server of yours)'
        )


def check_store(store: str, shared: Path) -> str:
    """``store`` as the job takes it; a SQLite file on a network filesystem (or in the shared folder,
    which every node mounts) is refused, as is a URI holding a secret."""
    if store in ("sqlite", "postgres") or store.startswith(("http://", "https://")):
        return store
    if re.match(r"^[a-z+]+://[^/@]*:[^/@]*@", store):
        raise ConfigError("--store names a secret (USER:SECRET@HOST): put it in SHARED/secrets/pgpass (mode 600)")
    if store.startswith("postgresql"):
        return store
    path = connect.sqlite_path(store)
    if path is None:
        raise ConfigError(
            f"--store {store}: use sqlite, postgres, postgresql://USER@HOST:PORT/DB or http(s)://HOST:PORT"
        )
    path = path.resolve()
    fs = filesystem(path)
    if fs in NETWORK_FS or path.is_relative_to(shared):
        where = f"on {fs}" if fs in NETWORK_FS else "in the shared folder"
        raise ConfigError(f"--store {store}: SQLite {where}: {SQLITE_WHY}")
    return store


def filesystem(path: Path) -> str:
    """The type of the filesystem ``path`` is on (its deepest mount point), from /proc/self/mountinfo;
    empty where that cannot be read."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return ""
    best, kind = "", ""
    for line in lines:
        left, _, right = line.partition(" - ")
        fields = left.split()
        if len(fields) < 5 or not right:
            continue
        point = fields[4].replace("\\040", " ")
        if (path == Path(point) or path.is_relative_to(point)) and len(point) >= len(best):
            best, kind = point, right.split()[0]
    return kind


def sinfo_nodes() -> str | None:
    """``sinfo``'s line per node and partition (``NODE PARTITION GRES``), or None where it cannot say."""
    p = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %P %G"], capture_output=True, text=True)
    return p.stdout if p.returncode == 0 else None


def partition_nodes(sinfo: str, partition: str | None) -> tuple[str, dict[str, str]]:
    """(the partition's name, {node: its GRES}) from ``sinfo_nodes``' lines: ``partition``, or the
    default one (``*``) where it is None; a partition sinfo does not know is refused."""
    rows = [line.split(None, 2) for line in sinfo.splitlines() if len(line.split(None, 2)) == 3]
    if partition is None:
        partition = next((name.rstrip("*") for _, name, _ in rows if name.endswith("*")), None)
    found = {node: gres.strip() for node, name, gres in rows if name.rstrip("*") == partition}
    if partition is None or not found:
        names = ", ".join(sorted({name.rstrip("*") for _, name, _ in rows}))
        raise ConfigError(f"--partition {partition}: no such partition; sinfo knows {names}")
    return partition, found


def check_partition(partition: str | None, nodes: int, gpus: int, sinfo: str | None) -> None:
    """More nodes, or more GPUs per node, than the partition has, as ``sinfo`` says, is refused
    (sbatch takes such a job, and it waits for ever: "PartitionConfig", "PartitionNodeLimit" in
    squeue). Where sinfo cannot say, sbatch will."""
    if sinfo is None or (nodes <= 1 and not gpus):
        return
    name, found = partition_nodes(sinfo, partition)
    most, node = max((gpu_count(gres), node) for node, gres in found.items())
    if gpus > most:
        raise ConfigError(
            f"--gpus-per-node {gpus}: the nodes of partition {name} have "
            + (f"at most {most} GPUs" if most else "no GPUs")
            + f" (sinfo: {found[node]}); ask for {most} or fewer, or another partition"
        )
    if nodes > len(found):
        have = f"{len(found)} node" + ("s" if len(found) > 1 else "")
        raise ConfigError(
            f"--nodes {nodes}: partition {name} has {have} (sinfo: {', '.join(sorted(found))}); "
            f"ask for {len(found)} or fewer, or another partition"
        )


def close_running(uri: str) -> int:
    """Every run of the store at ``uri`` still RUNNING closed as a driver going down closes it:
    trials interrupted and KILLED, parents tagged interrupted and ended; returns how many. For a
    job whose grid was killed (``scancel``): the next job's grid resumes them."""
    cl = connect.client(uri)
    n = 0
    for exp in cl.search_experiments():
        n += record.close_stale(cl, exp.experiment_id)
        for run in query.find_runs(cl, exp.experiment_id):
            if run.info.status == "RUNNING" and run.data.tags.get(tags.ROLE) != "trial":
                record.tag_parent(cl, run.info.run_id, "interrupted")
                record.end_run(cl, run.info.run_id)
                n += 1
    print(f"closed {n} runs left RUNNING in {uri}")
    return n


def gpu_count(gres: str) -> int:
    """GPUs per node in one of sinfo's %G fields (``gpu:4``, ``gpu:a100:8(S:0-1)``, ``(null)``)."""
    total = 0
    for item in re.split(r",(?![^()]*\))", gres.strip()):
        m = re.match(r"^gpu(?::[^:(]+)?:(\d+)", item)
        if m:
            total += int(m.group(1))
    return total
