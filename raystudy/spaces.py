"""Spaces: the study's YAML files as data, checked, and turned into trials. No Ray, no MLflow.

Two kinds of space live under ``search_spaces/``:
- a *grid* (``demo.yaml``, ``paper.yaml``): base config, ``grid_search`` axes, per-dataset,
  per-optimizer and per-model overrides; ``expand`` gives every trial, each a validated flat
  finetuning config with its key and resources;
- a *search* (``optuna/*.yaml``): base config, distributions (Ray's names: ``choice``,
  ``loguniform``, ...), optionally conditional on another parameter; ``Sampler`` is the
  define-by-run space Optuna samples trials from.
What each file may hold is data (``GRID``, ``SEARCH``: one ``Key`` per key), which one checker
(``check``) walks. Every error is one ``ConfigError`` line naming the file, the key and what is allowed.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from raystudy import components, costs, models, userdata
from raystudy.config import (
    MAX_CPUS,
    SEED_END,
    FinetuneConfig,
    check_value,
    from_dict,
    read_yaml,
    trial_key,
    validate,
)
from raystudy.datasets import VAL_FRACTION
from raystudy.errors import ConfigError, check_input_file

SPACES_DIR = Path(__file__).resolve().parent.parent / "search_spaces"
SEARCH_DIR = SPACES_DIR / "optuna"
SAMPLERS = (
    "choice",
    "uniform",
    "loguniform",
    "quniform",
    "qloguniform",
    "randint",
    "lograndint",
    "randn",
    "sample_from",
)
PSEUDO_KEYS = ("beta1", "beta2", "components")  # mapped onto config keys (betas, condition)
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
        raise ConfigError(
            f"{where}: study {value!r} must be a plain name (letters, digits, . _ + -; "
            "no '/' or '..'): it names a folder under --storage"
        )
    return value


def canonical_condition(c: Any) -> str:
    """A condition's canonical name, or ConfigError naming the valid ones."""
    if not isinstance(c, str):
        raise ConfigError(f"condition {c!r} must be a name such as MHA, MHA+FC1 or full")
    try:
        return components.canonical_condition(c)
    except components.ConditionError as e:
        raise ConfigError(str(e)) from None


# ---------------------------------------------------------------- what a space file may hold


@dataclass(frozen=True)
class Key:
    """One key of a space file: its value's ``type`` (a name in ``CHECKS``), the bounds and
    default of that value, and for a section the keys it holds."""

    type: str
    low: float | None = None  # int, number, finite, seeds: the least value allowed
    above: bool = False  # the value must exceed ``low``, not merely reach it
    high: float | None = None  # int, number, finite, seeds: the greatest value allowed (below it, for seeds)
    why: str = ""  # what ``high`` follows from, for the error line
    none: bool = False  # None is allowed too
    default: Any = None  # the value where the file leaves the key out
    empty: bool = False  # an empty value (None, "", [], {}, 0) means the default as well
    required: str = ""  # the value may not be empty: it must ``required``
    keys: dict[str, Key] = field(default_factory=dict)  # section: its keys; config: those besides the config keys
    each: Key | None = None  # map: each entry's value; config: each config key's value
    fill: bool = False  # section: the loaded section holds every key, defaults filled in


