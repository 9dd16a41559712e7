"""Write a starter grid space for your model and your own images: the paper's protocol scaled to the data.

    raystudy init --model vit_base --data ./photos                 # writes space.yaml, prints its dry run
    raystudy init --model vit_demo --data photos.csv --out demo_space.yaml --steps 20
    raystudy grid --space space.yaml                               # then run it as it is

The data is checked in full first (every image decoded once; bad data is one line, exit 2, and
nothing is written). The space takes the paper's lr grids per optimizer, its seeds and its seven
conditions (search_spaces/paper.yaml); the steps are a few epochs of the training split, between
a floor and the paper's longest grid, with warmup and evaluation cadence in the paper's
proportions. The written file is commented; ``--out`` is never overwritten. Its dry run (trials,
GPU-hours, and what ``--adaptive race`` would spend) is printed by ``raystudy grid --dry-run``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from raystudy.bounds import BOUNDS
from raystudy.commands import cli
from raystudy.data import userdata
from raystudy.errors import ConfigError
from raystudy.models import preflight, registry
from raystudy.spaces import grids
from raystudy.spaces.starter import dataset_name, protocol, render, space_doc


def build_parser() -> cli.Parser:
    """The command line's flags."""
    ap = cli.Parser("raystudy init", __doc__)
    ap.add_argument("--model", required=True, help="the model to finetune (alias, timm ViT name or vit_demo)")
    ap.add_argument(
        "--data",
        required=True,
        help="your images: a folder of class folders (or of train/, val/, test/), a .csv/.parquet of "
        "path,label[,split], a save_to_disk folder, or hf:NAME",
    )
    ap.add_argument("--name", help="the dataset's name in the study (default: from the data's file or folder name)")
    ap.add_argument(
        "--out", default="space.yaml", help="the space file to write (default: space.yaml; never overwritten)"
    )
    ap.add_argument(
        "--steps", type=int, help=f"steps per trial instead of the scaled protocol's (at most {BOUNDS['steps'].high:,})"
    )
    ap.add_argument(
        "--seeds",
        type=int,
        help="the first N of the paper's seeds (default: all three; one makes a quick first pass)",
    )
    return ap


def check(args) -> tuple[Path, str, str, list[str], userdata.Partition]:
    """Every check before the file is written: (out, model, data, notes, partition); ConfigError in one line."""
    out = Path(args.out)
    if out.exists():
        raise ConfigError(f"--out {args.out!r} exists; init never overwrites a file: give another --out or remove it")
    if out.suffix not in (".yaml", ".yml"):
        raise ConfigError(f"--out {args.out!r}: a space file ends in .yaml or .yml")
    cli.check_folder("--out", out.absolute().parent)
    registry.check_model(args.model)
    if args.steps is not None and not 2 <= args.steps <= BOUNDS["steps"].high:
        raise ConfigError(f"--steps must be >= 2 (warmup takes one) and <= {BOUNDS['steps'].high:,}, got {args.steps}")
    seeds = len(grids.load_grid("paper").grid["seed"])
    if args.seeds is not None and not 1 <= args.seeds <= seeds:
        raise ConfigError(f"--seeds must be between 1 and the paper's {seeds}, got {args.seeds}")
    data = userdata.resolve(args.data)
    if registry.input_config(args.model).get("tokens"):
        raise ConfigError(f"model {args.model!r} reads token ids; your own data are images")
    preflight.check(args.model, skip_registered=True)  # the partition, before the data's full scan
    notes = cli.check_data([data])
    return out, args.model, data, notes, userdata.partition(userdata.scan(data))


def main(argv: list[str] | None = None) -> int:
    """Check the data, write the space, print its dry run; the exit status (2: bad input or data)."""
    args = build_parser().parse_args(argv)
    try:
        name = dataset_name(args.data, args.name)  # before the data's full check: it costs its time
        out, model, data, notes, part = check(args)
    except ConfigError as e:
        return cli.fail(e)
    for note in notes:
        print(note)
    proto = protocol(grids.training_size(part), model == "vit_demo", args.steps)
    ref = data if data.startswith(userdata.HF_PREFIX) else os.path.relpath(data, out.absolute().parent)
    command = "raystudy init " + " ".join(argv if argv is not None else sys.argv[1:])
    text = render(space_doc(model, name, ref, proto, args.seeds), part, proto, command)
    out.absolute().parent.mkdir(parents=True, exist_ok=True)
    with open(out, "x", encoding="utf-8") as f:  # "x": never over a file that appeared meanwhile
        f.write(text)
    n_images = len(part.pool.labels) + len(part.test.labels) + (len(part.val.labels) if part.val else 0)
    print(f"wrote {out}: {model} on {name} ({n_images:,} images), {proto['steps']:,} steps a trial", flush=True)
    dry = [sys.executable, "-m", "raystudy", "grid", "--space", str(out), "--dry-run", "--adaptive", "race"]
    return subprocess.run(dry, check=False).returncode
