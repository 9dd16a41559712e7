"""Bad input to every CLI: exit status 2, one line on stderr starting ``error:``, no traceback,
nothing written and no Ray started -- all before any work.

One table, (CLI, argv, input files, fragment of the expected message). Each case runs the CLI's
``main(argv)`` in an empty working directory, with its input files in a folder beside it
(``{in}`` in argv); the working directory must stay empty and Ray uninitialised. A few cases run
as subprocesses: ``python -m raystudy data`` as a user types it, and a dry run whose answer
must come in seconds. The pass count per CLI is its clear/total.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.helpers import driver_env

REPO = Path(__file__).resolve().parent.parent
DEMO = yaml.safe_load((REPO / "search_spaces" / "demo.yaml").read_text())
OPTIMISER = yaml.safe_load((REPO / "search_spaces" / "optuna" / "optimiser.yaml").read_text())
FAST = ["--set", "steps=2", "--set", "warmup_steps=1", "--set", "eval_every=1"]  # if it trains anyway
BINARY = b"\x00\xff\xfe\x89PNG\r\n\x1a\n\x00\x00\xc3\x28"
RUN_HEADER = "dataset,condition,lr,seed,val_acc,test_acc\n"  # a per-run CSV's columns (no status: finished)


def _changed(space: dict, changes: dict) -> str:
    """``space`` with ``changes`` merged one level deep, as YAML."""
    raw = {**space}
    for k, v in changes.items():
        raw[k] = {**raw[k], **v} if isinstance(v, dict) and isinstance(raw.get(k), dict) else v
    return yaml.safe_dump(raw)


def grid_space(**changes) -> str:
    return _changed(DEMO, changes)


def search_space(**changes) -> str:
    return _changed(OPTIMISER, changes)


def G(**changes):  # a grid space file
    return {"s.yaml": grid_space(**changes)}


def S(**changes):  # a search space file
    return {"s.yaml": search_space(**changes)}


GS = ["--space", "{in}/s.yaml", "--dry-run"]
SS = ["--space", "{in}/s.yaml", "--dry-run"]
AFILE = {"afile": "not a folder\n"}
GARBAGE_PT = {"garbage.pt": b"PK\x03\x04 this is not a checkpoint" * 8}


def _safetensors(names: list[str]) -> bytes:
    """A safetensors file holding one float per name, written without torch."""
    import json
    import struct

    header = {n: {"dtype": "F32", "shape": [1], "data_offsets": [4 * i, 4 * i + 4]} for i, n in enumerate(names)}
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + b"\0" * (4 * len(names))


# A real checkpoint whose keys fit no ViT (the demo's included): refused before any trial.
MISFIT = {"w.safetensors": _safetensors(["blocks.0.nonsense"])}
# A real timm VisionTransformer whose attention-pooling head (attn_pool) no study component holds.
UNPLACEABLE = "vit_base_patch16_siglip_224"
STORE = {"mlflow.db": "TEMPLATE"}  # an empty MLflow store (a copy of the session's template)
DAMAGED = {"mlflow.db": "DAMAGED"}  # a real MLflow store holding a run, pages in its middle overwritten
DB = "sqlite:///{in}/mlflow.db"
BIG = str(10**12)

CASES = [
    # raystudy slurm: refused on the login node, before sbatch is asked anything
    ("slurm", ["--shared", "{in}/nope", "--", "grid"], {}, "no such folder; make it on a filesystem every node mounts"),
    ("slurm", ["--shared", "{in}/s", "--", "finetune"], {"s/": ""}, "use grid or search"),
    (
        "slurm",
        ["--shared", "{in}/s", "--store", "sqlite:///{in}/s/mlflow.db", "--", "grid"],
        {"s/": ""},
        "SQLite in the shared folder: SQLite's locks are unsafe on a network filesystem",
    ),
    ("slurm", ["--shared", "{in}/s", "--store", "postgresql://u:pw@db:5432/m"], {"s/": ""}, "names a secret"),
    ("slurm", ["--shared", "{in}/s", "--store", "file:///x"], {"s/": ""}, "use sqlite, postgres"),
    ("slurm", ["--shared", "{in}/s", "--nodes", "0"], {"s/": ""}, "--nodes must be >= 1"),
    # ------------------------------------------------------------------ grid
    (
        "grid",
        ["--space", "paper", "--datasets", "domainnet_clipart", "--set", "data_root={in}/data", "--dry-run"],
        {"data/domainnet/clipart/apple/0.jpg": b"\xff\xd8 one image, not the cleaned release's 48,129"},
        "1 images under",
    ),  # another DomainNet release: another seeded split, refused before anything runs
    ("grid", ["--set", "lr=nan", "--dry-run"], {}, "'lr' must be a finite number"),
    ("grid", ["--set", "lr=inf", "--dry-run"], {}, "'lr' must be a finite number"),
    ("grid", ["--set", "lr=-1", "--dry-run"], {}, "'lr' must be > 0"),
    ("grid", ["--set", "lr=[1,", "--dry-run"], {}, "cannot read '[1,'"),
    ("grid", ["--set", "steps=abc", "--dry-run"], {}, "'steps' must be an integer"),
    ("grid", ["--set", "lr", "--dry-run"], {}, "--set expects key=value"),
    ("grid", GS, G(base={"lr": float("nan")}), "'lr' must be a finite number"),
    ("grid", GS, G(grid={"lr": {"grid_search": [0.1, "abc"]}}), "'lr' must be a number"),
    ("grid", GS, G(grid={"lr": {"grid_search": [[0.1, 0.2]]}}), "'lr' must be a number"),
    ("grid", GS, G(grid={"lr": {"grid_search": [0.1, float("inf")]}}), "'lr' must be a finite number"),
    ("grid", GS, G(grid={"condition": {"grid_search": ["MHA", "FC9"]}}), "unknown component 'FC9'"),
    ("grid", GS, G(grid={"condition": {"grid_search": ["MHA", 5]}}), "condition"),
    ("grid", GS, G(grid={"condition": {"grid_search": ["MHA", ["FC1"]]}}), "condition"),
    ("grid", GS, G(grid={"seed": {"grid_search": [0, "x"]}}), "'seed' must be an integer"),
    ("grid", GS, G(grid=["lr"]), "grid must be a mapping"),
    ("grid", GS, G(base=[1, 2]), "base must be a mapping"),
    ("grid", GS, G(models={"vit_demo": {"workers": 0}}), "workers must be an integer >= 1"),
    ("grid", GS, G(models={"vit_demo": {"cpu": -1}}), "cpu must be a number >= 0"),
    ("grid", ["--adaptive", "asha", "--dry-run"], {}, "--adaptive 'asha': unknown policy; valid: identity"),
    (
        "grid",
        ["--adaptive", "seeds", "--dry-run"],
        {},
        "--adaptive 'seeds': unknown policy; valid: identity, halving, race",
    ),
    ("grid", GS, G(models={"vit_demo": {"gpu": "a"}}), "gpu must be a number >= 0"),
    ("grid", GS, G(models={"vit_demo": {"cpu": 1, "step_seconds": -2}}), "step_seconds must be"),
    ("grid", GS, G(models={"vit_demo": []}), "must be a mapping"),
    ("grid", GS, G(tune={"max_failures": "two"}), "max_failures must be an integer >= 0"),
    ("grid", GS, G(tune={"max_concurrent": 0}), "max_concurrent must be an integer >= 1"),
    ("grid", GS, G(tune={"threads_per_trial": -1}), "threads_per_trial must be an integer >= 1"),
    ("grid", GS, G(tune={"checkpoint_every_s": float("nan")}), "checkpoint_every_s must be a finite number"),
    ("grid", GS, G(optimizers={"sgd": {"lr_scale": "x"}}), "lr_scale must be a finite number > 0"),
    ("grid", GS, G(optimizers=["sgd"]), "optimizers must be a mapping"),
    ("grid", GS, G(datasets=["digits_c"]), "datasets must be a mapping"),
    ("grid", GS, G(study="../../x"), "study '../../x' must be a plain name"),
    ("grid", GS, {"s.yaml": BINARY}, "is not a readable text file"),
    ("grid", GS, {"s.yaml": "- a\n- b\n"}, "must be a mapping"),
    ("grid", GS, {"s.yaml": "base: {lr: [\n"}, "is not valid YAML"),
    ("grid", ["--space", "{in}/d.yaml", "--dry-run"], {"d.yaml/": None}, "is a folder, not a file"),
    ("grid", ["--max-concurrent", "-1", "--dry-run"], {}, "--max-concurrent must be >= 1"),
    ("grid", ["--max-concurrent", "0", "--dry-run"], {}, "--max-concurrent must be >= 1"),
    ("grid", ["--max-failures", "-1", "--dry-run"], {}, "--max-failures must be >= 0"),
    ("grid", ["--rehearse", "0"], {}, "--rehearse must be a finite number > 0"),
    ("grid", ["--rehearse", "-1", "--dry-run"], {}, "--rehearse must be a finite number > 0"),
    ("grid", ["--rehearse", "nan"], {}, "--rehearse must be a finite number > 0"),
    ("grid", ["--rehearse", "soon"], {}, "--rehearse takes seconds, a number > 0 and <= 3,600, got 'soon'"),
    ("grid", ["--experiments", "all", "--dry-run", "--rehearse"], {}, "--rehearse with --experiments"),
    ("grid", ["--num-cpus", "0", "--dry-run"], {}, "--num-cpus must be >= 1"),
    ("grid", ["--num-cpus", "-2", "--dry-run"], {}, "--num-cpus must be >= 1"),
    ("grid", ["--num-cpus", "x", "--dry-run"], {}, "invalid int value"),
    ("grid", ["--storage", "{in}/afile", "--dry-run"], AFILE, "is a file, not a folder"),
    ("grid", ["--storage", "/proc/raystudy-ro/ray", "--dry-run"], {}, "cannot write"),
    ("grid", ["--tracking-uri", "sqlite:////proc/mlflow.db", "--dry-run"], {}, "cannot write"),
    (
        "grid",
        ["--tracking-uri", "sqlite:///{in}/garbage.db", "--dry-run"],
        {"garbage.db": BINARY * 10},
        "is not an SQLite database",
    ),
    ("grid", ["--tracking-uri", "ftp://x", "--dry-run"], {}, "unsupported tracking URI"),
    ("grid", ["--set", "weights={in}/garbage.pt", "--dry-run"], GARBAGE_PT, "is not a model checkpoint"),
    ("grid", ["--set", "weights={in}/w.safetensors", "--dry-run"], MISFIT, "unexpected 1: blocks.0.nonsense"),
    ("grid", ["--model", UNPLACEABLE, "--dry-run"], {}, "13 parameter(s) belong to no component: attn_pool.latent"),
    ("grid", ["--model", "local-dir:{in}/m", "--dry-run"], {"m/": None}, "no config.json in"),
    ("grid", ["--model", "local-dir:{in}/nope", "--dry-run"], {}, "is not a folder"),
    ("grid", ["--model", "hf-hub:raystudy-tests/no-such-vit", "--dry-run"], {}, "'hf-hub:raystudy-tests/no-such-vit'"),
    ("grid", ["--set", "device=tpu", "--dry-run"], {}, "unknown device 'tpu'"),
    ("grid", ["--set", "betas=[0.9]", "--dry-run"], {}, "'betas' must be a list of 2 numbers"),
    ("grid", ["--set", "momentum=nan", "--dry-run"], {}, "'momentum' must be a finite number"),
    ("grid", ["--datasets", "", "--dry-run"], {}, "--datasets: empty list"),
    ("grid", ["--conditions", "MHA,FC9", "--dry-run"], {}, "unknown component 'FC9'"),
    ("grid", ["--model", "nope", "--dry-run"], {}, "unknown model 'nope'"),
    ("grid", ["--space", "nope", "--dry-run"], {}, "unknown search space 'nope'"),
    ("grid", ["--bogus"], {}, "unrecognized arguments: --bogus"),
    ("grid", ["--address", "no-port", "--tracking-uri", "sqlite:///{in}/mlflow.db"], STORE, "--address"),
    # ------------------------------------------------------------------ search
    ("search", ["--num-samples", "0", "--dry-run"], {}, "--num-samples must be >= 1"),
    ("search", ["--num-samples", "-3", "--dry-run"], {}, "--num-samples must be >= 1"),
    ("search", ["--num-samples", "x", "--dry-run"], {}, "invalid int value"),
    ("search", ["--time-budget", "nan", "--dry-run"], {}, "--time-budget must be a finite number > 0"),
    ("search", ["--time-budget", "-5", "--dry-run"], {}, "--time-budget must be a finite number > 0"),
    ("search", ["--time-budget", "0", "--dry-run"], {}, "--time-budget must be a finite number > 0"),
    ("search", ["--rehearse", "0", "--dry-run"], {}, "--rehearse must be a finite number > 0"),
    ("search", ["--rehearse", "soon"], {}, "--rehearse takes seconds, a number > 0 and <= 3,600, got 'soon'"),
    ("search", ["--test-seeds", "1,x", "--dry-run"], {}, "--test-seeds"),
    ("search", ["--test-seeds", ",", "--dry-run"], {}, "--test-seeds"),
    ("search", ["--set", "lr=nan", "--dry-run"], {}, "'lr' must be a finite number"),
    ("search", ["--set", "lr=[1,", "--dry-run"], {}, "cannot read '[1,'"),
    ("search", ["--num-cpus", "0", "--dry-run"], {}, "--num-cpus must be >= 1"),
    ("search", ["--storage", "{in}/afile", "--dry-run"], AFILE, "is a file, not a folder"),
    ("search", ["--conditions", "FC9", "--dry-run"], {}, "unknown component 'FC9'"),
    ("search", ["--dataset", "nope", "--dry-run"], {}, "unknown dataset 'nope'"),
    ("search", ["--model", "nope", "--dry-run"], {}, "unknown model 'nope'"),
    ("search", ["--model", UNPLACEABLE, "--dry-run"], {}, "belong to no component: attn_pool.latent"),
    ("search", ["--bogus"], {}, "unrecognized arguments: --bogus"),
    ("search", SS, S(budget={"num_samples": "abc"}), "num_samples must be an integer >= 1"),
    ("search", SS, S(budget={"num_samples": 0}), "num_samples must be an integer >= 1"),
    ("search", SS, S(budget={"time_budget_s": -5}), "time_budget_s must be a finite number > 0"),
    ("search", SS, S(budget={"time_budget_s": float("nan")}), "time_budget_s must be a finite number > 0"),
    ("search", SS, S(seed="abc"), "seed must be an integer"),
    # counts inside a space file have upper bounds too, from what they size
    ("search", SS, S(budget={"num_samples": 10**12}), "num_samples must be an integer <= 100000"),
    ("search", SS, S(budget={"time_budget_s": 1e12}), "time_budget_s must be a finite number <= 31622400"),
    ("search", SS, S(seed=2**64), "seed must be an integer <= 4294967295"),
    ("search", SS, S(test_seeds=[1, 2**40]), "test_seeds must be a list of integers >= 0 and < 4294967296"),
    ("grid", GS, G(tune={"max_concurrent": 10**9}), "max_concurrent must be an integer <= 100000"),
    ("grid", GS, G(tune={"max_failures": 10**6}), "max_failures must be an integer <= 100"),
    ("grid", GS, G(models={"vit_demo": {"workers": 10**6}}), "workers must be an integer <= 1024"),
    ("search", SS, S(test_seeds=["a"]), "test_seeds must be a list of integers"),
    ("search", SS, S(test_seeds=5), "test_seeds must be a list of integers"),
    ("search", SS, S(scheduler={"grace_period": "x"}), "grace_period must be an integer >= 1"),
    ("search", SS, S(scheduler={"reduction_factor": 1}), "reduction_factor must be an integer >= 2"),
    ("search", SS, S(conditions=["MHA", "FC9"]), "unknown component 'FC9'"),
    ("search", SS, S(conditions="MHA"), "conditions must be a list"),
    ("search", SS, S(conditions=[["MHA"]]), "condition"),
    ("search", SS, S(base={"lr": float("nan")}), "'lr' must be a finite number"),
    ("search", SS, S(params={"lr": {"loguniform": [float("nan"), 1.0]}}), "finite"),
    ("search", SS, S(params={"lr": {"uniform": [0.1, float("inf")]}}), "finite"),
    ("search", SS, S(models={"vit_demo": {"cpu": -1}}), "cpu must be a number >= 0"),
    ("search", SS, S(tune={"max_concurrent": -1}), "max_concurrent must be an integer >= 1"),
    ("search", SS, S(study="../../x"), "study '../../x' must be a plain name"),
    ("search", SS, {"s.yaml": BINARY}, "is not a readable text file"),
    ("search", SS, {"s.yaml": "[1, 2]\n"}, "must be a mapping"),
    # ------------------------------------------------------------------ finetune
    ("finetune", ["--lr", "nan"] + FAST, {}, "'lr' must be a finite number"),
    ("finetune", ["--lr", "inf"] + FAST, {}, "'lr' must be a finite number"),
    ("finetune", ["--lr", "-0.1"] + FAST, {}, "'lr' must be > 0"),
    ("finetune", ["--lr", "abc"] + FAST, {}, "'lr' must be a number"),
    ("finetune", ["--steps", "1.5"] + FAST[2:], {}, "'steps' must be an integer"),
    ("finetune", ["--set", "lr=[1,"] + FAST, {}, "cannot read '[1,'"),
    ("finetune", ["--set", "momentum=nan"] + FAST, {}, "'momentum' must be a finite number"),
    ("finetune", ["--set", "weight_decay=inf"] + FAST, {}, "'weight_decay' must be a finite number"),
    ("finetune", ["--set", "clip_grad=nan"] + FAST, {}, "'clip_grad' must be a finite number"),
    ("finetune", ["--set", "betas=[nan, 0.9]"] + FAST, {}, "'betas' must be a finite number"),
    ("finetune", ["--set", "num_workers=-1"] + FAST, {}, "'num_workers' must be >= 0"),
    ("finetune", ["--set", "colour=red"] + FAST, {}, "unknown config key 'colour'"),
    ("finetune", ["--condition", "FC9"] + FAST, {}, "unknown component 'FC9'"),
    ("finetune", ["--dataset", "nope"] + FAST, {}, "unknown dataset 'nope'"),
    ("finetune", ["--model", "resnet50"] + FAST, {}, "not a timm VisionTransformer"),
    ("finetune", ["--device", "cuda"] + FAST, {}, "CUDA is not available"),
    ("finetune", ["--device", "gpu"] + FAST, {}, "unknown device 'gpu'"),
    ("finetune", ["--weights", "{in}/garbage.pt"] + FAST, GARBAGE_PT, "is not a model checkpoint"),
    ("finetune", ["--weights", "{in}/nope.pt"] + FAST, {}, "does not exist"),
    ("finetune", ["--weights", "{in}/w.safetensors"] + FAST, MISFIT, "does not fit model 'vit_demo': missing 54"),
    ("finetune", ["--model", UNPLACEABLE] + FAST, {}, "belong to no component: attn_pool.latent"),
    ("finetune", ["--model", "local-dir:{in}/m"] + FAST, {"m/": None}, "no config.json in"),
    ("finetune", ["--out", "{in}/afile"] + FAST, AFILE, "is a file, not a folder"),
    ("finetune", ["--out", "/proc/raystudy-ro/out"] + FAST, {}, "cannot write"),
    ("finetune", ["--config", "{in}/bin.yaml"] + FAST, {"bin.yaml": BINARY}, "is not a readable text file"),
    ("finetune", ["--config", "{in}/list.yaml"] + FAST, {"list.yaml": "- 1\n- 2\n"}, "must be a mapping"),
    ("finetune", ["--config", "{in}/d.yaml"] + FAST, {"d.yaml/": None}, "is a folder, not a file"),
    ("finetune", ["--config", "{in}/c.yaml"] + FAST, {"c.yaml": "lr: .nan\n"}, "'lr' must be a finite number"),
    ("finetune", ["--config", "{in}/c.yaml"] + FAST, {"c.yaml": "lr: [0.1, 0.2]\n"}, "'lr' must be a number"),
    ("finetune", ["--bogus"], {}, "unrecognized arguments: --bogus"),
    ("finetune", ["--threads", "0"] + FAST, {}, "--threads must be >= 1"),
    ("finetune", ["--threads", "x"] + FAST, {}, "invalid int value"),
    ("finetune", ["--tracking-uri", "ftp://x"] + FAST, {}, "unsupported tracking URI"),
    (
        "finetune",
        ["--tracking-uri", "sqlite:///{in}/garbage.db"] + FAST,
        {"garbage.db": BINARY * 10},
        "is not an SQLite database",
    ),
    (
        "finetune",
        ["--dataset", "cifar10c_snow", "--set", "data_root={in}/none", "--set", "pretrained=false"] + FAST,
        {},
        "CIFAR-10-C",
    ),  # found missing at load time: no MLflow run, no files
    # ------------------------------------------------------------------ probe
    ("probe", ["--pairs", "0"], {}, "--pairs must be >= 1"),
    ("probe", ["--pairs", "x"], {}, "invalid int value"),
    ("probe", ["--batch-size", "0"], {}, "--batch-size must be >= 1"),
    ("probe", ["--num-workers", "-1"], {}, "--num-workers must be >= 0"),
    ("probe", ["--mode", "sideways"], {}, "sideways"),
    ("probe", ["--components", "FC9"], {}, "FC9"),
    ("probe", ["--device", "tpu"], {}, "unknown device 'tpu'"),
    ("probe", ["--device", "cuda", "--pairs", "8"], {}, "CUDA is not available"),
    ("probe", ["--model", "resnet50"], {}, "not a timm VisionTransformer"),
    ("probe", ["--dataset", "nope"], {}, "unknown dataset 'nope'"),
    ("probe", ["--source", "nope"], {}, "unknown dataset 'nope'"),
    ("probe", ["--weights", "{in}/garbage.pt", "--pairs", "8"], GARBAGE_PT, "is not a model checkpoint"),
    ("probe", ["--weights", "{in}/nope.pt"], {}, "does not exist"),
    ("probe", ["--weights", "{in}/w.safetensors", "--pairs", "8"], MISFIT, "does not fit model 'vit_demo'"),
    ("probe", ["--model", UNPLACEABLE, "--pairs", "8"], {}, "belong to no component: attn_pool.latent"),
    ("probe", ["--out", "{in}/afile", "--pairs", "8"], AFILE, "is a file, not a folder"),
    ("probe", ["--seed", "-1", "--pairs", "8"], {}, "--seed must be >= 0"),
    ("probe", ["--bogus"], {}, "unrecognized arguments: --bogus"),
    # ------------------------------------------------------------------ prefetch
    ("prefetch", [], {}, "nothing to fetch"),
    ("prefetch", ["--model", "nope"], {}, "nope"),
    ("prefetch", ["--datasets", "nope"], {}, "nope"),
    ("prefetch", ["--datasets", ","], {}, "--datasets"),
    ("prefetch", ["--datasets", "digits", "--data-root", "{in}/afile"], AFILE, "is a file, not a folder"),
    ("prefetch", ["--model", "vit_demo", "--hf-cache", "{in}/afile"], AFILE, "is a file, not a folder"),
    ("prefetch", ["--bogus"], {}, "unrecognized arguments: --bogus"),
    ("prefetch", ["--models", "nope"], {}, "unknown model 'nope'"),
    # ------------------------------------------------------------------ components
    ("components", ["--model", "nope"], {}, "unknown model 'nope'"),
    ("components", ["--model", "resnet50"], {}, "not a timm VisionTransformer"),
    ("components", ["--conditions", "FC9"], {}, "unknown component 'FC9'"),
    ("components", ["--conditions", ""], {}, "empty"),
    ("components", ["--conditions", "MHA,,FC1"], {}, "empty"),
    ("components", ["--bogus"], {}, "unrecognized arguments: --bogus"),
    ("components", ["extra"], {}, "unrecognized arguments: extra"),
    # ------------------------------------------------------------------ datasets
    ("datasets", ["--bogus"], {}, "unrecognized arguments: --bogus"),
    ("datasets", ["extra"], {}, "unrecognized arguments: extra"),
    # ------------------------------------------------------------------ raystudy report
    ("report", [], {}, "one of the arguments --experiment --csv is required"),
    ("report", ["--csv", "{in}/r.csv", "--bogus"], {"r.csv": "RUNS"}, "unrecognized arguments: --bogus"),
    ("report", ["--csv", "{in}/nope.csv"], {}, "does not exist"),
    ("report", ["--csv", "{in}/bin.csv"], {"bin.csv": BINARY * 4}, "is not a readable CSV"),
    ("report", ["--csv", "{in}/d.csv"], {"d.csv/": None}, "is a folder, not a file"),
    ("report", ["--csv", "{in}/bad.csv"], {"bad.csv": "a,b\n1,2\n"}, "column"),
    ("report", ["--csv", "{in}/empty.csv"], {"empty.csv": ""}, "empty"),
    ("report", ["--csv", "{in}/r.csv", "--rope", "nan"], {"r.csv": "RUNS"}, "--rope must be a finite number >= 0"),
    ("report", ["--csv", "{in}/r.csv", "--rope", "-1"], {"r.csv": "RUNS"}, "--rope must be a finite number >= 0"),
    ("report", ["--csv", "{in}/r.csv", "--bootstrap-reps", "0"], {"r.csv": "RUNS"}, "--bootstrap-reps must be >= 1"),
    ("report", ["--csv", "{in}/r.csv", "--bootstrap-reps", "x"], {"r.csv": "RUNS"}, "invalid int value"),
    ("report", ["--csv", "{in}/r.csv", "--select-on", "train"], {"r.csv": "RUNS"}, "invalid choice"),
    ("report", ["--csv", "{in}/r.csv", "--out", "{in}/afile"], {"r.csv": "RUNS", **AFILE}, "is a file, not a folder"),
    (
        "report",
        ["--csv", "{in}/r.csv", "--plasticity", "{in}/bin.csv"],
        {"r.csv": "RUNS", "bin.csv": BINARY * 4},
        "is not a readable CSV",
    ),
    ("report", ["--experiment", "nope", "--tracking-uri", "sqlite:///{in}/mlflow.db"], STORE, "nope"),
    (
        "report",
        ["--experiment", "x", "--tracking-uri", "sqlite:///{in}/garbage.db"],
        {"garbage.db": BINARY * 10},
        "is not an SQLite database",
    ),
    ("report", ["--experiment", "x", "--tracking-uri", "ftp://x"], {}, "unsupported tracking URI"),
    ("report", ["--experiment", "x"], {}, "no MLflow store at"),  # and no empty mlflow.db made
    ("report", ["--experiment", "x", "--tracking-uri", "sqlite:///{in}/none.db"], {}, "no MLflow store at"),
    # refused once the runs are read, still before the output folder (the default, analysis_out) exists
    (
        "report",
        ["--csv", "{in}/r.csv", "--reference", "XYZ"],
        {"r.csv": "RUNS"},
        "reference condition 'XYZ' is not among the conditions: MHA, FC1",
    ),
    (
        "report",
        ["--csv", "{in}/r.csv", "--gain-reference", "XYZ"],
        {"r.csv": "RUNS"},
        "gain reference 'XYZ' is not among the conditions: MHA, FC1",
    ),
    ("report", ["--csv", "{in}/r.csv", "--conditions", "MHA,XYZ"], {"r.csv": "RUNS"}, "no condition 'XYZ'"),
    ("report", ["--csv", "{in}/r.csv", "--datasets", "ds00,nope"], {"r.csv": "RUNS"}, "no dataset 'nope'"),
    (
        "report",
        ["--csv", "{in}/r.csv", "--paper-comparison"],
        {"r.csv": "RUNS"},
        "the compared condition(s) LN1, LN2, FC2 are not among the conditions analysed",
    ),
    (
        "report",
        ["--csv", "{in}/s.csv"],
        {"s.csv": "dataset,condition,mean\nA,MHA,0.9\nA,FC1,\nB,MHA,0.8\nB,FC1,0.7\n"},
        "condition 'FC1' has no usable finished run on A",
    ),
    (
        "report",
        ["--csv", "{in}/w.csv"],
        {"w.csv": "dataset,MHA,FC1\nA,90.1,\nB,80.0,79.0\n"},
        "condition 'FC1' has no usable finished run on A",
    ),
    (
        "report",
        ["--csv", "{in}/r.csv"],
        {"r.csv": RUN_HEADER + "A,MHA,0.1,0,0.8,0.7\nA,FC1,0.1,0,0.8,0.6\nB,MHA,0.1,0,0.8,0.7\n"},
        "condition 'FC1' has no runs on 1 of 2 datasets: B",
    ),
    (
        "report",
        ["--csv", "{in}/r.csv"],
        {"r.csv": RUN_HEADER + "A,MHA,0.1,0,,0.7\nA,FC1,0.1,0,,0.6\n"},
        "no validation accuracies (val_acc) to choose the lr on",
    ),
    # the first setting (model a) is fine, the second (model b) lacks FC1: neither is written
    (
        "report",
        ["--csv", "{in}/r.csv", "--conditions", "MHA,FC1"],
        {
            "r.csv": "model," + RUN_HEADER + "a,A,MHA,0.1,0,0.8,0.7\na,A,FC1,0.1,0,0.8,0.6\n"
            "b,A,MHA,0.1,0,0.8,0.7\nb,A,LN1,0.1,0,0.8,0.6\n"
        },
        "no condition 'FC1'",
    ),
    # ------------------------------------------------------------------ raystudy export
    ("export_best", [], {}, "the following arguments are required"),
    ("export_best", ["--experiment", "x", "--out", "{in}/o", "--bogus"], {}, "unrecognized arguments: --bogus"),
    (
        "export_best",
        ["--experiment", "nope", "--tracking-uri", "sqlite:///{in}/mlflow.db", "--out", "{in}/o"],
        STORE,
        "nope",
    ),
    (
        "export_best",
        ["--experiment", "x", "--tracking-uri", "ftp://x", "--out", "{in}/o"],
        {},
        "unsupported tracking URI",
    ),
    (
        "export_best",
        ["--experiment", "x", "--tracking-uri", "sqlite:///{in}/garbage.db", "--out", "{in}/o"],
        {"garbage.db": BINARY * 10},
        "is not an SQLite database",
    ),
    (
        "export_best",
        ["--experiment", "x", "--tracking-uri", "sqlite:///{in}/mlflow.db", "--out", "{in}/afile"],
        {**STORE, **AFILE},
        "is a file, not a folder",
    ),
    ("export_best", ["--experiment", "x", "--select-on", "train", "--out", "{in}/o"], {}, "invalid choice"),
    ("export_best", ["--experiment", "x", "--out", "{in}/o"], {}, "no MLflow store at"),
    # ------------------------------------------------------------------ raystudy replay
    ("replay", ["--experiment", "x"], {}, "the following arguments are required: --policy"),
    ("replay", ["--experiment", "x", "--policy", "asha"], {}, "--policy 'asha': unknown policy; valid: identity"),
    (
        "replay",
        ["--experiment", "nope", "--policy", "halving", "--tracking-uri", "sqlite:///{in}/mlflow.db"],
        STORE,
        "nope",
    ),
    (
        "replay",
        ["--experiment", "x", "--policy", "halving", "--tracking-uri", "ftp://x"],
        {},
        "unsupported tracking URI",
    ),
    (
        "replay",
        ["--experiment", "x", "--policy", "all", "--tracking-uri", "sqlite:///{in}/mlflow.db", "--out", "{in}/afile"],
        {**STORE, **AFILE},
        "is a file, not a folder",
    ),
]

CASES += [
    # ------------------------------------------------ a damaged store: refused before any work, left as it is
    ("finetune", ["--tracking-uri", DB] + FAST, DAMAGED, "is damaged (SQLite: database disk image is malformed)"),
    ("grid", ["--tracking-uri", DB, "--dry-run"], DAMAGED, ".recover"),
    ("grid", ["--tracking-uri", DB, "--address", "no-port"], DAMAGED, "is damaged"),
    ("search", ["--tracking-uri", DB, "--dry-run"], DAMAGED, "is damaged"),
    ("report", ["--experiment", "x", "--tracking-uri", DB], DAMAGED, "is damaged"),
    ("export_best", ["--experiment", "x", "--tracking-uri", DB, "--out", "{in}/o"], DAMAGED, "is damaged"),
    ("replay", ["--experiment", "x", "--policy", "all", "--tracking-uri", DB], DAMAGED, "is damaged"),
    # ------------------------------------------------ every count and seed within its bound
    ("finetune", ["--seed", "-1"] + FAST, {}, "'seed' must be >= 0 and < 2**32"),
    ("finetune", ["--seed", str(2**64 + 1)] + FAST, {}, "'seed' must be >= 0 and < 2**32"),
    ("finetune", ["--seed", str(2**32)] + FAST, {}, "'seed' must be >= 0 and < 2**32"),
    (
        "finetune",
        ["--steps", BIG, "--set", "warmup_steps=1", "--set", "eval_every=1"],
        {},
        "'steps' must be <= 10,000,000",
    ),
    ("finetune", ["--batch-size", BIG] + FAST, {}, "'batch_size' must be <= 65,536"),
    ("finetune", ["--probe-pairs", BIG] + FAST, {}, "'probe_pairs' must be <= 1,000,000"),
    ("finetune", ["--set", f"num_workers={BIG}"] + FAST, {}, "'num_workers' must be <= 256"),
    ("finetune", ["--set", f"eval_batch_size={BIG}"] + FAST, {}, "'eval_batch_size' must be <="),
    ("finetune", ["--set", f"lora_rank={BIG}"] + FAST, {}, "'lora_rank' must be <="),
    ("finetune", ["--threads", BIG] + FAST, {}, "--threads must be <= 1,024"),
    ("grid", ["--set", "seed=-1", "--dry-run"], {}, "'seed' must be >= 0 and < 2**32"),
    ("grid", GS, G(grid={"seed": {"grid_search": [0, 2**40]}}), "'seed' must be >= 0 and < 2**32"),
    ("grid", ["--set", f"steps={BIG}", "--dry-run"], {}, "'steps' must be <="),
    ("grid", ["--max-concurrent", BIG, "--dry-run"], {}, "--max-concurrent must be <="),
    ("grid", ["--max-failures", BIG, "--dry-run"], {}, "--max-failures must be <= 100"),
    ("grid", ["--rehearse", BIG], {}, "--rehearse must be <= 3,600 (seconds of one synthetic trial"),
    ("grid", ["--num-cpus", BIG, "--dry-run"], {}, "--num-cpus must be <= 1,024"),
    ("search", ["--num-samples", BIG, "--dry-run"], {}, "--num-samples must be <="),
    ("search", ["--time-budget", "1e300", "--dry-run"], {}, "--time-budget must be <="),
    ("search", ["--test-seeds", f"1,{2**40}", "--dry-run"], {}, "< 2**32"),
    ("search", ["--num-cpus", BIG, "--dry-run"], {}, "--num-cpus must be <="),
    ("search", ["--set", "seed=-1", "--dry-run"], {}, "'seed' must be >= 0 and < 2**32"),
    ("probe", ["--pairs", BIG], {}, "--pairs must be <= 1,000,000"),
    ("probe", ["--batch-size", BIG, "--pairs", "8"], {}, "--batch-size must be <= 65,536"),
    ("probe", ["--num-workers", BIG, "--pairs", "8"], {}, "--num-workers must be <= 256"),
    ("probe", ["--seed", str(2**32), "--pairs", "8"], {}, "--seed must be >= 0 and < 2**32"),
    ("report", ["--csv", "{in}/r.csv", "--bootstrap-seed", "-1"], {"r.csv": "RUNS"}, "--bootstrap-seed must be >= 0"),
    ("report", ["--csv", "{in}/r.csv", "--bootstrap-seed", str(2**64)], {"r.csv": "RUNS"}, "< 2**32"),
    ("report", ["--csv", "{in}/r.csv", "--bootstrap-reps", BIG], {"r.csv": "RUNS"}, "--bootstrap-reps must be <="),
    # ------------------------------------------------ flags that contradict, and a file that says nothing
    ("finetune", ["--no-save", "--out", "{in}/o"] + FAST, {}, "--out with --no-save"),
    ("finetune", ["--no-mlflow", "--tracking-uri", "ftp://x"] + FAST, {}, "--tracking-uri with --no-mlflow"),
    ("finetune", ["--no-mlflow", "--experiment", "e"] + FAST, {}, "--experiment with --no-mlflow"),
    ("finetune", ["--config", "{in}/c.yaml"] + FAST, {"c.yaml": ""}, "is empty"),
    ("finetune", ["--config", "{in}/c.yaml"] + FAST, {"c.yaml": "# lr: 0.1\n"}, "is empty"),
    ("finetune", ["--config", "{in}/c.yaml"] + FAST, {"c.yaml": "{}\n"}, "is empty"),
    ("grid", GS, {"s.yaml": ""}, "is empty"),
    ("search", SS, {"s.yaml": "# nothing\n"}, "is empty"),
    ("probe", ["--pairing", "sequential", "--seed", "3", "--pairs", "8"], {}, "--seed with --pairing sequential"),
    ("report", ["--csv", "{in}/r.csv", "--tracking-uri", "ftp://x"], {"r.csv": "RUNS"}, "--tracking-uri with --csv"),
    ("report", ["--csv", "{in}/r.csv", "--no-log"], {"r.csv": "RUNS"}, "--no-log with --csv"),
    (
        "report",
        ["--experiment", "x", "--plasticity", "{in}/p.csv", "--tracking-uri", DB],
        {**STORE, "p.csv": "a\n"},
        "--plasticity with --experiment",
    ),
    # ------------------------------------------------ a folder where a file belongs
    ("search", ["--space", "{in}/d.yaml", "--dry-run"], {"d.yaml/": None}, "is a folder, not a file"),
    ("finetune", ["--weights", "{in}/w.pt"] + FAST, {"w.pt/": None}, "is a folder, not a file"),
    ("probe", ["--weights", "{in}/w.pt", "--pairs", "8"], {"w.pt/": None}, "is a folder, not a file"),
    (
        "probe",
        ["--model", "gpt2_tiny", "--tokens", "{in}/t.npy", "--pairs", "8"],
        {"t.npy/": None},
        "is a folder, not a file",
    ),
    (
        "report",
        ["--csv", "{in}/r.csv", "--plasticity", "{in}/p.csv"],
        {"r.csv": "RUNS", "p.csv/": None},
        "is a folder, not a file",
    ),
    ("search", ["--tracking-uri", "foo://bar", "--dry-run"], {}, "unsupported tracking URI"),  # and nothing before it
]


def _image(mode: str = "RGB", fmt: str = "PNG", colour=None) -> bytes:
    """A tiny image file's bytes, made with PIL."""
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new(mode, (12, 12), colour if colour is not None else (40,) * len(mode)).save(buf, fmt)
    return buf.getvalue()


