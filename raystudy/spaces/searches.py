"""Searches: a search file read and checked into Optuna's define-by-run space, and the trials
its samples become."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from raystudy.errors import ConfigError
from raystudy.spaces.grids import Trial, data_resolved
from raystudy.spaces.schema import (
    DISTS,
    PSEUDO_KEYS,
    SEARCH,
    SEARCH_DIR,
    Param,
    canonical_condition,
    read_space,
    space_path,
)
from raystudy.train.config import (
    FinetuneConfig,
    from_dict,
    trial_key,
)


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
        base=data_resolved(f["base"], path.parent),
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
        name = search_trial_name(trial["finetune"]["condition"], values)
        return {"trial": {**trial, "name": name, "sampled": values}}


# Where a landscape's optimum sits on each number's (log) range: off the middle and the edges,
# where neither a sampler's first draws nor its bias toward a range's centre would find it.
OPTIMUM_AT = 0.3


def landscape(space: SearchSpace) -> dict[str, dict[str, Any]]:
    """A rehearsal's known optimum over ``space``'s params (``train.rehearsal.landscape_score``
    scores a config on it): a number's at ``OPTIMUM_AT`` of its (log) range, a choice's last
    value, a subset's first two components; each with what the score needs to measure a
    distance from it."""
    out: dict[str, dict[str, Any]] = {}
    for p in space.params:
        d = DISTS[p.kind]
        if p.kind == "subset_of":
            out[p.name] = {"kind": "subset", "best": list(p.args[:2]), "of": list(p.args)}
        elif not d.bounds:
            out[p.name] = {"kind": "choice", "best": p.args[-1]}
        else:
            low, high = p.args[0], p.args[1] - 1 if d.integer else p.args[1]
            if d.log:
                best = math.exp(math.log(low) + OPTIMUM_AT * (math.log(high) - math.log(low)))
            else:
                best = low + OPTIMUM_AT * (high - low)
            out[p.name] = {
                "kind": "number",
                "best": round(best) if d.integer else best,
                "low": low,
                "high": high,
                "log": d.log,
            }
    return out


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
