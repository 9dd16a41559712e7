import json
import os
import subprocess
import sys

import pytest
import yaml

from raystudy.commands import finetune
from tests.helpers import REPO

QUICK = [
    "--set",
    "pretrained=false",
    "--steps",
    "6",
    "--warmup-steps",
    "1",
    "--eval-every",
    "3",
    "--set",
    "log_every=3",
]


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    """finetune saves its results and its MLflow store in the working directory by default."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--model", "vit_bogus"], "unknown model 'vit_bogus'"),
        (["--dataset", "mnist"], "unknown dataset 'mnist'"),
        (["--condition", "FC3+MHA"], "unknown component 'FC3'"),
        (["--optimizer", "lion"], "unknown optimizer 'lion'"),
        (["--set", "learning_rate=0.1"], "unknown config key 'learning_rate'"),
        (["--set", "steps"], "--set expects key=value"),
        (["--config", "/nonexistent.yaml"], "does not exist"),
        (["--dataset", "cifar10c_snow", "--set", "data_root=/nonexistent"], "CIFAR-10-C"),
    ],
)
def test_bad_input_exits_2_with_one_line(argv, needle, capsys):
    assert finetune.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert needle in err[0]


def test_bad_config_file_key(tmp_path, capsys):
    p = tmp_path / "c.yaml"
    p.write_text("lr: 0.1\nmomentun: 0.9\n")
    assert finetune.main(["--config", str(p)]) == 2
    assert "unknown config key 'momentun' (did you mean 'momentum'?)" in capsys.readouterr().err


def test_run_writes_config_and_results_that_rerun(tmp_path, capsys):
    out = tmp_path / "run"
    assert finetune.main(QUICK + ["--condition", "LN2", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "grad" in printed and "test acc" in printed and "trainable parameters" in printed
    res = json.loads((out / "results.json").read_text())
    cfg = yaml.safe_load((out / "config.yaml").read_text())
    assert res["status"] == "finished" and cfg["condition"] == "LN2"
    # the written config reruns as it is
    assert finetune.main(["--config", str(out / "config.yaml"), "--quiet"]) == 0
    assert f"test acc {res['test_acc']:.4f}" in capsys.readouterr().out


def test_cli_subprocess_exit_status():
    p = subprocess.run(
        [sys.executable, "-m", "raystudy", "finetune", "--optimizer", "adam"],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2
    assert p.stderr.strip() == "error: unknown optimizer 'adam'; valid: sgd, adamw"
