"""Spaces: the study's YAML files as data, checked, and turned into trials. No Ray, no MLflow.

Two kinds of space live under ``search_spaces/``:
- a *grid* (``demo.yaml``, ``paper.yaml``): base config, ``grid_search`` axes, per-dataset,
  per-optimizer and per-model overrides; ``expand`` gives every trial, each a validated flat
  finetuning config with its key and resources;
- a *search* (``optuna/*.yaml``): base config, distributions (Ray's names: ``choice``,
  ``loguniform``, ...), optionally conditional on another parameter; ``Sampler`` is the
  define-by-run space Optuna samples trials from.
Every error is one ``ConfigError`` line naming the file, the key and what is allowed.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raystudy import components, costs, models
from raystudy.config import FinetuneConfig, check_value, from_dict, read_yaml, trial_key, validate
from raystudy.errors import ConfigError, check_input_file

SPACES_DIR = Path(__file__).resolve().parent.parent / "search_spaces"
SEARCH_DIR = SPACES_DIR / "optuna"
GRID_KEYS = ("study", "description", "base", "grid", "datasets", "optimizers", "models", "tune",
             "step_times")
MODEL_KEYS = ("gpu", "cpu", "workers", "step_seconds", "config")
TUNE_KEYS = ("max_failures", "max_concurrent", "threads_per_trial", "checkpoint_every_s")
TUNE_DEFAULTS = {"max_failures": 2, "max_concurrent": None, "threads_per_trial": 1, "checkpoint_every_s": 60.0}
SAMPLERS = ("choice", "uniform", "loguniform", "quniform", "qloguniform", "randint", "lograndint",
            "randn", "sample_from")
SEARCH_KEYS = ("study", "description", "base", "conditions", "params", "budget", "scheduler", "seed",
               "test_seeds", "models", "tune")
DISTRIBUTIONS = ("choice", "uniform", "loguniform", "randint", "lograndint", "subset_of")
PSEUDO_KEYS = ("beta1", "beta2", "components")  # mapped onto config keys (betas, condition)
BUDGET_KEYS = ("num_samples", "time_budget_s")
SCHEDULER_KEYS = ("grace_period", "reduction_factor")
CONFIG_KEYS = tuple(FinetuneConfig.__dataclass_fields__)


# ---------------------------------------------------------------- shared

def space_path(name_or_path: str, folder: Path = SPACES_DIR) -> Path:
    """A space YAML given by path, or by name under ``folder``."""
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or p.exists():
        return check_input_file("search space file", p)
    cand = folder / f"{name_or_path}.yaml"
    if not cand.is_file():
        known = sorted(q.stem for q in folder.glob("*.yaml"))
        raise ConfigError(f"unknown search space {name_or_path!r}; valid: {', '.join(known)} or a YAML file")
    return cand


def strict(where: str, d: Any, allowed: tuple[str, ...]) -> dict:
    """``d`` as a mapping whose keys are all ``allowed`` (None: empty)."""
    if d is None:
        return {}
    if not isinstance(d, dict):
        raise ConfigError(f"{where} must be a mapping, got {type(d).__name__}")
    for k in d:
        if k not in allowed:
            raise ConfigError(f"unknown key {k!r} in {where}; valid: {', '.join(allowed)}")
    return d


NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,99}")


def study_name(where: str, value: Any) -> str:
    """A space's ``study``: it names folders under --storage, so one plain path component."""
    if not isinstance(value, str) or not NAME.fullmatch(value) or ".." in value:
        raise ConfigError(f"{where}: study {value!r} must be a plain name (letters, digits, . _ + -; "
                          "no '/' or '..'): it names a folder under --storage")
    return value


def canonical_condition(c: Any) -> str:
    """A condition's canonical name, or ConfigError naming the valid ones."""
    if not isinstance(c, str):
        raise ConfigError(f"condition {c!r} must be a name such as MHA, MHA+FC1 or full")
    try:
        return components.canonical_condition(c)
    except components.ConditionError as e:
        raise ConfigError(str(e)) from None


def _number(where: str, key: str, value: Any, *, integer: bool, low: float, strict_low: bool = False,
            none_ok: bool = False) -> Any:
    """A resource or budget value: of the right type, finite and above ``low``."""
    if value is None and none_ok:
        return None
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    ok = ok and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value > low if strict_low else value >= low)
    if not ok:
        kind = "an integer" if integer else "a finite number" if strict_low else "a number"
        raise ConfigError(f"{where}: {key} must be {kind} {'>' if strict_low else '>='} {low:g}, got {value!r}")
    return value