# Upper bounds of the counts a space file holds, from what each sizes: past them a value is a typo
# or a unit mistake that would exhaust a cluster or never end (the command lines' are ``cli.BOUNDS``).
YEAR_S = 366 * 86_400
MAX_GPUS = 1_024  # GPUs of one trial: a large cluster's
# Per-model resources (the grid's and the search's ``models.<model>``); ``model_options`` fills the defaults.
MODEL = {
    "gpu": Key("number", low=0, default=0, high=MAX_GPUS, why="GPUs of one trial"),
    "cpu": Key("number", low=0, default=1, high=MAX_CPUS, why="CPUs of one trial"),
    "workers": Key("int", low=1, default=1, high=MAX_GPUS, why="DDP workers of one trial, a GPU each"),
    "step_seconds": Key("finite", low=0, above=True, none=True, high=86_400, why="seconds: a day per step"),
    "config": Key("config", default={}),
}
# Ray Tune's options (``tune``); ``tune_options`` fills the defaults.
TUNE = {
    "max_failures": Key("int", low=0, default=2, high=100, why="retries of one trial"),
    "max_concurrent": Key("int", low=1, none=True, high=100_000, why="trials at once, a process each"),
    "threads_per_trial": Key("int", low=1, default=1, high=MAX_CPUS, why="threads of one process"),
    "checkpoint_every_s": Key("finite", low=0, default=60.0, high=YEAR_S, why="seconds: a year"),
}
# A named experiment of a grid file (``experiments.<name>``): which models run which optimizers on
# which datasets, so that a grid plans what a study ran, not the product of every axis.
EXPERIMENT = {
    "models": Key("names", empty=True, default=[]),  # []: every model
    "optimizers": Key("names", empty=True, default=[]),  # []: the grid's optimizers
    "datasets": Key("names", empty=True, default=[]),  # []: every dataset of the space
    "description": Key("text", empty=True, default=""),
}
# A grid file (``search_spaces/*.yaml``).
GRID = {
    "study": Key("name", empty=True),  # default: the file's name
    "description": Key("text", empty=True, default=""),
    "base": Key("config"),
    "grid": Key("config", each=Key("axis")),
    "datasets": Key("map", each=Key("config"), required="list at least one dataset"),
    "optimizers": Key(
        "map",
        empty=True,
        default={"sgd": {}},
        each=Key("config", keys={"lr_scale": Key("finite", low=0, above=True, default=1.0)}),
    ),
    "models": Key("map", each=Key("section", keys=MODEL)),
    "tune": Key("section", keys=TUNE),
    "step_times": Key("path", none=True),  # measured step times (raystudy.costs), relative to the file
    "experiments": Key("map", empty=True, default={}, each=Key("section", keys=EXPERIMENT, fill=True)),
}
# A search file (``search_spaces/optuna/*.yaml``).
SEARCH = {
    "study": Key("name", empty=True),  # default: search-<the file's name>
    "description": Key("text", empty=True, default=""),
    "base": Key("config"),
    "conditions": Key("conditions", empty=True, default=["MHA"]),
    "params": Key("params", required="map at least one parameter to a distribution"),
    "budget": Key(
        "section",
        fill=True,
        keys={
            "num_samples": Key("int", low=1, default=16, high=100_000, why="trials per study, each a finetuning run"),
            "time_budget_s": Key("finite", low=0, above=True, none=True, high=YEAR_S, why="seconds: a year"),
        },
    ),
    "scheduler": Key(
        "section",
        fill=True,
        keys={"grace_period": Key("int", low=1, default=1), "reduction_factor": Key("int", low=2, default=3)},
    ),
    "seed": Key("int", low=0, default=0, high=SEED_END - 1, why="numpy's seeds"),
    "test_seeds": Key("seeds", low=0, default=[100, 101, 102], high=SEED_END, why="numpy's seeds"),
    "models": Key("map", each=Key("section", keys=MODEL)),
    "tune": Key("section", keys=TUNE),
}


@dataclass(frozen=True)
class Dist:
    """What a search distribution takes: ``[low, high]`` bounds (``integer``, ``log``: of which
    kind), or a non-empty list of values (``among``: those allowed, for the parameter ``only``)."""

    bounds: bool = True
    integer: bool = False
    log: bool = False  # a log scale: the lower bound must be positive
    among: tuple = ()
    only: str = ""


DISTS = {
    "choice": Dist(bounds=False),
    "uniform": Dist(),
    "loguniform": Dist(log=True),
    "randint": Dist(integer=True),  # Ray's convention: upper bound excluded
    "lograndint": Dist(integer=True, log=True),
    "subset_of": Dist(bounds=False, among=components.STUDY_COMPONENTS, only="components"),  # one yes/no each
}
DISTRIBUTIONS = tuple(DISTS)