def photos(classes=("a", "b"), n: int = 6, folder: str = "photos", **extra) -> dict:
    """Input files: ``folder/<class>/<i>.png`` for each class, ``n`` images each, and ``extra`` files."""
    files = {f"{folder}/{c}/{i}.png": _image() for c in classes for i in range(n)}
    return {**files, **{f"{folder}/{k}": v for k, v in extra.items()}}


TRUNCATED = _image("RGB", "JPEG", (200, 10, 10))[:60]
OWN = ["--set", "dataset=mine", "--set", "data={in}/photos"]
CSV_OK = photos(folder="t")

# Your own data: refused before any trial starts, with one line, nothing recorded.
CASES += [
    ("finetune", OWN + FAST, {}, "does not exist"),
    ("finetune", OWN + FAST, photos(classes=("a",)), "has 1 class (a); a classifier needs at least 2"),
    ("finetune", OWN + FAST, {"photos/": None}, "has 0 classes"),
    ("finetune", OWN + FAST, {**photos(), **photos(classes=("c",), n=2)}, "class 'c' has 2 image(s)"),
    ("finetune", OWN + FAST, photos(**{"a/bad.png": b"not an image"}), "bad.png' is not an image or is truncated"),
    (
        "finetune",
        OWN + FAST,
        photos(**{"a/x.jpg": TRUNCATED, "b/y.jpg": TRUNCATED}),
        "x.jpg' is not an image or is truncated, and 1 other(s)",
    ),
    ("finetune", OWN + FAST, photos(classes=("val", "test")), "has test/, val/ but no train/"),
    (  # grey and CMYK are converted, not refused: the truncated JPEG beside them is what the line names
        "finetune",
        ["--dataset", "mine", "--data", "{in}/photos"] + FAST,
        photos(**{"a/cmyk.jpg": _image("CMYK", "JPEG"), "a/grey.png": _image("L"), "b/cut.jpg": TRUNCATED}),
        "cut.jpg' is not an image or is truncated; remove or replace it",
    ),
    ("finetune", ["--dataset", "mine", "--data", "{in}/nope"] + FAST, {}, "does not exist"),
    ("finetune", ["--set", "dataset=mine", "--set", "data={in}/t.txt"] + FAST, {"t.txt": "x"}, ".csv or .parquet"),
    (
        "finetune",
        ["--set", "dataset=mine", "--set", "data={in}/t.csv"] + FAST,
        {**CSV_OK, "t.csv": "path,label,split\nt/a/0.png,a,train\nt/b/0.png,b,train\nt/a/1.png,zebra,test\n"},
        "label 'zebra' (test row) names no class",
    ),
    (
        "finetune",
        ["--set", "dataset=mine", "--set", "data={in}/t.csv"] + FAST,
        {**CSV_OK, "t.csv": "path,label\nt/a/0.png,a\nt/b/0.png,b\nt/b/nope.png,b\n"},
        "path 't/b/nope.png' does not exist",
    ),
    (
        "finetune",
        ["--set", "dataset=mine", "--set", "data={in}/t.csv"] + FAST,
        {"t.csv": "file,y\n"},
        "lacks the column",
    ),
    ("finetune", ["--set", "dataset=my data", "--set", "data={in}/photos"] + FAST, photos(), "must be a plain name"),
    (
        "finetune",
        ["--set", "dataset=cifar10", "--set", "data={in}/photos"] + FAST,
        photos(),
        "names a registry dataset",
    ),
    ("grid", ["--data", "mine={in}/photos", "--dry-run"], photos(classes=("a",)), "has 1 class"),
    ("grid", ["--data", "mine={in}/photos", "--dry-run"], photos(**{"b/z.png": TRUNCATED}), "z.png' is not an image"),
    ("grid", ["--data", "mine", "--dry-run"], {}, "--data expects NAME=PATH"),
    ("grid", ["--data", "mine={in}/nope", "--dry-run"], {}, "does not exist"),
    ("grid", ["--data", "cifar10={in}/photos", "--dry-run"], photos(), "names a registry dataset"),
    (
        "grid",
        GS,
        {**photos(**{"a/bad.png": b"nope"}), "s.yaml": grid_space(datasets={"mine": {"data": "photos"}})},
        "bad.png' is not an image",
    ),  # a relative data path: from the space file's folder
    ("probe", ["--dataset", "mine", "--data", "{in}/photos", "--pairs", "8"], photos(classes=("a",)), "has 1 class"),
    (
        "probe",
        ["--dataset", "mine", "--data", "{in}/photos", "--pairs", "8"],
        photos(**{"b/z.png": TRUNCATED}),
        "z.png' is not an image",
    ),
    ("probe", ["--dataset", "mine", "--data", "{in}/nope"], {}, "does not exist"),
    ("probe", ["--data", "{in}/photos"], photos(), "--data needs --dataset NAME"),
    ("probe", ["--dataset", "cifar10", "--data", "{in}/photos"], photos(), "names a registry dataset"),
    ("probe", ["--model", "gpt2_tiny", "--dataset", "mine", "--data", "{in}/photos"], photos(), "reads token ids"),
    (  # the VTAB-1k draw sized against your pool in the check, not when a trial builds its splits
        "grid",
        ["--data", "mine={in}/photos", "--set", "low_data=true", "--dry-run"],
        photos(),
        "low_data_split vtab1k draws 800 + 200 images, but the training pool holds 10; use low_data_split: per_class",
    ),
    (
        "grid",
        GS,
        {**photos(), "s.yaml": grid_space(datasets={"mine": {"data": "photos"}}, base={"low_data": True})},
        "but the training pool holds 10; use low_data_split: per_class",
    ),
    ("finetune", OWN + ["--set", "low_data=true"] + FAST, photos(), "but the training pool holds 10"),
    ("search", ["--dataset", "mine", "--data", "{in}/photos", "--dry-run"], photos(classes=("a",)), "has 1 class"),
    ("search", ["--dataset", "mine", "--data", "{in}/nope", "--dry-run"], {}, "does not exist"),
    ("search", ["--data", "{in}/photos", "--dry-run"], photos(), "names a registry dataset"),
    (  # a relative data path: from the space file's folder
        "search",
        SS,
        {**photos(**{"a/bad.png": b"nope"}), "s.yaml": search_space(base={"dataset": "mine", "data": "photos"})},
        "bad.png' is not an image",
    ),
    (
        "search",
        ["--dataset", "mine", "--data", "{in}/photos", "--set", "low_data=true", "--dry-run"],
        photos(),
        "but the training pool holds 10; use low_data_split: per_class",
    ),
    ("init", ["--model", "vit_demo", "--data", "{in}/nope"], {}, "does not exist"),
    ("init", ["--model", "vit_demo", "--data", "{in}/photos"], photos(classes=("a",)), "has 1 class"),
    ("init", ["--model", "nope", "--data", "{in}/photos"], photos(), "unknown model 'nope'"),
    (
        "init",
        ["--model", "vit_demo", "--data", "{in}/photos", "--out", "{in}/s.yaml"],
        {**photos(), "s.yaml": "x"},
        "exists",
    ),
    ("init", ["--model", "vit_demo", "--data", "{in}/photos", "--steps", "1"], photos(), "--steps must be >= 2"),
    ("init", ["--model", "vit_demo", "--data", "{in}/photos", "--out", "{in}/s.txt"], photos(), "ends in .yaml"),
    ("init", ["--model", "vit_demo"], {}, "the following arguments are required: --data"),
    ("init", ["--model", "vit_demo", "--data", "{in}/photos", "--name", "a/b"], photos(), "must be a plain name"),
    ("init", ["--model", "vit_demo", "--data", "{in}/photos", "--seeds", "4"], photos(), "--seeds must be between 1"),
]

