"""The study as SLURM batch jobs: checked here, on a login node, then submitted with sbatch.

    raystudy slurm --shared /scratch/me/study -- grid --space demo                     # the demo grid, one node
    raystudy slurm --shared DIR --partition gpu --nodes 2 --gpus-per-node 4 --cpus-per-node 32 \\
        --time 24:00:00 -- grid --model vit_base                                       # the paper's main grid
    raystudy slurm --shared DIR --dry-run -- grid --model vit_base                     # the sbatch line, not run

The job (cluster/slurm/job.sh) starts MLflow's tracking server and Ray on its nodes and runs
`raystudy grid ...` (or `search`) there. Before its time limit it stops the grid as a Ctrl-C does
and requeues itself while trials remain; the same command submitted again resumes the study too.
The store outlives every job: snapshots in DIR/mlflow-backups, restored as each job starts.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from raystudy.commands import cli
from raystudy.driver.slurm_batch import PROGRAMS, submission
from raystudy.errors import ConfigError


def build_parser() -> cli.Parser:
    """The slurm command's flags (what follows ``--``, the program the job runs, is ``parse``'s)."""
    ap = cli.Parser("raystudy slurm", __doc__)
    ap.add_argument("--shared", required=True, help="a folder every node mounts: checkpoints, snapshots, logs")
    ap.add_argument("--partition", help="SLURM partition (default: the cluster's default one)")
    ap.add_argument("--nodes", type=int, default=1, help="nodes per job (default: 1)")
    ap.add_argument("--gpus-per-node", type=int, default=0, help="GPUs per node (default: 0)")
    ap.add_argument("--cpus-per-node", type=int, help="CPUs per node (default: the partition's default)")
    ap.add_argument("--time", default="24:00:00", help="each job's time limit, as sbatch takes it (default: 24:00:00)")
    ap.add_argument(
        "--stop-before",
        type=int,
        default=600,
        help="seconds before the time limit at which the grid stops and the job requeues (default: 600)",
    )
    ap.add_argument(
        "--store",
        help="MLflow's store: sqlite (the job's own, node-local, snapshotted; the default), postgres, "
        "postgresql://USER@HOST:PORT/DB, or http(s)://... a tracking server of yours "
        "(default: $MLFLOW_TRACKING_URI, else sqlite)",
    )
    ap.add_argument("--job-name", default="raystudy", help="the job's name in squeue (default: raystudy)")
    ap.add_argument("--sbatch-arg", action="append", default=[], help="one more sbatch flag, as is (repeatable)")
    ap.add_argument("--wait", action="store_true", help="return when the job ends (sbatch --wait)")
    ap.add_argument("--dry-run", action="store_true", help="check and print the sbatch command, submit nothing")
    return ap


def parse(argv: list[str] | None):
    """The flags before ``--``, and what follows it as ``program`` (the job's command line)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    args = build_parser().parse_args(argv[:cut])
    args.program = argv[cut + 1 :]
    return args


def check_flags(args) -> None:
    """The job's program and the counts, checked before ``submission`` checks the rest."""
    program = args.program or ["grid"]
    if program[0] not in PROGRAMS:
        raise ConfigError(f"the job's program {program[0]!r}: use grid or search, after -- (raystudy slurm -- grid)")
    for flag, value in (
        ("--nodes", args.nodes),
        ("--cpus-per-node", args.cpus_per_node),
        ("--gpus-per-node", args.gpus_per_node),
        ("--stop-before", args.stop_before),
    ):
        cli.check_count(flag, value)


def main(argv: list[str] | None = None) -> int:
    """Check the submission, then submit it; sbatch's exit status, 2 on bad input."""
    args = parse(argv)
    try:
        check_flags(args)
        cmd, env = submission(args)
    except ConfigError as e:
        return cli.fail(e)
    if args.dry_run:
        print(" ".join(cmd))
        print("dry run: nothing submitted")
        return 0
    p = subprocess.run(cmd, env={**os.environ, **env}, stdout=subprocess.PIPE, text=True)
    job = p.stdout.strip().split(";")[0]
    if job:
        log = Path(args.shared).resolve() / "logs" / f"{args.job_name}-{job}.out"
        print(f"submitted job {job}: its log {log}; watch it with squeue -j {job} (docs/cluster.md#slurm)")
    return p.returncode


if __name__ == "__main__":
    sys.exit(main())
