"""A starter grid space for your model and your own images: the paper's protocol scaled to the
data, written as a YAML document with its comments."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from raystudy.data import userdata
from raystudy.data.registry import DATASETS
from raystudy.models import registry
from raystudy.spaces import grids, schema

PAPER_BATCH = 512
DEMO_BATCH = 64  # the demo grid's, for the demo model


def dataset_name(data: str, name: str | None) -> str:
    """The dataset's name: ``name``, or the data's file or folder name made plain."""
    if name is None:
        stem = data[len(userdata.HF_PREFIX) :].rsplit("/", 1)[-1] if data.startswith(userdata.HF_PREFIX) else ""
        stem = stem or Path(data).stem or "data"
        name = re.sub(r"[^A-Za-z0-9_-]+", "_", stem).strip("_") or "data"
        if name in DATASETS:
            name += "_own"
    return userdata.check_name(name)


def protocol(n_train: int, demo: bool, steps: int | None = None) -> dict[str, int]:
    """``grids.scaled_protocol`` of ``n_train`` training images from the paper's batch (the
    demo's for the demo model)."""
    return grids.scaled_protocol(n_train, DEMO_BATCH if demo else PAPER_BATCH, steps)


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