MAINS = {
    "grid": "raystudy.commands.grid",
    "search": "raystudy.commands.search",
    "finetune": "raystudy.commands.finetune",
    "probe": "raystudy.commands.probe",
    "prefetch": "raystudy.commands.prefetch",
    "components": "raystudy.commands.components",
    "datasets": "raystudy.commands.data",
    "report": "analysis.commands.report",
    "export_best": "analysis.commands.export",
    "replay": "analysis.commands.replay",
    "init": "raystudy.commands.init",
    "slurm": "raystudy.commands.slurm",
}


def runs_csv() -> str:
    from analysis.synthetic import fake_runs

    return fake_runs(n_datasets=2, conditions=("MHA", "FC1"), lrs=(0.1, 0.3), seeds=(0, 1)).to_csv(index=False)


def make_inputs(folder: Path, files: dict, stores: dict[str, Path]) -> None:
    folder.mkdir()
    for name, content in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        if name.endswith("/"):
            (folder / name.rstrip("/")).mkdir()
        elif isinstance(content, str) and content in stores:
            shutil.copy(stores[content], folder / name)
        elif content == "RUNS":
            (folder / name).write_text(runs_csv())
        elif isinstance(content, bytes):
            (folder / name).write_bytes(content)
        else:
            (folder / name).write_text(content)


