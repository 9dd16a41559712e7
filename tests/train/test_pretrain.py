"""Weights raystudy builds itself: built once, with a manifest; a corrupt file is named and rebuilt."""

import dataclasses
import re

import pytest

from raystudy.models import registry
from raystudy.train import pretrain


@pytest.fixture()
def tiny(tmp_path, monkeypatch):
    """A local model like vit_demo whose recipe pretrains in a few steps, cached under tmp_path."""
    monkeypatch.setenv("RAYSTUDY_CACHE", str(tmp_path))
    spec = registry.LOCAL_MODELS["vit_demo"]
    recipe = {**spec.pretrain, "steps": 4, "warmup_steps": 1, "eval_every": 2, "log_every": 2}
    monkeypatch.setitem(registry.LOCAL_MODELS, "vit_tiny_test", dataclasses.replace(spec, pretrain=recipe))
    return "vit_tiny_test"


def test_truncated_or_zeroed_weights_are_named_then_rebuilt(tiny):
    logs = []
    path = pretrain.ensure_weights(tiny, log=logs.append)
    # first use says what it builds, then that it is done and how long it took
    assert logs[0].startswith("first use: pretraining") and str(path) in logs[0], logs
    assert re.match(r"pretrained \S+ in \d+ s: source test accuracy \d\.\d{3}$", logs[-1]), logs
    good = path.read_bytes()
    registry.create_model(tiny, 10)  # as built: loads
    for bad, why in ((good[: len(good) // 2], "bytes"), (b"\0" * len(good), "checksum")):
        path.write_bytes(bad)
        with pytest.raises(registry.WeightsUnavailable) as e:
            registry.create_model(tiny, 10)  # what a trial does: never a silent load
        msg = str(e.value)
        assert str(path) in msg and why in msg and "\n" not in msg, msg
        logs.clear()
        assert pretrain.ensure_weights(tiny, log=logs.append) == path  # what every CLI does first
        assert any("rebuilding" in line and str(path) in line for line in logs), logs
        registry.create_model(tiny, 10)
    assert pretrain.ensure_weights(tiny, log=logs.append) == path