def check_models(where: str, section: Any, cfg_keys: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """A space's per-model resources, each checked: gpu/cpu >= 0, workers >= 1, step_seconds > 0."""
    out = {}
    for m, over in strict(f"{where}: models", section, tuple(section or ()) if isinstance(section, dict) else ()).items():
        over = dict(strict(f"{where}: models.{m}", over, MODEL_KEYS))
        w = f"{where}: models.{m}"
        for key in ("gpu", "cpu"):
            if key in over:
                _number(w, key, over[key], integer=False, low=0)
        if "workers" in over:
            _number(w, "workers", over["workers"], integer=True, low=1)
        if "step_seconds" in over:
            _number(w, "step_seconds", over["step_seconds"], integer=False, low=0, strict_low=True, none_ok=True)
        strict(f"{w}.config", over.get("config"), cfg_keys)
        out[str(m)] = over
    return out


def check_tune(where: str, section: Any) -> dict[str, Any]:
    """A space's ``tune`` options, each checked."""
    t = strict(f"{where}: tune", section, TUNE_KEYS)
    w = f"{where}: tune"
    if "max_failures" in t:
        _number(w, "max_failures", t["max_failures"], integer=True, low=0)
    if "max_concurrent" in t:
        _number(w, "max_concurrent", t["max_concurrent"], integer=True, low=1, none_ok=True)
    if "threads_per_trial" in t:
        _number(w, "threads_per_trial", t["threads_per_trial"], integer=True, low=1)
    if "checkpoint_every_s" in t:
        v = t["checkpoint_every_s"]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise ConfigError(f"{w}: checkpoint_every_s must be a finite number >= 0, got {v!r}")
    return t


def model_options(section: dict[str, dict[str, Any]], model: str) -> dict[str, Any]:
    """A space's per-model ``section`` entry for ``model`` (by alias or full name), defaults filled."""
    opts = section.get(model) or section.get(models.resolve_name(model)) or {}
    return {"gpu": 0, "cpu": 1, "workers": 1, "step_seconds": None, "config": {}, **opts}


def tune_options(space) -> dict[str, Any]:
    """A space's ``tune`` section over the defaults."""
    return {**TUNE_DEFAULTS, **space.tune}


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
    step_times: Path | None = None  # measured step times (raystudy.costs), if the space names a file


def _grid_values(where: str, value: Any) -> list:
    """A grid axis: ``{grid_search: [...]}`` or one constant (Ray's own names)."""
    if isinstance(value, dict):
        if set(value) == {"grid_search"} and isinstance(value["grid_search"], list) and value["grid_search"]:
            return list(value["grid_search"])
        if len(value) == 1 and next(iter(value)) in SAMPLERS:
            raise ConfigError(f"{where}: {next(iter(value))!r} is a sampling distribution; a grid takes "
                              "grid_search lists (sampled spaces run with python -m raystudy.search)")
        raise ConfigError(f"{where}: expected {{grid_search: [values]}} or a constant, got {value!r}")
    return [value]


def load_grid(name_or_path: str) -> Space:
    """Read and check a grid space; every error is one line naming the bad key or value."""
    path = space_path(name_or_path)
    raw = read_yaml(path, "search space file")
    strict(f"search space {path.name}", raw, GRID_KEYS)
    cfg_keys = CONFIG_KEYS
    base = strict(f"{path.name}: base", raw.get("base"), cfg_keys)
    grid_raw = strict(f"{path.name}: grid", raw.get("grid"), cfg_keys)
    grid = {k: _grid_values(f"{path.name}: grid.{k}", v) for k, v in grid_raw.items()}
    datasets = {}
    ds_raw = raw.get("datasets")
    for ds, over in strict(f"{path.name}: datasets", ds_raw,
                            tuple(ds_raw) if isinstance(ds_raw, dict) else ()).items():
        over = strict(f"{path.name}: datasets.{ds}", over, cfg_keys)
        datasets[ds] = over
    if not datasets:
        raise ConfigError(f"{path.name}: 'datasets' must list at least one dataset")
    optimizers = {}
    opts_raw = raw.get("optimizers") or {"sgd": {}}
    for opt, over in strict(f"{path.name}: optimizers", opts_raw,
                            tuple(opts_raw) if isinstance(opts_raw, dict) else ()).items():
        over = dict(strict(f"{path.name}: optimizers.{opt}", over, cfg_keys + ("lr_scale",)))
        if "lr_scale" in over:
            _number(f"{path.name}: optimizers.{opt}", "lr_scale", over["lr_scale"], integer=False,
                    low=0, strict_low=True)
        optimizers[opt] = over
    per_model = check_models(path.name, raw.get("models"), cfg_keys)
    tune_opts = check_tune(path.name, raw.get("tune"))
    # Constants are typed here even where an axis overrides them (base lr: .nan is a mistake).
    for where, section in ([("base", base)] + [(f"optimizers.{o}", {k: v for k, v in over.items() if k != "lr_scale"})
                                               for o, over in optimizers.items()]
                           + [(f"models.{m}.config", o.get("config") or {}) for m, o in per_model.items()]):
        try:
            from_dict(section)
        except ConfigError as e:
            raise ConfigError(f"{path.name}: {where}: {e}") from None
    step_times = raw.get("step_times")
    if step_times is not None and not (isinstance(step_times, str) and step_times.strip()):
        raise ConfigError(f"{path.name}: step_times must be a file path, got {step_times!r}")
    space = Space(name=path.stem, study=study_name(path.name, raw.get("study") or path.stem), base=base, grid=grid,
                  datasets=datasets, optimizers=optimizers, models=per_model, tune=tune_opts,
                  description=str(raw.get("description") or ""),
                  step_times=path.parent / step_times if step_times else None)
    return space


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
        return {"key": self.key, "finetune": self.config, "gpu": self.gpu, "cpu": self.cpu,
                "workers": self.workers}


def _cells(space: Space, model: str | None, datasets: list[str] | None, conditions: list[str] | None,
           optimizers: list[str] | None, overrides: dict[str, Any] | None):
    """The grid as cells: per dataset × optimizer × combination of the axes other than ``seed``,
    the validated flat config (seed as the first of the cell's seeds) and the cell's seeds.

    Validation never looks at the seed (its type is checked once per value), so a grid of many
    seeds is validated per cell, not per trial; identical cells are validated once.
    """
    model = model or space.base.get("model", FinetuneConfig.model)
    mopts = model_options(space.models, model)
    ds_list = datasets or list(space.datasets)
    opt_list = optimizers or [o for o in space.grid.get("optimizer", list(space.optimizers))]
    overrides = overrides or {}
    checked: dict[str, dict[str, Any]] = {}
    for ds in ds_list:
        dover = space.datasets[ds]
        for opt in opt_list:
            if not isinstance(opt, str) or opt not in space.optimizers:
                raise ConfigError(f"optimizer {opt!r} has no section in the space's 'optimizers'; "
                                  f"valid: {', '.join(space.optimizers)}")
            oover = dict(space.optimizers[opt])
            lr_scale = float(oover.pop("lr_scale", 1.0))
            axes = {**space.grid, **{k: _grid_values(f"datasets.{ds}.{k}", v) for k, v in dover.items()}}
            axes.pop("optimizer", None)
            if conditions is not None:
                axes["condition"] = conditions
            seeds = [None]
            if "seed" in axes and "seed" not in overrides:
                seeds = [check_value("seed", v) for v in axes.pop("seed")]
            names = list(axes)
            for values in itertools.product(*(axes[n] for n in names)):
                point = dict(zip(names, values))
                cfg = {**space.base, **mopts["config"], "model": model, "dataset": ds, "optimizer": opt,
                       **oover, **point, **overrides}
                cfg["condition"] = canonical_condition(cfg.get("condition", "MHA"))
                # A condition fitted without SGD (the paper's linear probe) has no lr: one cell at
                # the lr axis's first value (recorded, unused), not one per lr.
                if not components.has_lr(cfg["condition"]) and "lr" in axes and point["lr"] != axes["lr"][0]:
                    continue
                if "lr" in cfg and "lr" not in overrides:
                    cfg["lr"] = check_value("lr", cfg["lr"]) * lr_scale
                if seeds[0] is not None:
                    cfg["seed"] = seeds[0]
                memo = json.dumps(cfg, sort_keys=True, default=repr)
                if memo not in checked:
                    checked[memo] = validate(from_dict(cfg)).to_dict()
                yield checked[memo], seeds, mopts


def plan(space: Space, model: str | None = None, datasets: list[str] | None = None,
         conditions: list[str] | None = None, optimizers: list[str] | None = None,
         overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """What ``expand`` would give, counted without building a trial: ``trials``, the
    ``datasets``, ``conditions`` and ``optimizers`` they cover, ``steps`` summed over trials,
    ``costs`` (one item per cell, for ``gpu_hours``); every check ``expand`` makes (configs
    validated, repeats and empty grids refused)."""
    n, steps, seen, items = 0, 0, set(), []
    ds, conds, opts = [], set(), set()
    for full, seeds, mopts in _cells(space, model, datasets, conditions, optimizers, overrides):
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
    if not n:
        raise ConfigError("the grid is empty: no dataset × condition × lr × seed × optimizer left")
    return {"trials": n, "datasets": ds, "conditions": sorted(conds), "optimizers": sorted(opts),
            "steps": steps, "costs": items}


def expand(space: Space, model: str | None = None, datasets: list[str] | None = None,
           conditions: list[str] | None = None, optimizers: list[str] | None = None,
           overrides: dict[str, Any] | None = None) -> list[Trial]:
    """Every trial of the grid, each a validated flat config with its key and resources.

    A condition fitted without SGD (the paper's linear probe) has no lr: it gets one trial per
    remaining axes, at the lr axis's first value (recorded, unused), not one per lr.
    """
    trials = []
    for full, seeds, mopts in _cells(space, model, datasets, conditions, optimizers, overrides):
        for seed in seeds:
            cfg = full if seed is None else {**full, "seed": seed}
            trials.append(Trial(trial_key(cfg), cfg, float(mopts["gpu"]),
                                float(mopts["cpu"]), int(mopts["workers"])))
    keys = [t.key for t in trials]
    if len(set(keys)) != len(keys):
        raise ConfigError("the grid repeats a trial config (two axes give the same values)")
    if not trials:
        raise ConfigError("the grid is empty: no dataset × condition × lr × seed × optimizer left")
    return trials


def grid_key(trials: list[Trial]) -> str:
    return hashlib.sha256(json.dumps(sorted(t.key for t in trials)).encode()).hexdigest()[:12]


def trial_cost(config: dict[str, Any], gpu: float, workers: int, n: int = 1) -> costs.TrialCost:
    """What ``n`` trials of ``config`` cost; a closed-form condition (the linear probe) takes no
    steps: one forward pass over the data, priced as none."""
    steps = config["steps"] * n if components.has_lr(config["condition"]) else 0
    return costs.TrialCost(config["condition"], steps, config["batch_size"], workers,
                           max(gpu, 1) * workers, config["compile"])


def gpu_hours(space: Space, model: str, trials: list) -> costs.Estimate:
    """Estimated GPU-hours of ``trials`` (``Trial``s, or ``plan``'s cost items): from the
    space's measured step times (``step_times``) where they cover a trial, else from its
    FLOP-based ``step_seconds``; see raystudy.costs."""
    items = [t if isinstance(t, costs.TrialCost) else trial_cost(t.config, t.gpu, t.workers) for t in trials]
    return costs.estimate(model, items, step_times=space.step_times,
                          fallback=model_options(space.models, model)["step_seconds"])


# ---------------------------------------------------------------- searches

@dataclass(frozen=True)
class Param:
    name: str
    kind: str
    args: tuple
    when: dict[str, tuple] = field(default_factory=dict)


@dataclass(frozen=True)
class SearchSpace:
    name: str
    study: str
    base: dict[str, Any]
    conditions: tuple[str, ...]
    params: tuple[Param, ...]
    num_samples: int
    time_budget_s: float | None
    grace_period: int
    reduction_factor: int
    seed: int
    test_seeds: tuple[int, ...]
    models: dict[str, dict[str, Any]]
    tune: dict[str, Any]

    @property
    def searches_components(self) -> bool:
        """True when the trained components themselves are searched (no fixed condition)."""
        return any(p.name == "components" for p in self.params)

    def studies(self, conditions: list[str] | None = None) -> list[tuple[str, str | None]]:
        """(label, fixed condition or None) of each Optuna study the search runs."""
        if self.searches_components:
            return [("components", None)]
        return [(c, c) for c in (conditions or self.conditions)]


def _param(where: str, name: str, spec: Any, cfg_keys: tuple[str, ...]) -> Param:
    if name not in cfg_keys and name not in PSEUDO_KEYS:
        raise ConfigError(f"{where}: unknown parameter {name!r}; valid: config keys or {', '.join(PSEUDO_KEYS)}")
    if not isinstance(spec, dict):
        raise ConfigError(f"{where}.{name}: expected {{distribution: args}}, got {spec!r}")
    spec = dict(spec)
    when = spec.pop("when", {}) or {}
    if len(spec) != 1:
        raise ConfigError(f"{where}.{name}: give exactly one distribution of {', '.join(DISTRIBUTIONS)}")
    kind, args = next(iter(spec.items()))
    if kind not in DISTRIBUTIONS:
        raise ConfigError(f"{where}.{name}: unknown distribution {kind!r}; valid: {', '.join(DISTRIBUTIONS)}")
    if kind in ("choice", "subset_of"):
        if not isinstance(args, list) or not args:
            raise ConfigError(f"{where}.{name}: {kind} takes a non-empty list")
        if kind == "subset_of":
            bad = [c for c in args if c not in components.STUDY_COMPONENTS]
            if bad or name != "components":
                raise ConfigError(f"{where}.{name}: subset_of is for 'components' over "
                                  f"{', '.join(components.STUDY_COMPONENTS)}; got {args!r}")
    else:
        if not (isinstance(args, list) and len(args) == 2
                and all(isinstance(a, (int, float)) and not isinstance(a, bool) and math.isfinite(a) for a in args)):
            raise ConfigError(f"{where}.{name}: {kind} takes [low, high], two finite numbers, got {args!r}")
        lo, hi = args
        if lo >= hi:
            raise ConfigError(f"{where}.{name}: lower bound {lo} is not below upper bound {hi}")
        if kind.startswith("log") and lo <= 0:
            raise ConfigError(f"{where}.{name}: {kind} needs a positive lower bound, got {lo}")
        if kind in ("randint", "lograndint") and not all(isinstance(a, int) for a in args):
            raise ConfigError(f"{where}.{name}: {kind} takes integer bounds, got {args!r}")
    if not isinstance(when, dict):
        raise ConfigError(f"{where}.{name}.when: expected {{param: value or [values]}}, got {when!r}")
    when = {k: tuple(v) if isinstance(v, list) else (v,) for k, v in when.items()}
    return Param(name, kind, tuple(args), when)


def load_search(name_or_path: str) -> SearchSpace:
    """Read and check an Optuna space; every error is one line naming the bad key or value."""
    path = space_path(name_or_path, SEARCH_DIR)
    raw = read_yaml(path, "search space file")
    where = path.name
    strict(f"search space {where}", raw, SEARCH_KEYS)
    cfg_keys = CONFIG_KEYS
    base = strict(f"{where}: base", raw.get("base"), cfg_keys)
    params_raw = raw.get("params")
    if not isinstance(params_raw, dict) or not params_raw:
        raise ConfigError(f"{where}: 'params' must map at least one parameter to a distribution")
    params = tuple(_param(f"{where}: params", n, s, cfg_keys) for n, s in params_raw.items())
    names = {p.name for p in params}
    for p in params:
        for dep, values in p.when.items():
            if dep not in names:
                raise ConfigError(f"{where}: params.{p.name}.when names unknown parameter {dep!r}; "
                                  f"valid: {', '.join(sorted(names - {p.name}))}")
            src = next(q for q in params if q.name == dep)
            if src.when:
                raise ConfigError(f"{where}: params.{p.name}.when depends on {dep!r}, itself conditional; "
                                  "conditions do not chain")
            if src.kind != "choice" or not set(values) <= set(src.args):
                raise ConfigError(f"{where}: params.{p.name}.when: {dep} must be a choice among "
                                  f"{list(src.args)}, got {list(values)}")
    # Suggest a parameter only after those its `when` depends on (YAML order is not a promise).
    params = tuple(sorted(params, key=lambda p: bool(p.when)))
    conds = raw.get("conditions") or ["MHA"]
    if not isinstance(conds, list):
        raise ConfigError(f"{where}: conditions must be a list of conditions, got {conds!r}")
    if "components" in names:
        conds = []  # the condition itself is searched: no fixed condition
    else:
        try:
            conds = [canonical_condition(c) for c in conds]
        except ConfigError as e:
            raise ConfigError(f"{where}: conditions: {e}") from None
    budget = strict(f"{where}: budget", raw.get("budget"), BUDGET_KEYS)
    sched = strict(f"{where}: scheduler", raw.get("scheduler"), SCHEDULER_KEYS)
    per_model = check_models(where, raw.get("models"), cfg_keys)
    tune_opts = check_tune(where, raw.get("tune"))
    num_samples = _number(f"{where}: budget", "num_samples", budget.get("num_samples", 16), integer=True, low=1)
    time_budget = _number(f"{where}: budget", "time_budget_s", budget.get("time_budget_s"), integer=False,
                          low=0, strict_low=True, none_ok=True)
    grace = _number(f"{where}: scheduler", "grace_period", sched.get("grace_period", 1), integer=True, low=1)
    factor = _number(f"{where}: scheduler", "reduction_factor", sched.get("reduction_factor", 3), integer=True, low=2)
    seed = raw.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ConfigError(f"{where}: seed must be an integer >= 0, got {seed!r}")
    test_seeds = raw.get("test_seeds", [100, 101, 102])
    if (not isinstance(test_seeds, list) or not test_seeds
            or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in test_seeds)):
        raise ConfigError(f"{where}: test_seeds must be a list of integers >= 0, got {test_seeds!r}")
    return SearchSpace(
        name=path.stem, study=study_name(where, raw.get("study") or f"search-{path.stem}"), base=base,
        conditions=tuple(conds), params=params, num_samples=num_samples, time_budget_s=time_budget,
        grace_period=grace, reduction_factor=factor, seed=seed, test_seeds=tuple(test_seeds),
        models=per_model, tune=tune_opts)


class Sampler:
    """Optuna's define-by-run space: suggests the params (conditionals honoured) and returns the
    whole trial (key, config, resources) as a constant, so the trainable and the MLflow callback
    see the same trial a grid would give them."""

    def __init__(self, space: SearchSpace, condition: str | None, base: dict[str, Any],
                 resources: dict[str, Any]):
        self.space, self.condition, self.base, self.resources = space, condition, base, resources

    def __call__(self, ot_trial) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for p in self.space.params:
            if any(values.get(dep) not in allowed for dep, allowed in p.when.items()):
                continue  # inactive: its condition does not hold
            values[p.name] = suggest(ot_trial, p)
        trial = make_trial(self.base, self.condition, values, self.resources).as_dict()
        return {"trial": {**trial, "name": search_trial_name(trial["finetune"]["condition"], values)}}


# Short names of sampled keys in a search trial's name; the rest keep their own.
NAME_ABBREV = {"weight_decay": "wd", "warmup_steps": "warmup", "batch_size": "bs", "momentum": "mom"}


def search_trial_name(condition: str, values: dict[str, Any]) -> str:
    """A search trial's readable name: the condition and each sampled value, floats to two
    significant digits (``MHA·adamw·lr0.0031·wd1e-05·bs64``); the key, not the name, is unique."""
    parts = [condition]
    for k, v in values.items():
        if k == "components":
            continue  # already the condition
        if isinstance(v, float):
            v = f"{v:.2g}"
        parts.append(str(v) if k == "optimizer" else f"{NAME_ABBREV.get(k, k)}{v}")
    return "·".join(parts)


def suggest(ot_trial, p: Param) -> Any:
    lo_hi = p.args
    if p.kind == "choice":
        return ot_trial.suggest_categorical(p.name, list(p.args))
    if p.kind == "uniform":
        return ot_trial.suggest_float(p.name, *lo_hi)
    if p.kind == "loguniform":
        return ot_trial.suggest_float(p.name, *lo_hi, log=True)
    if p.kind == "randint":  # Ray's convention: upper bound excluded
        return ot_trial.suggest_int(p.name, lo_hi[0], lo_hi[1] - 1)
    if p.kind == "lograndint":
        return ot_trial.suggest_int(p.name, lo_hi[0], lo_hi[1] - 1, log=True)
    # subset_of: one yes/no per component
    return [c for c in p.args if ot_trial.suggest_categorical(f"train_{c}", [True, False])]


def make_trial(base: dict[str, Any], condition: str | None, values: dict[str, Any],
               resources: dict[str, Any]) -> Trial:
    """A trial (as the grid makes them) from base config + sampled values; ``condition`` None:
    the sampled ``components`` are the condition."""
    cfg = {**base, **{k: v for k, v in values.items() if k not in PSEUDO_KEYS}}
    if condition is None:
        condition = "+".join(values["components"]) or "head_only"  # nothing but the head, by SGD
    cfg["condition"] = canonical_condition(condition)
    if "beta1" in values or "beta2" in values:
        b1, b2 = FinetuneConfig.betas
        cfg["betas"] = [values.get("beta1", b1), values.get("beta2", b2)]
    full = from_dict(cfg).to_dict()
    return Trial(trial_key(full), full, float(resources["gpu"]), float(resources["cpu"]),
                 int(resources.get("workers", 1)))


