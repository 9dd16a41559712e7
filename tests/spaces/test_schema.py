"""The space files' schema (``spaces.GRID``, ``spaces.SEARCH``), walked: every key it names is
accepted with a valid value and refused, in one line naming the key, with an invalid one. The
values come from each key's type and bounds, so a key added to the schema is tested here as is."""

import copy
import math

import pytest
import yaml

from raystudy.errors import ConfigError
from raystudy.spaces import grids, searches
from raystudy.spaces import schema as spaces

FILES = {
    "grid": ("demo.yaml", spaces.GRID, grids.load_grid),
    "search": ("optuna/optimiser.yaml", spaces.SEARCH, searches.load_search),
}
CONFIG_KEY = "steps"  # the config key a config section's example sets (any would do)


def _numbers(key: spaces.Key) -> tuple[list, list]:
    low = key.low
    good = [low + 1 if key.above else low] + ([low + 0.5] if key.type != "int" else []) + ([None] * key.none)
    bad = ["x", True, [low + 1], low if key.above else low - 1, 1.5 if key.type == "int" else math.nan, math.inf]
    if key.high is not None:  # the bound itself is allowed, past it is not
        good, bad = good + [key.high], bad + [key.high * 10 + 1]
    return good, bad + ([None] * (not key.none))


def _params() -> tuple[list, list]:
    """One valid parameter per distribution, and one invalid per rule a distribution has."""
    good, bad = (
        [],
        [
            {},
            {"nope": {"uniform": [0.1, 0.2]}},
            {"lr": {"nope": [0.1, 0.2]}},
            {"lr": 5},
            {"lr": {"uniform": [0.1, 0.2], "choice": [1]}},
            {"lr": {"uniform": [0.1, 0.2], "when": {"nope": 1}}},
        ],
    )
    for kind, d in spaces.DISTS.items():
        name = d.only or ("warmup_steps" if d.integer else "lr" if d.bounds else "batch_size")
        if d.bounds:
            good.append({name: {kind: [1, 8]}})
            bad += [{name: {kind: [8, 1]}}, {name: {kind: [math.nan, 1]}}, {name: {kind: "x"}}]
            bad += [{name: {kind: [0, 8]}}] if d.log else []
            bad += [{name: {kind: [1.5, 8]}}] if d.integer else []
        else:
            good.append({name: {kind: list(d.among[:2]) or [32, 64]}})
            bad += [{name: {kind: []}}, {name: {kind: "x"}}]
            bad += [{name: {kind: ["nope"]}}, {"lr": {kind: list(d.among[:2])}}] if d.among else []
    return good, bad


def examples(key: spaces.Key) -> tuple[list, list]:
    """(valid values, invalid values) of ``key``, from its type and bounds."""
    t = key.type
    if t in spaces.NUMBERS:
        return _numbers(key)
    if t in ("section", "config"):
        return [{}] + ([{CONFIG_KEY: 50}] if t == "config" else []), ["x", [1], {"nope_key": 1}]
    if t == "map":
        entry = {"an_entry": examples(key.each)[0][0]}
        return ([entry] if key.required else [{}, entry]), ["x", [1]] + ([{}] if key.required else [])
    if t == "seeds":
        return [[key.low, 7, key.high]], [[], ["a"], [key.low - 1], [True], 5, [key.high + 1]]
    if t == "path":
        return ["some/file.json"] + [None] * key.none, ["", "  ", 5, ["a"]]
    return {
        "name": (["ok-name.1"], ["a/b", "..", "a b", 5]),
        "text": (["any words", 5], []),
        "conditions": ([["MHA", "FC1+LN2"]], ["MHA", 5, {"a": 1}, ["FC9"], [["MHA"]]]),
        "names": ([[]], ["x", [5], [" "], ["nope"]]),
        "axis": ([{"grid_search": [50, 60]}, 50], [{"grid_search": []}, {"loguniform": [1, 2]}, {"x": 1}]),
        "params": _params(),
    }[t]