# ---------------------------------------------------------------- the checker


def check(file: str, path: tuple, value: Any, key: Key) -> Any:
    """``value``, found at ``path`` in ``file``, checked against ``key`` and returned as loaded
    (a section: a dict; the grid's axes: lists; params: a tuple of ``Param``)."""
    value = CHECKS[key.type](file, path, value, key)
    if key.required and not value:
        raise ConfigError(f"{_at(file, path[:-1])}: {path[-1]!r} must {key.required}")
    return value


def _at(file: str, path: tuple) -> str:
    """Where ``path`` is, for an error: ``demo.yaml: models.vit_demo``."""
    return f"{file}: {'.'.join(map(str, path))}" if path else file


def _section(file: str, path: tuple, value: Any, key: Key) -> dict:
    """A mapping of ``key.keys`` (a config section: of the config keys as well), each checked."""
    allowed = tuple(key.keys) if key.type == "section" else CONFIG_KEYS + tuple(key.keys)
    given = strict(_at(file, path) if path else f"search space {file}", value, allowed)
    out = dict(given)
    for k, sub in key.keys.items():  # in the schema's order: the first error does not depend on the file's
        if k in given and not (sub.empty and not given[k]):
            out[k] = check(file, path + (k,), given[k], sub)
        elif key.fill:
            out[k] = check(file, path + (k,), copy.deepcopy(sub.default), sub)
    if key.each is not None:
        out = {k: v if k in key.keys else check(file, path + (k,), v, key.each) for k, v in out.items()}
    return out


def _map(file: str, path: tuple, value: Any, key: Key) -> dict:
    """A mapping of names of the file's choosing (datasets, models), each value checked."""
    given = strict(_at(file, path), value, tuple(value) if isinstance(value, dict) else ())
    return {name: check(file, path + (name,), v, key.each) for name, v in given.items()}


# What an error calls each kind of number; all three refuse nan and inf.
NUMBERS = {"int": "an integer", "number": "a number", "finite": "a finite number"}


def _number(file: str, path: tuple, value: Any, key: Key) -> Any:
    """A resource, budget or option value: of the right type, finite, at least ``key.low``."""
    if value is None and key.none:
        return None
    ok = isinstance(value, int) if key.type == "int" else isinstance(value, (int, float))
    ok = ok and not isinstance(value, bool) and (isinstance(value, int) or math.isfinite(value))
    ok = ok and (value > key.low if key.above else value >= key.low)
    if not ok:
        raise ConfigError(
            f"{_at(file, path[:-1])}: {path[-1]} must be {NUMBERS[key.type]} "
            f"{'>' if key.above else '>='} {key.low:g}, got {value!r}"
        )
    if key.high is not None and value > key.high:
        raise ConfigError(
            f"{_at(file, path[:-1])}: {path[-1]} must be {NUMBERS[key.type]} <= {_bound(key.high)} ({key.why}), "
            f"got {value!r}"
        )
    return value


def _bound(x: float) -> str:
    """A bound as a user types it: whole numbers in full (4294967295, not 4.29497e+09)."""
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _path(file: str, path: tuple, value: Any, key: Key) -> str | None:
    """A file path: a non-blank string."""
    if not (value is None and key.none) and not (isinstance(value, str) and value.strip()):
        raise ConfigError(f"{_at(file, path[:-1])}: {path[-1]} must be a file path, got {value!r}")
    return value


def _conditions(file: str, path: tuple, value: Any, key: Key) -> list:
    """A list of conditions (the loader reads each, unless the search's ``components`` is the condition)."""
    if not isinstance(value, list):
        raise ConfigError(f"{_at(file, path[:-1])}: {path[-1]} must be a list of conditions, got {value!r}")
    return value


