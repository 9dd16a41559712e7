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
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from raystudy import cli
from raystudy.bounds import BOUNDS
from raystudy.data import datasets, userdata
from raystudy.errors import ConfigError
from raystudy.models import preflight, registry
from raystudy.spaces import grids, schema

PAPER_BATCH = 512
DEMO_BATCH = 64  # the demo grid's, for the demo model


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


def dataset_name(data: str, name: str | None) -> str:
    """The dataset's name: ``name``, or the data's file or folder name made plain."""
    if name is None:
        stem = data[len(userdata.HF_PREFIX) :].rsplit("/", 1)[-1] if data.startswith(userdata.HF_PREFIX) else ""
        stem = stem or Path(data).stem or "data"
        name = re.sub(r"[^A-Za-z0-9_-]+", "_", stem).strip("_") or "data"
        if name in datasets.DATASETS:
            name += "_own"
    return userdata.check_name(name)


def protocol(n_train: int, demo: bool, steps: int | None = None) -> dict[str, int]:
    """``grids.scaled_protocol`` of ``n_train`` training images from the paper's batch (the
    demo's for the demo model)."""
    return grids.scaled_protocol(n_train, DEMO_BATCH if demo else PAPER_BATCH, steps)


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


def space_doc(model: str, name: str, data_ref: str, proto: dict[str, int], seeds: int | None = None) -> dict[str, Any]:
    """The space as data: the paper's base, conditions, lrs, seeds and optimizers; the model's
    resources and tuning (the paper's, the demo's for the demo model); the dataset with its steps."""
    paper, demo = grids.load_grid("paper"), grids.load_grid("demo")
    is_demo = model in demo.models
    src = demo if is_demo else paper
    base = {k: v for k, v in paper.base.items() if k not in ("model", "batch_size", "eval_every", "warmup_steps")}
    if registry.input_config(model)["in_chans"] != 3:
        base["normalization"] = "checkpoint"  # ImageNet's statistics are for RGB models
    base = {"model": model, "batch_size": proto["batch_size"], **base}
    grid = {k: {"grid_search": list(v)} for k, v in paper.grid.items()}
    grid["seed"]["grid_search"] = grid["seed"]["grid_search"][:seeds]
    entry = {"data": data_ref, **{k: proto[k] for k in ("steps", "warmup_steps", "eval_every")}}
    known = src.models.get(model) or src.models.get(registry.resolve_name(model))
    resources = {k: v for k, v in (known or {"gpu": 1, "cpu": 8}).items() if v is not None and v != {}}
    return {
        "study": name,
        "description": f"{model} on your own data {name}: the paper's protocol scaled to it (raystudy init)",
        "base": base,
        "grid": grid,
        "datasets": {name: entry},
        "optimizers": paper.optimizers,
        "models": {model: resources},
        "tune": {k: v for k, v in schema.tune_options(src).items() if v is not None},
    }


def render(doc: dict[str, Any], part: userdata.Partition, proto: dict[str, int], command: str) -> str:
    """The space file's text: each section of ``doc`` under a comment that says where it comes from."""
    n_pool, n_test = len(part.pool.labels), len(part.test.labels)
    split = "given" if part.test_given else "fixed: 20% of each class by a fixed seed"
    val = "its given val split" if part.val is not None else "the run's 80/20 train/val split per seed"
    why = {
        "study": [
            f"Written by: {command}",
            f"Data: {n_pool:,} images for training and validation ({val});",
            f"test split {n_test:,} ({split}), recorded in MLflow with its size and the hash of its file list.",
            "Run it:  raystudy grid --space THIS_FILE [--dry-run] [--adaptive race] [--optimizers sgd,adamw]",
        ],
        "base": ["The paper's protocol (search_spaces/paper.yaml), its batch cut to the data."],
        "grid": ["The paper's seven conditions, lr grid (SGD; AdamW: x0.01 by lr_scale) and seeds."],
        "datasets": [
            f"Steps: {grids.EPOCHS} epochs of the training split, between {grids.MIN_STEPS} and the paper's "
            f"{grids.PAPER_STEPS:,} (unless --steps);",
            f"warmup {grids.WARMUP_SHARE:.0%} of them and {grids.EVALUATIONS} evaluations a run, as the paper.",
            "data is relative to this file's folder.",
        ],
        "optimizers": ["The paper's optimizers; the grid runs SGD, add --optimizers sgd,adamw for its ablation."],
        "models": ["Resources per trial (step_seconds prices the dry run; see raystudy.measure.costs)."],
        "tune": ["Ray Tune: retries, threads and checkpoint cadence."],
    }
    text = []
    for key, value in doc.items():
        text += [f"# {line}" for line in why.get(key, [])]
        flow = None if isinstance(value, dict) else False  # sections: short mappings on one line
        text.append(yaml.safe_dump({key: value}, sort_keys=False, default_flow_style=flow, width=100).rstrip())
    return "\n".join(text) + "\n"


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