def run_case(cli: str, argv: list[str], files: dict, tmp_path: Path, stores: dict[str, Path], capsys):
    """Run one case in-process; (status, stderr, stdout, what the working directory holds, Ray up)."""
    import importlib

    inputs, work = tmp_path / "in", tmp_path / "work"
    make_inputs(inputs, files, stores)
    work.mkdir()
    argv = [a.replace("{in}", str(inputs)) for a in argv]
    main = importlib.import_module(MAINS[cli]).main
    old = os.getcwd()
    os.chdir(work)
    try:
        capsys.readouterr()
        try:
            status = main(argv)
        except SystemExit as e:
            status = e.code
        except Exception as e:  # noqa: BLE001 - a traceback is what the table catches
            import traceback

            status = f"uncaught {type(e).__name__}: {e}"
            traceback.print_exc()
    finally:
        os.chdir(old)
    captured = capsys.readouterr()
    left = sorted(str(p.relative_to(work)) for p in work.rglob("*"))
    ray_up = "ray" in sys.modules and sys.modules["ray"].is_initialized()
    return status, captured.err, captured.out, left, ray_up


def case_id(case) -> str:
    cli, argv, files, _ = case
    return f"{cli}:{' '.join(argv)[:60]}:{'+'.join(files)[:30]}"