def _names(file: str, path: tuple, value: Any, key: Key) -> list:
    """A list of names (models, optimizers, datasets): non-blank strings."""
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise ConfigError(f"{_at(file, path[:-1])}: {path[-1]} must be a list of names, got {value!r}")
    return value


def _seeds(file: str, path: tuple, value: Any, key: Key) -> list:
    """A non-empty list of integers >= ``key.low``."""
    high = key.high if key.high is not None else math.inf
    if (
        not isinstance(value, list)
        or not value
        or not all(isinstance(t, int) and not isinstance(t, bool) and key.low <= t < high for t in value)
    ):
        below = f" and < {_bound(high)} ({key.why})" if key.high is not None else ""
        raise ConfigError(
            f"{_at(file, path[:-1])}: {path[-1]} must be a list of integers >= {key.low:g}{below}, got {value!r}"
        )
    return value


def axis_values(where: str, value: Any) -> list:
    """The values of a grid axis or constant at ``where``: ``{grid_search: [...]}``'s list, or ``[value]``."""
    return _grid_values(where, value)


def _grid_values(where: str, value: Any) -> list:
    """A grid axis: ``{grid_search: [...]}`` or one constant (Ray's own names)."""
    if isinstance(value, dict):
        if set(value) == {"grid_search"} and isinstance(value["grid_search"], list) and value["grid_search"]:
            return list(value["grid_search"])
        if len(value) == 1 and next(iter(value)) in SAMPLERS:
            raise ConfigError(
                f"{where}: {next(iter(value))!r} is a sampling distribution; a grid takes "
                "grid_search lists (sampled spaces run with python -m raystudy.search)"
            )
        raise ConfigError(f"{where}: expected {{grid_search: [values]}} or a constant, got {value!r}")
    return [value]


def _params(file: str, path: tuple, value: Any, key: Key) -> tuple:
    """A search's parameters, each ``{distribution: args}`` and optionally ``when`` another's value."""
    if not isinstance(value, dict):
        return ()  # refused as empty, with what ``params`` must hold
    params = tuple(_param(_at(file, path), name, spec) for name, spec in value.items())
    _check_when(file, params)
    # Suggest a parameter only after those its `when` depends on (YAML order is not a promise).
    return tuple(sorted(params, key=lambda p: bool(p.when)))


def _param(where: str, name: str, spec: Any) -> Param:
    """One parameter's ``{distribution: args, when: {param: value or [values]}}``."""
    if name not in CONFIG_KEYS and name not in PSEUDO_KEYS:
        raise ConfigError(f"{where}: unknown parameter {name!r}; valid: config keys or {', '.join(PSEUDO_KEYS)}")
    if not isinstance(spec, dict):
        raise ConfigError(f"{where}.{name}: expected {{distribution: args}}, got {spec!r}")
    spec = dict(spec)
    when = spec.pop("when", {}) or {}
    if len(spec) != 1:
        raise ConfigError(f"{where}.{name}: give exactly one distribution of {', '.join(DISTRIBUTIONS)}")
    kind, args = next(iter(spec.items()))
    if kind not in DISTS:
        raise ConfigError(f"{where}.{name}: unknown distribution {kind!r}; valid: {', '.join(DISTRIBUTIONS)}")
    _dist_args(f"{where}.{name}", name, kind, args)
    if not isinstance(when, dict):
        raise ConfigError(f"{where}.{name}.when: expected {{param: value or [values]}}, got {when!r}")
    when = {k: tuple(v) if isinstance(v, list) else (v,) for k, v in when.items()}
    return Param(name, kind, tuple(args), when)


