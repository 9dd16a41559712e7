"""Per-trial overhead of the grid (Ray Tune + MLflow) against the same trainings in one process.

    python benchmarks/bench_grid.py                 # the demo grid (28 trials): the slowest benchmark
    python benchmarks/bench_grid.py --conditions MHA,LN1 --steps 100   # a quicker look

Prints, measured side by side in one run:
  plain     the grid's trainings back to back in this process (engine.train, 1 thread each)
  grid      `python -m raystudy.grid` on the same trials, one at a time (--max-concurrent 1, 1 thread)
  overhead  (grid - plain) / trials: everything Ray and MLflow add per trial, start-up included
  grid x2   the same with 2 trials at a time (the default on 2 cores), for reference
and the start-up of one trial with and without a nested TorchTrainer (2 CPU DDP workers).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def plain(trials) -> float:
    import torch

    from raystudy.train import engine
    from raystudy.train.config import from_dict
    from raystudy.train.plan import resolve

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    for t in trials:
        engine.train(resolve(from_dict(t.config)))
    return time.perf_counter() - t0


def grid_wall(space_file: Path, extra: list[str]) -> float:
    work = Path(tempfile.mkdtemp(prefix="bg", dir="/tmp"))
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    env.pop("MLFLOW_TRACKING_URI", None)
    env.pop("RAY_ADDRESS", None)
    t0 = time.perf_counter()
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "raystudy.grid",
            "--space",
            str(space_file),
            "--quiet",
            "--num-cpus",
            "2",
            "--ray-temp-dir",
            str(work / "r"),
            *extra,
        ],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - t0
    shutil.rmtree(work, ignore_errors=True)
    if p.returncode != 0:
        sys.exit(f"grid failed:\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    return wall


def startup(workers: int, steps: int = 8) -> tuple[float, float]:
    """(trial wall inside Tune, the same training in-process) for one tiny trial."""
    work = Path(tempfile.mkdtemp(prefix="bs", dir="/tmp"))
    space = {
        "study": f"startup{workers}",
        "base": {
            "model": "vit_demo",
            "steps": steps,
            "warmup_steps": 1,
            "eval_every": steps,
            "log_every": steps,
            "batch_size": 32,
        },
        "grid": {"condition": "MHA", "lr": 0.1, "seed": 0},
        "datasets": {"digits_c": {}},
        "models": {"vit_demo": {"workers": workers, "cpu": 0.5 if workers > 1 else 1}},
    }
    f = work / "s.yaml"
    f.write_text(yaml.safe_dump(space))
    from raystudy.spaces import grids

    trials = grids.expand(grids.load_grid(str(f)))
    base = plain(trials)
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    env.pop("MLFLOW_TRACKING_URI", None)
    code = (
        "import time, sys; from pathlib import Path; from raystudy.spaces import grids; import ray\n"
        "from raystudy.driver import grid_run, local_ray\n"
        f"s = grids.load_grid({str(f)!r}); trials = grids.expand(s)\n"
        f"local_ray.start_ray(None, 2, {str(work / 'r')!r}, dashboard={workers > 1})\n"
        "t0 = time.perf_counter()\n"
        f"grid_run.run_grid(trials, label='bench', model='vit_demo', tracking_uri='sqlite:///{work}/m.db',\n"
        f"                  experiment='b', storage=Path({str(work / 'st')!r}), max_failures=0, max_concurrent=1,\n"
        "                  threads=1, verbose=0)\n"
        "print('WALL', time.perf_counter() - t0); ray.shutdown()\n"
    )
    p = subprocess.run([sys.executable, "-c", code], cwd=work, env=env, capture_output=True, text=True)
    shutil.rmtree(work, ignore_errors=True)
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("WALL")]
    if not line:
        sys.exit(f"startup run failed:\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    return float(line[0].split()[1]), base


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--conditions", help="restrict the demo grid (default: all 7)")
    ap.add_argument("--steps", type=int, help="override steps (default: the demo's 300)")
    args = ap.parse_args()
    from raystudy.spaces import grids, schema
    from raystudy.train import pretrain

    pretrain.ensure_weights("vit_demo")
    extra = []
    if args.conditions:
        extra += ["--conditions", args.conditions]
    if args.steps:
        extra += ["--set", f"steps={args.steps}", "--set", f"eval_every={max(1, args.steps // 6)}"]
    space = grids.load_grid("demo")
    overrides = {"steps": args.steps, "eval_every": max(1, args.steps // 6)} if args.steps else None
    conds = args.conditions.split(",") if args.conditions else None
    trials = grids.expand(space, None, conditions=conds, overrides=overrides)
    n = len(trials)
    print(f"demo grid: {n} trials; machine: {os.cpu_count()} CPUs", flush=True)
    t_plain = plain(trials)
    print(f"plain      {t_plain:8.1f} s  ({t_plain / n:.2f} s/trial)", flush=True)
    t_grid = grid_wall(schema.space_path("demo"), extra + ["--max-concurrent", "1"])
    print(f"grid       {t_grid:8.1f} s  ({t_grid / n:.2f} s/trial)", flush=True)
    t_grid2 = grid_wall(schema.space_path("demo"), extra)
    print(f"grid x2    {t_grid2:8.1f} s  ({t_grid2 / n:.2f} s/trial, 2 trials at a time)", flush=True)
    print(
        f"overhead per trial (grid - plain) / trials = {(t_grid - t_plain) / n:.2f} s   "
        f"(ratio grid/plain {t_grid / t_plain:.2f})"
    )
    for workers in (1, 2):
        wall, base = startup(workers)
        label = "nested TorchTrainer (2 DDP workers)" if workers > 1 else "plain Tune trial"
        print(
            f"trial start-up, {label:36s}: {wall - base:6.1f} s  (trial {wall:.1f} s - training {base:.1f} s)",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
