"""Pretrained weights that raystudy builds itself: a local model's recipe, trained once and cached.

A model in ``registry.LOCAL_MODELS`` with a ``pretrain`` recipe (the offline demo's backbone) gets
its weights here, from data that ships offline, the way a hub checkpoint gets them from a
download: ``python -m raystudy prefetch --model NAME`` runs it, and every CLI runs it before
starting work, so trials only ever load a finished file.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Callable
from pathlib import Path

from raystudy import paths
from raystudy.data.registry import check_dataset
from raystudy.models import registry
from raystudy.train.config import from_dict


def ensure_weights(name: str, log: Callable[[str], None] | None = print) -> Path | None:
    """The weights file of local model ``name``, built once if missing; None for hub models.

    A file lock keeps concurrent callers from pretraining twice; the file appears atomically.
    """
    recipe = registry.pretrain_recipe(name)
    if recipe is None:
        return None
    path = registry.weights_file(name)
    if path.is_file() and registry.built_weights_problem(path) is None:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(f".{path.name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.is_file():
            problem = registry.built_weights_problem(path)
            if problem is None:
                return path
            if log:
                log(f"weights file {path} is corrupt ({problem}); rebuilding it")
        import torch  # only to build: checking a finished file (every CLI, every time) needs none

        from raystudy.train import engine
        from raystudy.train.plan import resolve

        cfg = from_dict(recipe)
        if log:
            log(
                f"first use: pretraining {cfg.model} on {cfg.dataset} once ({cfg.steps} steps on "
                f"{cfg.device}, about a minute), cached at {path}"
            )
        t0 = time.perf_counter()
        model = registry.create_model(cfg.model, check_dataset(cfg.dataset).num_classes, pretrained=False)
        res = engine.train(resolve(cfg), model=model)
        if log:
            log(
                f"pretrained {cfg.model} in {time.perf_counter() - t0:.0f} s: source test accuracy "
                f"{res['test_acc']:.3f}"
            )
        tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
        torch.save(model.state_dict(), tmp)
        registry.weights_manifest(path).unlink(missing_ok=True)
        os.replace(tmp, path)  # atomic: a reader never sees half a file
        paths.write_manifest(registry.weights_manifest(path), [path], registry.WEIGHTS_BUILDER)
    return path