def _dist_args(where: str, name: str, kind: str, args: Any) -> None:
    """A distribution's arguments, as ``DISTS[kind]`` says."""
    d = DISTS[kind]
    if not d.bounds:
        if not isinstance(args, list) or not args:
            raise ConfigError(f"{where}: {kind} takes a non-empty list")
        if d.among and (name != d.only or any(a not in d.among for a in args)):
            raise ConfigError(f"{where}: {kind} is for {d.only!r} over {', '.join(d.among)}; got {args!r}")
        return
    if not (
        isinstance(args, list)
        and len(args) == 2
        and all(isinstance(a, (int, float)) and not isinstance(a, bool) and math.isfinite(a) for a in args)
    ):
        raise ConfigError(f"{where}: {kind} takes [low, high], two finite numbers, got {args!r}")
    lo, hi = args
    if lo >= hi:
        raise ConfigError(f"{where}: lower bound {lo} is not below upper bound {hi}")
    if d.log and lo <= 0:
        raise ConfigError(f"{where}: {kind} needs a positive lower bound, got {lo}")
    if d.integer and not all(isinstance(a, int) for a in args):
        raise ConfigError(f"{where}: {kind} takes integer bounds, got {args!r}")


def _check_when(file: str, params: tuple) -> None:
    """Each ``when`` names another parameter, itself unconditional, a choice among its values."""
    names = {p.name for p in params}
    for p in params:
        for dep, values in p.when.items():
            if dep not in names:
                raise ConfigError(
                    f"{file}: params.{p.name}.when names unknown parameter {dep!r}; "
                    f"valid: {', '.join(sorted(names - {p.name}))}"
                )
            src = next(q for q in params if q.name == dep)
            if src.when:
                raise ConfigError(
                    f"{file}: params.{p.name}.when depends on {dep!r}, itself conditional; conditions do not chain"
                )
            if src.kind != "choice" or not set(values) <= set(src.args):
                raise ConfigError(
                    f"{file}: params.{p.name}.when: {dep} must be a choice among {list(src.args)}, got {list(values)}"
                )


CHECKS = {
    "int": _number,
    "number": _number,
    "finite": _number,
    "name": lambda file, path, value, key: study_name(_at(file, path[:-1]), value),
    "text": lambda file, path, value, key: str(value),
    "path": _path,
    "conditions": _conditions,
    "names": _names,
    "seeds": _seeds,
    "axis": lambda file, path, value, key: _grid_values(_at(file, path), value),
    "params": _params,
    "section": _section,
    "config": _section,
    "map": _map,
}


def read_space(path: Path, schema: dict[str, Key], **file_defaults: Any) -> dict[str, Any]:
    """A space file's keys, each checked against ``schema``, every one of them there (defaults
    filled in; ``file_defaults``: those that depend on the file, such as its study's name)."""
    keys = {k: replace(key, default=file_defaults[k]) if k in file_defaults else key for k, key in schema.items()}
    return check(path.name, (), read_yaml(path, "search space file"), Key("section", keys=keys, fill=True))


def defaults(keys: dict[str, Key]) -> dict[str, Any]:
    """Each key's default: what a section means where the file leaves the key out."""
    return {k: copy.deepcopy(key.default) for k, key in keys.items()}


def model_options(section: dict[str, dict[str, Any]], model: str) -> dict[str, Any]:
    """A space's per-model ``section`` entry for ``model`` (by alias or full name), defaults filled."""
    opts = section.get(model) or section.get(models.resolve_name(model)) or {}
    return {**defaults(MODEL), **opts}


def tune_options(space) -> dict[str, Any]:
    """A space's ``tune`` section over the defaults."""
    return {**defaults(TUNE), **space.tune}


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
        base=_data_resolved(f["base"], path.parent),
        grid=f["grid"],
        datasets={ds: _data_resolved(entry, path.parent) for ds, entry in f["datasets"].items()},
        optimizers=f["optimizers"],
        models=f["models"],
        tune=f["tune"],
        description=f["description"],
        step_times=path.parent / f["step_times"] if f["step_times"] else None,
        experiments=_check_experiments(path.name, f),
    )


def _data_resolved(section: dict[str, Any], folder: Path) -> dict[str, Any]:
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
    axes = {**space.grid, **{k: _grid_values(f"datasets.{ds}.{k}", v) for k, v in space.datasets[ds].items()}}
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
    return costs.TrialCost(
        config["condition"], steps, config["batch_size"], workers, max(gpu, 1) * workers, config["compile"]
    )