@pytest.fixture(scope="session")
def _damaged_mlflow_db(tmp_path_factory, _empty_mlflow_db):
    """A real MLflow store holding one finished run, with pages in the middle of the file
    overwritten: SQLite reads it as "database disk image is malformed"."""
    from mlflow import MlflowClient

    path = tmp_path_factory.mktemp("mlflow-damaged") / "mlflow.db"
    shutil.copy(_empty_mlflow_db, path)
    cl = MlflowClient(tracking_uri=f"sqlite:///{path}")
    run = cl.create_run(cl.create_experiment("x"))
    cl.log_param(run.info.run_id, "lr", 0.1)
    cl.log_metric(run.info.run_id, "val_acc", 0.5)
    cl.set_terminated(run.info.run_id)
    pages = path.stat().st_size // 4096
    with open(path, "r+b") as f:
        f.seek(pages // 2 * 4096)
        f.write(b"\xde\xad\xbe\xef" * 1024 * 8)
    return path


# Cases that refuse only once their data is found missing, after the run's first line.
SAYS_FIRST = {"finetune:--dataset cifar10c_snow"}


@pytest.mark.parametrize("cli,argv,files,needle", CASES, ids=[case_id(c) for c in CASES])
def test_bad_input_is_one_line_exit_2_before_any_work(
    cli, argv, files, needle, tmp_path, capsys, _empty_mlflow_db, _damaged_mlflow_db, monkeypatch
):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    stores = {"TEMPLATE": _empty_mlflow_db, "DAMAGED": _damaged_mlflow_db}
    status, err, out, left, ray_up = run_case(cli, argv, files, tmp_path, stores, capsys)
    lines = err.strip().splitlines()
    assert status == 2, (status, err[-2000:])
    assert len(lines) == 1 and lines[0].startswith("error: "), lines[-20:]
    assert "Traceback" not in err
    assert needle in lines[0], lines[0]
    assert left == [], left
    assert not ray_up
    if not any(case_id((cli, argv, files, needle)).startswith(s) for s in SAYS_FIRST):
        assert out == "", out[-2000:]  # nothing said before the refusal
    if "DAMAGED" in files.values():  # the store is left as it was: same bytes, no lock or journal beside it
        inputs = tmp_path / "in"
        assert sorted(p.name for p in inputs.iterdir()) == sorted(n.rstrip("/") for n in files)
        assert all(
            (inputs / n).read_bytes() == _damaged_mlflow_db.read_bytes() for n, c in files.items() if c == "DAMAGED"
        )


SUBPROCESS_CASES = [
    # as typed: the module a user runs (a module without argparse would ignore any flag, exit 0)
    ("datasets", ["--bogus"], "unrecognized arguments: --bogus"),
    ("grid", ["--num-cpus", "0", "--ray-temp-dir", "/tmp/rbad17"], "--num-cpus must be >= 1"),
    ("grid", ["--max-concurrent", "-1", "--ray-temp-dir", "/tmp/rbad17"], "--max-concurrent must be >= 1"),
    ("grid", ["--rehearse", "0", "--ray-temp-dir", "/tmp/rbad17"], "--rehearse must be a finite number > 0"),
]


@pytest.mark.parametrize(
    "cli,argv,needle", SUBPROCESS_CASES, ids=[f"{c}:{' '.join(a)}" for c, a, _ in SUBPROCESS_CASES]
)
def test_bad_input_as_a_user_types_it(cli, argv, needle, tmp_path):
    env = driver_env(PYTHONPATH=str(REPO))
    p = subprocess.run(
        [sys.executable, "-m", MAINS[cli], *argv], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], lines[-10:]
    assert list(tmp_path.iterdir()) == []


def _slurm_refused(tmp_path, env) -> list[str]:
    """`raystudy slurm --shared tmp_path/s -- grid` run in ``env``, refused: its one stderr line."""
    p = subprocess.run(
        [sys.executable, "-m", "raystudy", "slurm", "--shared", str(tmp_path / "s"), "--", "grid"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1, p.stderr[-2000:]
    return lines


def test_slurm_without_sbatch_on_the_path_is_refused(tmp_path):
    """`raystudy slurm` where there is no SLURM (no sbatch on the PATH): one line, exit 2."""
    (tmp_path / "s").mkdir()
    env = driver_env(PYTHONPATH=str(REPO), PATH=os.path.dirname(sys.executable))
    lines = _slurm_refused(tmp_path, env)
    assert lines[0].startswith("error: no SLURM here: sbatch is not on the PATH"), lines
    assert sorted(q.name for q in tmp_path.iterdir()) == ["s"] and not list((tmp_path / "s").iterdir())


def test_slurm_without_the_cluster_extra_is_refused_before_submitting(tmp_path):
    """`pip install -e .` without the `cluster` extra: no Flask-WTF, which the job's MLflow server
    (the basic-auth app) imports; refused in one line naming the extra, sbatch never called (before,
    the job was accepted and failed seconds after it started)."""
    (tmp_path / "s").mkdir()
    bin_, hidden = tmp_path / "bin", tmp_path / "hidden"
    bin_.mkdir()
    hidden.mkdir()
    (bin_ / "sbatch").write_text(f"#!/bin/sh\ntouch {tmp_path}/sbatch-called\necho 1\n")
    (bin_ / "sbatch").chmod(0o755)
    (hidden / "flask_wtf.py").write_text("raise ImportError(\"No module named 'flask_wtf'\")\n")
    env = driver_env(PYTHONPATH=f"{hidden}:{REPO}", PATH=f"{bin_}:{os.path.dirname(sys.executable)}")
    lines = _slurm_refused(tmp_path, env)
    assert lines[0].startswith("error: the job's MLflow server needs Flask-WTF"), lines
    assert 'pip install -e ".[cluster]"' in lines[0], lines
    assert not (tmp_path / "sbatch-called").exists() and not list((tmp_path / "s").iterdir())
    # a tracking server of yours: the job starts none, and nothing is asked of this environment
    p = subprocess.run(
        [sys.executable, "-m", "raystudy", "slurm", "--shared", str(tmp_path / "s"), "--store", "http://h:5000"]
        + ["--dry-run", "--", "grid"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0 and "dry run: nothing submitted" in p.stdout, p.stderr[-2000:]


def test_a_700000_trial_dry_run_answers_in_seconds(tmp_path):
    space = grid_space(
        grid={
            "seed": {"grid_search": list(range(12_500))},  # x 4 demo datasets
            "lr": {"grid_search": [0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0]},
            "condition": {"grid_search": ["MHA", "FC1"]},
        }
    )
    (tmp_path / "big.yaml").write_text(space)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    t0 = time.monotonic()
    p = subprocess.run(
        [sys.executable, "-m", "raystudy.grid", "--space", str(tmp_path / "big.yaml"), "--dry-run"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    took = time.monotonic() - t0
    assert p.returncode == 0, p.stderr[-2000:]
    assert "700000 trials" in p.stdout.replace(",", "")
    assert took < 30, f"{took:.0f} s"  # includes interpreter and torch start-up on a loaded 2-core box
