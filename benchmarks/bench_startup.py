"""What a fresh process costs before its first useful work, with and without scipy.stats.

    python benchmarks/bench_startup.py              # both processes, 3 runs of each variant
    python benchmarks/bench_startup.py --only driver --reps 1

A grid starts a driver and a trial worker per CPU; every Tune run, retry and test stage starts
new workers. Each pays its imports in CPU seconds before it trains. Two such processes, each in
a fresh interpreter:

- *worker*: what a trial worker imports (ray.tune, torch, timm, the engine) and one plasticity
  probe (a random-init tiny ViT, so that no weights are needed);
- *driver*: the grid driver's console ranking over a small runs table.

Each runs as it is, and with ``import scipy.stats`` first: what the probe's t interval and the
ranking would cost if they needed scipy.stats. Runs alternate between the variants, and
the medians of the child's CPU seconds (user + system) are printed with their ratio. Run it on a
quiet machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CODE = {
    "worker": """
import ray.tune, torch, timm
from raystudy.train import engine, trial
from raystudy.measure import plasticity
from timm.models.vision_transformer import VisionTransformer
torch.manual_seed(0)
vit = VisionTransformer(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=2, num_classes=10).eval()
rows = plasticity.probe(vit, [(torch.randn(16, 3, 32, 32), torch.randn(16, 3, 32, 32))], mode="both")
assert len(rows) == 2 * 2 * 5
""",
    "driver": """
import pandas as pd
from analysis import tables
from raystudy.commands import grid
runs = pd.DataFrame([dict(dataset=d, condition=c, lr=lr, seed=s, val_acc=0.5 + 0.01 * s, test_acc=0.4 + 0.02 * lr,
                          status="finished")
                     for d in ("a", "b") for c in ("MHA", "LN2", "FC1") for lr in (0.1, 0.3) for s in (0, 1)])
assert len(tables.closing_ranking(runs)) == 3 and grid.main
""",
}


def child_cpu_s(code: str) -> float:
    """CPU seconds (user + system) of a fresh interpreter running ``code``; it must succeed."""
    before = os.times()
    p = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    after = os.times()
    if p.returncode != 0:
        raise SystemExit(f"the benchmark's process failed:\n{p.stderr[-2000:]}")
    return (after.children_user - before.children_user) + (after.children_system - before.children_system)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    ap.add_argument("--only", choices=sorted(CODE), help="one of the processes (default: both)")
    ap.add_argument("--reps", type=int, default=3, help="runs of each variant (default 3)")
    args = ap.parse_args(argv)
    if args.reps < 1:
        print(f"error: --reps must be >= 1, got {args.reps}", file=sys.stderr)
        return 2
    print(f"{'process':8} {'now (CPU s)':>12} {'+ scipy.stats':>14} {'ratio':>7}")
    for name in [args.only] if args.only else sorted(CODE, reverse=True):
        now, before = [], []
        for _ in range(args.reps):  # alternating: a drifting machine shifts both alike
            now.append(child_cpu_s(CODE[name]))
            before.append(child_cpu_s("import scipy.stats\n" + CODE[name]))
        a, b = statistics.median(now), statistics.median(before)
        print(f"{name:8} {a:12.2f} {b:14.2f} {a / b:7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
