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
import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from raystudy.bounds import BOUNDS, KINDS, Bound, is_seed_list
from raystudy.errors import ConfigError, check_input_file
from raystudy.models import components, registry
from raystudy.train.config import FinetuneConfig, read_yaml

SPACES_DIR = Path(__file__).resolve().parents[2] / "search_spaces"
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
    bound: Bound | None = None  # int, number, finite: the value's row in ``bounds.BOUNDS``; seeds: each seed's
    none: bool = False  # None is allowed too
    default: Any = None  # the value where the file leaves the key out
    empty: bool = False  # an empty value (None, "", [], {}, 0) means the default as well
    required: str = ""  # the value may not be empty: it must ``required``
    keys: dict[str, Key] = field(default_factory=dict)  # section: its keys; config: those besides the config keys
    each: Key | None = None  # map: each entry's value; config: each config key's value
    fill: bool = False  # section: the loaded section holds every key, defaults filled in

    # The bound's parts, read from its row, so that a space file's check and a test see the same numbers.
    @property
    def low(self) -> float | None:
        """The least value allowed (None: no bound)."""
        return self.bound.low if self.bound else None

    @property
    def above(self) -> bool:
        """The value must exceed ``low``, not merely reach it."""
        return bool(self.bound and self.bound.above)

    @property
    def high(self) -> float | None:
        """The greatest value allowed (None: no bound)."""
        return self.bound.high if self.bound else None

    @property
    def why(self) -> str:
        """What ``high`` follows from, as a space file's error line states it."""
        return self.bound.reason("space") if self.bound else ""


def bounded(name: str, **kw: Any) -> Key:
    """A numeric key of its kind and within its bounds, both its row ``name`` of ``bounds.BOUNDS``."""
    return Key(BOUNDS[name].kind, bound=BOUNDS[name], **kw)


# The counts a space file holds are bounded by their rows in ``bounds.BOUNDS``, which the command
# lines' flags read too (``cli.FLAGS``).
# Per-model resources (the grid's and the search's ``models.<model>``); ``model_options`` fills the defaults.
MODEL = {
    "gpu": bounded("gpu", default=0),
    "cpu": bounded("cpu", default=1),
    "workers": bounded("workers", default=1),
    "step_seconds": bounded("step_seconds", none=True),
    "config": Key("config", default={}),
}
# Ray Tune's options (``tune``); ``tune_options`` fills the defaults.
TUNE = {
    "max_failures": bounded("max_failures", default=2),
    "max_concurrent": bounded("max_concurrent", none=True),
    "threads_per_trial": bounded("threads_per_trial", default=1),
    "checkpoint_every_s": bounded("checkpoint_every_s", default=60.0),
    "trials_per_run": bounded("trials_per_run", default=500),  # a larger grid runs as Tune runs of this many
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
        each=Key("config", keys={"lr_scale": bounded("lr_scale", default=1.0)}),
    ),
    "models": Key("map", each=Key("section", keys=MODEL)),
    "tune": Key("section", keys=TUNE),
    "step_times": Key("path", none=True),  # measured step times (raystudy.measure.costs), relative to the file
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
            "num_samples": bounded("num_samples", default=16),
            "time_budget_s": bounded("time_budget_s", none=True),
        },
    ),
    "scheduler": Key(
        "section",
        fill=True,
        keys={
            "grace_period": bounded("grace_period", default=1),
            "reduction_factor": bounded("reduction_factor", default=3),
        },
    ),
    "seed": bounded("seed", default=0),
    "test_seeds": Key("seeds", bound=BOUNDS["seed"], default=[100, 101, 102]),
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
    """Where ``path`` is, for an error: ``demo.yaml: registry.vit_demo``."""
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


NUMBERS = KINDS  # what an error calls each kind of number


def _number(file: str, path: tuple, value: Any, key: Key) -> Any:
    """A resource, budget or option value: of the right type, finite, at least ``key.low``."""
    if value is None and key.none:
        return None
    ok = isinstance(value, int) if key.type == "int" else isinstance(value, (int, float))
    ok = ok and not isinstance(value, bool) and (isinstance(value, int) or math.isfinite(value))
    ok = ok and not key.bound.below(value)
    if not ok:
        raise ConfigError(
            f"{_at(file, path[:-1])}: {path[-1]} must be {NUMBERS[key.type]} "
            f"{'>' if key.above else '>='} {key.low:g}, got {value!r}"
        )
    if key.bound.over(value):
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
    """A non-empty list of seeds (``bounds.is_seed_list``); the same seed twice is allowed."""
    if not is_seed_list(value):
        raise ConfigError(
            f"{_at(file, path[:-1])}: {path[-1]} must be a list of integers >= {key.low:g} "
            f"and < {_bound(key.high + 1)} ({key.why}), got {value!r}"
        )
    return value


def axis_values(where: str, value: Any) -> list:
    """The values of a grid axis or constant at ``where``: ``{grid_search: [...]}``'s list, or ``[value]``."""
    return grid_values(where, value)


def grid_values(where: str, value: Any) -> list:
    """A grid axis: ``{grid_search: [...]}`` or one constant (Ray's own names)."""
    if isinstance(value, dict):
        if set(value) == {"grid_search"} and isinstance(value["grid_search"], list) and value["grid_search"]:
            return list(value["grid_search"])
        if len(value) == 1 and next(iter(value)) in SAMPLERS:
            raise ConfigError(
                f"{where}: {next(iter(value))!r} is a sampling distribution; a grid takes "
                "grid_search lists (sampled spaces run with python -m raystudy search)"
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
    "axis": lambda file, path, value, key: grid_values(_at(file, path), value),
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
    opts = section.get(model) or section.get(registry.resolve_name(model)) or {}
    return {**defaults(MODEL), **opts}


def tune_options(space) -> dict[str, Any]:
    """A space's ``tune`` section over the defaults."""
    return {**defaults(TUNE), **space.tune}


# ---------------------------------------------------------------- searches


@dataclass(frozen=True)
class Param:
    """A searched parameter: its distribution (``kind``, a name in ``DISTS``) and ``args``, and
    ``when``: the values of other parameters it is sampled under (none: always)."""

    name: str
    kind: str
    args: tuple
    when: dict[str, tuple] = field(default_factory=dict)