def gpu_hours(space: Space, model: str, trials: list) -> costs.Estimate:
    """Estimated GPU-hours of ``trials`` (``Trial``s, or ``plan``'s cost items): from the
    space's measured step times (``step_times``) where they cover a trial, else from its
    FLOP-based ``step_seconds``; see raystudy.costs."""
    items = [t if isinstance(t, costs.TrialCost) else trial_cost(t.config, t.gpu, t.workers) for t in trials]
    return costs.estimate(
        model, items, step_times=space.step_times, fallback=model_options(space.models, model)["step_seconds"]
    )


# ---------------------------------------------------------------- searches


@dataclass(frozen=True)
class Param:
    """A searched parameter: its distribution (``kind``, a name in ``DISTS``) and ``args``, and
    ``when``: the values of other parameters it is sampled under (none: always)."""

    name: str
    kind: str
    args: tuple
    when: dict[str, tuple] = field(default_factory=dict)


@dataclass(frozen=True)
class SearchSpace:
    """An Optuna search as data: base config, fixed conditions, parameters, budget, ASHA's
    schedule, the sampler's seed and the test seeds the best configs are re-run with."""

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


def load_search(name_or_path: str) -> SearchSpace:
    """Read and check an Optuna space; every error is one line naming the bad key or value."""
    path = space_path(name_or_path, SEARCH_DIR)
    f = read_space(path, SEARCH, study=f"search-{path.stem}")
    conds = []  # a search over ``components`` searches the condition itself: no fixed condition
    if not any(p.name == "components" for p in f["params"]):
        try:
            conds = [canonical_condition(c) for c in f["conditions"]]
        except ConfigError as e:
            raise ConfigError(f"{path.name}: conditions: {e}") from None
    budget, sched = f["budget"], f["scheduler"]
    return SearchSpace(
        name=path.stem,
        study=f["study"],
        base=_data_resolved(f["base"], path.parent),
        conditions=tuple(conds),
        params=f["params"],
        num_samples=budget["num_samples"],
        time_budget_s=budget["time_budget_s"],
        grace_period=sched["grace_period"],
        reduction_factor=sched["reduction_factor"],
        seed=f["seed"],
        test_seeds=tuple(f["test_seeds"]),
        models=f["models"],
        tune=f["tune"],
    )


class Sampler:
    """Optuna's define-by-run space: suggests the params (conditionals honoured) and returns the
    whole trial (key, config, resources) as a constant, so the trainable and the MLflow callback
    see the same trial a grid would give them."""

    def __init__(self, space: SearchSpace, condition: str | None, base: dict[str, Any], resources: dict[str, Any]):
        self.space, self.condition, self.base, self.resources = space, condition, base, resources

    def __call__(self, ot_trial) -> dict[str, Any]:
        """``{"trial": ...}``: the sampled trial as a grid gives it, with a readable name."""
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
    """A value of ``p`` drawn by the Optuna trial ``ot_trial`` (Ray's ranges: randint's upper bound excluded)."""
    d = DISTS[p.kind]
    if p.kind == "subset_of":  # one yes/no per component
        return [c for c in p.args if ot_trial.suggest_categorical(f"train_{c}", [True, False])]
    if not d.bounds:
        return ot_trial.suggest_categorical(p.name, list(p.args))
    if d.integer:
        return ot_trial.suggest_int(p.name, p.args[0], p.args[1] - 1, log=d.log)
    return ot_trial.suggest_float(p.name, *p.args, log=d.log)


def make_trial(base: dict[str, Any], condition: str | None, values: dict[str, Any], resources: dict[str, Any]) -> Trial:
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
    return Trial(
        trial_key(full), full, float(resources["gpu"]), float(resources["cpu"]), int(resources.get("workers", 1))
    )
