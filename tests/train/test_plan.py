"""A trial is resolved once (``raystudy.train.plan``): the loop and its helpers derive none of it again."""

import functools
import types

import pytest
import torch

from raystudy.data.splits import resolve_data_path
from raystudy.errors import ConfigError
from raystudy.models import components, registry
from raystudy.train import config, engine, trial
from raystudy.train.plan import TrialPlan, resolve


@pytest.fixture()
def fast_config(fast_config):
    """conftest's fast trial, 8 steps evaluated at 4 and 8."""
    return functools.partial(fast_config, steps=8, eval_every=4, log_every=4)


# The derivations a trial makes once, in ``resolve``: the model's inputs, its normalisation, its
# family record, the probe's source, the condition's components, and the checks of the names.
DERIVED = (
    (registry, "input_config"),
    (registry, "normalization"),
    (registry, "normalization_of"),
    (registry, "architecture"),
    (registry, "source_dataset"),
    (registry, "check_model"),
    (components, "parse_condition"),
    (config, "_check_names"),
)


def _count(monkeypatch) -> dict[str, int]:
    """Count the calls of each of ``DERIVED``: each real function replaced by one that delegates to it."""
    calls = {name: 0 for _, name in DERIVED}

    def counting(name, real):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return real(*args, **kwargs)

        return wrapper

    for module, name in DERIVED:
        monkeypatch.setattr(module, name, counting(name, getattr(module, name)))
    return calls


def test_resolve_holds_what_a_trial_is(fast_config):
    cfg = fast_config(condition="MHA+FC1", optimizer="adamw", lr=0.01)
    plan = resolve(cfg)
    ic = registry.input_config("vit_demo")
    assert plan.cfg is cfg and plan.model == registry.check_model("vit_demo")
    assert plan.architecture is registry.architecture("vit_demo")
    assert plan.inputs == ic and (plan.mean, plan.std) == registry.normalization("vit_demo")
    assert plan.trainable == components.trainable_components("MHA+FC1")
    assert plan.splits.img_size == ic["img_size"] and plan.splits.channels == (ic["in_chans"] or 3)
    assert plan.splits.data_path == resolve_data_path("auto", "digits_c")  # auto resolved
    assert plan.source.name == registry.source_dataset("vit_demo")
    assert (plan.optim.optimizer, plan.optim.lr, plan.optim.betas) == ("adamw", 0.01, cfg.betas)
    assert not plan.closed_form and resolve(cfg.replace(condition="linear_probe")).closed_form
    with pytest.raises(ConfigError, match="unknown component"):  # it validates as validate does
        resolve(cfg.replace(condition="MHA+XYZ"))


def test_resolve_derives_the_inputs_once(monkeypatch, fast_config):
    calls = _count(monkeypatch)
    resolve(fast_config(probe_pairs=8))
    assert calls["input_config"] == 1 and calls["normalization"] == 0 and calls["normalization_of"] == 1
    assert calls["_check_names"] == 1 and calls["parse_condition"] == 1 and calls["source_dataset"] == 1


@pytest.mark.parametrize("condition", ["MHA", "linear_probe"])
def test_train_given_a_plan_derives_nothing_again(monkeypatch, condition, fast_config):
    cfg = fast_config(condition=condition, probe_pairs=8)
    want = engine.train(resolve(cfg))
    plan = resolve(cfg)
    calls = _count(monkeypatch)
    got = engine.train(plan)
    assert calls == {name: 0 for name in calls}, calls
    assert {k: v for k, v in got.items() if k != "wall_s"} == {k: v for k, v in want.items() if k != "wall_s"}


def test_the_engine_takes_a_plan_only(fast_config):
    cfg = fast_config(condition="MHA", probe_pairs=8)
    for run in (engine.train, engine.build):
        with pytest.raises(TypeError, match=r"takes a TrialPlan \(plan.resolve\(cfg\)\), got FinetuneConfig"):
            run(cfg)


def test_a_trial_resolves_its_config_once(monkeypatch, fast_config):
    reports = []
    # Tune's session, stood in for: no checkpoint to resume, reports kept here.
    fake_tune = types.SimpleNamespace(
        get_checkpoint=lambda: None,
        report=lambda metrics, checkpoint=None: reports.append(metrics),
        Checkpoint=None,
    )
    monkeypatch.setattr(trial, "tune", fake_tune)
    resolved = []
    real_train = engine.train
    monkeypatch.setattr(engine, "train", lambda cfg, **kw: (resolved.append(type(cfg)), real_train(cfg, **kw))[1])
    calls = _count(monkeypatch)
    cfg = fast_config(condition="MHA", probe_pairs=8)
    threads = torch.get_num_threads()
    try:
        trial.run_trial({"trial": {"key": "k", "finetune": cfg.to_dict()}, "threads": 1})
    finally:
        torch.set_num_threads(threads)  # run_trial sets the process's; later tests keep theirs
    assert resolved == [TrialPlan]  # the loop gets the plan, not the config
    assert calls["input_config"] == 1 and calls["_check_names"] == 1 and calls["source_dataset"] == 1
    assert calls["normalization"] == 0 and calls["parse_condition"] == 1
    assert reports[-1]["final"] == 1 and reports[-1]["status"] == "finished"
