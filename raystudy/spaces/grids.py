"""Grids: a grid file read and checked, the paper's protocol scaled to the data, and every
trial it expands to (a validated flat config with its key, resources and cost)."""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from raystudy.data import userdata
from raystudy.data.source import VAL_FRACTION
from raystudy.errors import ConfigError
from raystudy.measure import costs
from raystudy.models import components
from raystudy.spaces.schema import GRID, canonical_condition, grid_values, model_options, read_space, space_path
from raystudy.train.config import (
    FinetuneConfig,
    check_value,
    from_dict,
    trial_key,
    validate,
)

# ---------------------------------------------------------------- grids


@dataclass(frozen=True)
class Space:
    """A grid as data: base config, grid axes, per-dataset/optimizer/model overrides."""

    name: str
    study: str
    base: dict[str, Any]
    grid: dict[str, list]
    datasets: dict[str, dict[str, Any]]
    optimizers: dict[str, dict[str, Any]]
    models: dict[str, dict[str, Any]] = field(default_factory=dict)
    tune: dict[str, Any] = field(default_factory=dict)
    description: str = ""
    step_times: Path | None = None  # measured step times (raystudy.measure.costs), if the space names a file
    experiments: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> models, optimizers, datasets


def load_grid(name_or_path: str) -> Space:
    """Read and check a grid space; every error is one line naming the bad key or value."""
    path = space_path(name_or_path)
    f = read_space(path, GRID, study=path.stem)
    # Constants are typed here even where an axis overrides them (base lr: .nan is a mistake).
    typed = [("base", f["base"])]
    typed += [
        (f"optimizers.{o}", {k: v for k, v in over.items() if k != "lr_scale"}) for o, over in f["optimizers"].items()
    ]
    typed += [(f"models.{m}.config", o.get("config") or {}) for m, o in f["models"].items()]
    for where, section in typed:
        try:
            from_dict(section)
        except ConfigError as e:
            raise ConfigError(f"{path.name}: {where}: {e}") from None
    return Space(
        name=path.stem,
        study=f["study"],
        base=data_resolved(f["base"], path.parent),
        grid=f["grid"],
        datasets={ds: data_resolved(entry, path.parent) for ds, entry in f["datasets"].items()},
        optimizers=f["optimizers"],
        models=f["models"],
        tune=f["tune"],
        description=f["description"],
        step_times=path.parent / f["step_times"] if f["step_times"] else None,
        experiments=_check_experiments(path.name, f),
    )


def data_resolved(section: dict[str, Any], folder: Path) -> dict[str, Any]:
    """``section`` with its ``data`` (your own images: a path, or a grid_search of paths) made
    absolute against the space file's ``folder``, so every worker reads the same place."""
    value = section.get("data")
    if isinstance(value, str):
        return {**section, "data": userdata.resolve(value, folder)}
    if isinstance(value, dict) and isinstance(value.get("grid_search"), list):
        paths_ = [userdata.resolve(v, folder) if isinstance(v, str) else v for v in value["grid_search"]]
        return {**section, "data": {"grid_search": paths_}}
    return section


# The paper's protocol scaled to a dataset of your own (``scaled_protocol``): its steps are many
# epochs of large benchmarks, too many for a small folder of images and too few for a large one.
EPOCHS = 10  # passes over the training split a run takes, before the bounds below
MIN_STEPS = 100  # a floor for small data: enough steps for warmup and 20 evaluations
PAPER_STEPS = 10_000  # the paper's CIFAR grid, its longest but DomainNet's
WARMUP_SHARE = 0.2  # the paper: 2,000 warmup steps of 10,000
EVALUATIONS = 20  # the paper: every 500 of 10,000 steps (CIFAR), 250 of 5,000 (Flowers102)