def walk(keys: dict, raw: dict, path: tuple = ()):
    """(path, key) of every key the schema names, below ``path``; a map's entries by a name the
    shipped file uses (or ``entry``)."""
    for name, key in keys.items():
        yield path + (name,), key
        sub = raw.get(name) if isinstance(raw.get(name), dict) else {}
        if key.type == "map":
            entry = next(iter(sub), "entry")
            yield path + (name, entry), key.each
            yield from walk(key.each.keys, sub.get(entry) or {}, path + (name, entry))
        else:
            yield from walk(key.keys, sub, path + (name,))
            if key.each is not None:
                yield path + (name, CONFIG_KEY), key.each


def cases():
    for kind, (file, schema, _) in FILES.items():
        raw = yaml.safe_load((spaces.SPACES_DIR / file).read_text())
        for path, key in walk(schema, raw):
            good, bad = examples(key)
            for ok, values in ((True, good), (False, bad)):
                for v in values:
                    yield pytest.param(kind, path, v, ok, id=f"{kind}-{'.'.join(map(str, path))}={v!r}-{ok}")


def _with(raw: dict, path: tuple, value) -> dict:
    raw = copy.deepcopy(raw)
    d = raw
    for p in path[:-1]:
        if not isinstance(d.get(p), dict):
            d[p] = {}
        d = d[p]
    d[path[-1]] = value
    return raw


@pytest.mark.parametrize("kind,path,value,ok", list(cases()))
def test_every_schema_key_takes_valid_values_and_refuses_invalid_ones(tmp_path, kind, path, value, ok):
    file, _, load = FILES[kind]
    raw = yaml.safe_load((spaces.SPACES_DIR / file).read_text())
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump(_with(raw, path, value)))
    if ok:
        load(str(f))
        return
    with pytest.raises(ConfigError) as e:
        load(str(f))
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(("s.yaml", "unknown key", "condition", "search space s.yaml")), msg
    assert str(path[-1]) in msg or (path[-1] == "conditions" and "conditions" in msg), msg


def test_the_walk_reaches_every_key_and_type():
    seen = {
        (kind, path): key
        for kind, (file, schema, _) in FILES.items()
        for path, key in walk(schema, yaml.safe_load((spaces.SPACES_DIR / file).read_text()))
    }
    assert {key.type for key in seen.values()} == set(spaces.CHECKS)
    assert ("grid", ("models", "vit_demo", "step_seconds")) in seen
    assert ("grid", ("optimizers", "sgd", "lr_scale")) in seen
    assert ("search", ("budget", "num_samples")) in seen


def test_unknown_keys_are_refused_naming_the_valid_ones(tmp_path):
    raw = yaml.safe_load((spaces.SPACES_DIR / "demo.yaml").read_text())
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump({**raw, "tune": {"retries": 3}}))
    with pytest.raises(
        ConfigError,
        match="unknown key 'retries' in s.yaml: tune; valid: max_failures, "
        "max_concurrent, threads_per_trial, checkpoint_every_s, trials_per_run$",
    ):
        grids.load_grid(str(f))


def test_defaults_come_from_the_schema(tmp_path):
    f = tmp_path / "g.yaml"
    f.write_text(yaml.safe_dump({"datasets": {"digits_c": None}}))
    g = grids.load_grid(str(f))
    assert (g.study, g.description, g.optimizers, g.tune, g.models) == ("g", "", {"sgd": {}}, {}, {})
    assert g.step_times is None
    assert spaces.tune_options(g) == {
        "max_failures": 2,
        "max_concurrent": None,
        "threads_per_trial": 1,
        "checkpoint_every_s": 60.0,
        "trials_per_run": 500,
    }
    assert spaces.model_options(g.models, "vit_demo") == {
        "gpu": 0,
        "cpu": 1,
        "workers": 1,
        "step_seconds": None,
        "config": {},
    }
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump({"params": {"lr": {"uniform": [0.1, 0.2]}}, "study": "", "conditions": []}))
    s = searches.load_search(str(f))
    assert (
        s.study,
        s.conditions,
        s.num_samples,
        s.time_budget_s,
        s.grace_period,
        s.reduction_factor,
        s.seed,
        s.test_seeds,
        s.tune,
    ) == ("search-s", ("MHA",), 16, None, 1, 3, 0, (100, 101, 102), {})