def scaled_protocol(n_train: int, batch: int, steps: int | None = None) -> dict[str, int]:
    """Batch size, steps, warmup and evaluation cadence for ``n_train`` training images:
    ``batch`` cut to the data, ``EPOCHS`` epochs between ``MIN_STEPS`` and ``PAPER_STEPS`` (or
    ``steps``), warmup and evaluations in the paper's proportions."""
    batch = min(batch, 2 ** int(math.log2(max(1, n_train))))
    if steps is None:
        steps = min(PAPER_STEPS, max(MIN_STEPS, math.ceil(EPOCHS * n_train / batch)))
    return {
        "steps": steps,
        "warmup_steps": max(1, min(round(WARMUP_SHARE * steps), steps - 1)),
        "eval_every": max(1, steps // EVALUATIONS),
        "batch_size": batch,
    }


def training_size(part: userdata.Partition) -> int:
    """The images a run trains on: the pool, less the run's validation split where none is given."""
    n = len(part.pool.labels)
    return n if part.val is not None else n - int(round(n * VAL_FRACTION))


def with_data(space: Space, entries: dict[str, str]) -> Space:
    """``space`` with a dataset per ``entries`` item (name -> your own data's location, made
    absolute against the working directory), each with the space's batch and the paper's steps
    scaled to its size (``scaled_protocol``, as ``raystudy init`` writes them): ``grid --data NAME=PATH``."""
    batch = space.base.get("batch_size", FinetuneConfig.batch_size)
    added = {}
    for name, data in entries.items():
        where = userdata.resolve(data)
        n = training_size(userdata.partition(userdata.scan(where)))
        added[name] = {"data": where, **scaled_protocol(n, batch)}
    return replace(space, datasets={**space.datasets, **added})


def _check_experiments(file: str, f: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The file's experiments, each naming only models, optimizers and datasets the file has."""
    for name, e in f["experiments"].items():
        for what, have in (("models", f["models"]), ("optimizers", f["optimizers"]), ("datasets", f["datasets"])):
            bad = [v for v in e[what] if v not in have]
            if bad:
                raise ConfigError(
                    f"{file}: experiments.{name}.{what}: {', '.join(bad)} not in the file's {what!r}; "
                    f"valid: {', '.join(have)}"
                )
    return f["experiments"]


def experiment_datasets(space: Space, model: str, optimizer: str) -> list[str] | None:
    """The datasets the space's experiments run ``model`` with ``optimizer`` on, in the space's
    order; None where no experiment names the pair (then every dataset is the grid's)."""
    grid_opts = [o for o in space.grid.get("optimizer", list(space.optimizers))]
    found = [
        e
        for e in space.experiments.values()
        if (not e["models"] or model in e["models"]) and optimizer in (e["optimizers"] or grid_opts)
    ]
    if not found:
        return None
    wanted = {d for e in found for d in (e["datasets"] or space.datasets)}
    return [d for d in space.datasets if d in wanted]


@dataclass(frozen=True)
class Trial:
    """One trial: its key, the flat finetuning ``config``, and the resources it asks for."""

    key: str
    config: dict[str, Any]
    gpu: float
    cpu: float
    workers: int

    def as_dict(self) -> dict[str, Any]:
        """The trial as Tune carries it in its param space (``finetune``: the flat config)."""
        return {"key": self.key, "finetune": self.config, "gpu": self.gpu, "cpu": self.cpu, "workers": self.workers}


def _cells(
    space: Space,
    model: str | None,
    datasets: list[str] | None,
    conditions: list[str] | None,
    optimizers: list[str] | None,
    overrides: dict[str, Any] | None,
    scope: dict[str, list[str]] | None = None,
):
    """The grid as cells: per dataset × optimizer × combination of the axes other than ``seed``,
    the validated flat config (seed as the first of the cell's seeds) and the cell's seeds.
    ``scope`` limits an optimizer to its datasets (``experiment_datasets``); others take them all.

    Validation never looks at the seed (its type is checked once per value), so a grid of many
    seeds is validated per cell, not per trial; identical cells are validated once.
    """
    model = model or space.base.get("model", FinetuneConfig.model)
    mopts = model_options(space.models, model)
    ds_list = datasets or list(space.datasets)
    opt_list = optimizers or [o for o in space.grid.get("optimizer", list(space.optimizers))]
    checked: dict[str, dict[str, Any]] = {}
    for ds in ds_list:
        for opt in opt_list:
            if not isinstance(opt, str) or opt not in space.optimizers:
                raise ConfigError(
                    f"optimizer {opt!r} has no section in the space's 'optimizers'; "
                    f"valid: {', '.join(space.optimizers)}"
                )
            if scope and opt in scope and ds not in scope[opt]:
                continue
            for cfg, seeds in _cell_configs(space, model, mopts, ds, opt, conditions, overrides or {}):
                memo = json.dumps(cfg, sort_keys=True, default=repr)
                if memo not in checked:
                    checked[memo] = validate(from_dict(cfg)).to_dict()
                yield checked[memo], seeds, mopts


def _cell_configs(
    space: Space,
    model: str,
    mopts: dict[str, Any],
    ds: str,
    opt: str,
    conditions: list[str] | None,
    overrides: dict[str, Any],
):
    """The unvalidated flat config and the seeds of each cell of one dataset and optimizer."""
    oover = dict(space.optimizers[opt])
    lr_scale = float(oover.pop("lr_scale", GRID["optimizers"].each.keys["lr_scale"].default))
    axes = {**space.grid, **{k: grid_values(f"datasets.{ds}.{k}", v) for k, v in space.datasets[ds].items()}}
    axes.pop("optimizer", None)
    if conditions is not None:
        axes["condition"] = conditions
    seeds = [None]
    if "seed" in axes and "seed" not in overrides:
        seeds = [check_value("seed", v) for v in axes.pop("seed")]
    names = list(axes)
    for values in itertools.product(*(axes[n] for n in names)):
        point = dict(zip(names, values))
        cfg = {
            **space.base,
            **mopts["config"],
            "model": model,
            "dataset": ds,
            "optimizer": opt,
            **oover,
            **point,
            **overrides,
        }
        cfg["condition"] = canonical_condition(cfg.get("condition", "MHA"))
        # A condition fitted without SGD (the paper's linear probe) has no lr: one cell at
        # the lr axis's first value (recorded, unused), not one per lr.
        if not components.has_lr(cfg["condition"]) and "lr" in axes and point["lr"] != axes["lr"][0]:
            continue
        if "lr" in cfg and "lr" not in overrides:
            cfg["lr"] = check_value("lr", cfg["lr"]) * lr_scale
        if seeds[0] is not None:
            cfg["seed"] = seeds[0]
        yield cfg, seeds


def plan(
    space: Space,
    model: str | None = None,
    datasets: list[str] | None = None,
    conditions: list[str] | None = None,
    optimizers: list[str] | None = None,
    overrides: dict[str, Any] | None = None,
    scope: dict[str, list[str]] | None = None,
) -> dict[str, Any]:
    """What ``expand`` would give, counted without building a trial: ``trials``, the
    ``datasets``, ``conditions`` and ``optimizers`` they cover, ``steps`` summed over trials,
    ``costs`` (one item per cell, for ``gpu_hours``), ``vtab1k_data`` (your own data drawn
    VTAB-1k style, whose pool ``cli.check_data`` sizes), ``image_counts`` ((dataset, data_root,
    expect_images) that ``datasets.check_image_count`` checks); every check ``expand`` makes (configs
    validated, repeats and empty grids refused)."""
    n, steps, seen, items = 0, 0, set(), []
    ds, conds, opts, vtab1k, counts = [], set(), set(), [], set()
    for full, seeds, mopts in _cells(space, model, datasets, conditions, optimizers, overrides, scope):
        if len(set(seeds)) != len(seeds):
            raise ConfigError("the grid repeats a trial config (two axes give the same values)")
        key = trial_key({k: v for k, v in full.items() if k != "seed" or seeds == [None]})
        if key in seen:
            raise ConfigError("the grid repeats a trial config (two axes give the same values)")
        seen.add(key)
        n += len(seeds)
        steps += full["steps"] * len(seeds)
        items.append(trial_cost(full, float(mopts["gpu"]), int(mopts["workers"]), len(seeds)))
        if full["dataset"] not in ds:
            ds.append(full["dataset"])
        conds.add(full["condition"])
        opts.add(full["optimizer"])
        if full["data"] and full["low_data"] and full["low_data_split"] == "vtab1k" and full["data"] not in vtab1k:
            vtab1k.append(full["data"])
        if full["expect_images"] and not full["data"]:
            counts.add((full["dataset"], full["data_root"] or "", full["expect_images"]))
    if not n:
        raise ConfigError("the grid is empty: no dataset × condition × lr × seed × optimizer left")
    return {
        "trials": n,
        "datasets": ds,
        "conditions": sorted(conds),
        "optimizers": sorted(opts),
        "steps": steps,
        "costs": items,
        "vtab1k_data": vtab1k,
        "image_counts": sorted(counts),
    }


def expand(
    space: Space,
    model: str | None = None,
    datasets: list[str] | None = None,
    conditions: list[str] | None = None,
    optimizers: list[str] | None = None,
    overrides: dict[str, Any] | None = None,
    scope: dict[str, list[str]] | None = None,
) -> list[Trial]:
    """Every trial of the grid, each a validated flat config with its key and resources.

    A condition fitted without SGD (the paper's linear probe) has no lr: it gets one trial per
    remaining axes, at the lr axis's first value (recorded, unused), not one per lr.
    """
    trials = []
    for full, seeds, mopts in _cells(space, model, datasets, conditions, optimizers, overrides, scope):
        for seed in seeds:
            cfg = full if seed is None else {**full, "seed": seed}
            trials.append(Trial(trial_key(cfg), cfg, float(mopts["gpu"]), float(mopts["cpu"]), int(mopts["workers"])))
    keys = [t.key for t in trials]
    if len(set(keys)) != len(keys):
        raise ConfigError("the grid repeats a trial config (two axes give the same values)")
    if not trials:
        raise ConfigError("the grid is empty: no dataset × condition × lr × seed × optimizer left")
    return trials


def grid_key(trials: list[Trial]) -> str:
    """A short key of a set of trials (their keys, in any order)."""
    return hashlib.sha256(json.dumps(sorted(t.key for t in trials)).encode()).hexdigest()[:12]


def trial_cost(config: dict[str, Any], gpu: float, workers: int, n: int = 1) -> costs.TrialCost:
    """What ``n`` trials of ``config`` cost; a closed-form condition (the linear probe) takes no
    steps: one forward pass over the data, priced as none."""
    steps = config["steps"] * n if components.has_lr(config["condition"]) else 0
    # Priced as on a GPU: ``compile: auto`` is on where the measured verdict holds, its compiles counted.
    verdicts = costs.load_compile_verdicts()
    compiled = costs.compile_on(config["compile"], config["condition"], "cuda", verdicts, workers)
    compile_s = costs.compile_seconds(config["condition"], verdicts) * n if compiled and steps else 0.0
    return costs.TrialCost(
        config["condition"], steps, config["batch_size"], workers, max(gpu, 1) * workers, compiled, compile_s
    )


def gpu_hours(space: Space, model: str, trials: list) -> costs.Estimate:
    """Estimated GPU-hours of ``trials`` (``Trial``s, or ``plan``'s cost items): from the
    space's measured step times (``step_times``) where they cover a trial, else from its
    FLOP-based ``step_seconds``; see raystudy.measure.costs."""
    items = [t if isinstance(t, costs.TrialCost) else trial_cost(t.config, t.gpu, t.workers) for t in trials]
    return costs.estimate(
        model, items, step_times=space.step_times, fallback=model_options(space.models, model)["step_seconds"]
    )
