"""The ``raystudy`` command: entry point, --version, light --help, every flag described, and
what ``raystudy finetune`` records."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from raystudy.__main__ import COMMANDS
from tests.helpers import REPO

HEAVY = ("torch", "ray", "mlflow", "optuna", "timm")
LIGHT = list(COMMANDS)  # the registry is records: even listing it loads nothing heavy
QUICK = [
    "--set",
    "pretrained=false",
    "--steps",
    "4",
    "--warmup-steps",
    "1",
    "--eval-every",
    "2",
    "--set",
    "log_every=2",
]


def run(*argv: str, cwd: Path | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    env.pop("MLFLOW_TRACKING_URI", None)
    return subprocess.run(
        [sys.executable, "-m", "raystudy", *argv], cwd=cwd or REPO, env=env, capture_output=True, text=True, timeout=300
    )


def test_console_script_is_the_module_entry_point():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["scripts"] == {"raystudy": "raystudy.__main__:main"}
    for name, (module, _) in COMMANDS.items():
        mod = importlib.import_module(module)
        assert callable(mod.main) and callable(mod.build_parser), name


def test_version_and_overview():
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    p = run("--version")
    assert p.returncode == 0 and p.stdout == f"raystudy {version}\n"
    p = run("--help")
    assert p.returncode == 0 and all(f"  {c} " in p.stdout for c in COMMANDS)


def test_unknown_command_is_one_line_exit_2():
    p = run("gird")
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.splitlines() == [
        "error: unknown command 'gird'; valid: " + ", ".join(COMMANDS) + " (see raystudy --help)"
    ]


def test_subcommands_dispatch_to_their_module():
    p = run("grid", "--dry-run", "--conditions", "MHA", "--tracking-uri", "sqlite:////tmp/none.db")
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("grid demo for vit_demo: ") and p.stdout.endswith("dry run: nothing started\n")
    p = run("grid", "--bogus")
    assert p.returncode == 2 and p.stderr.strip() == (
        "error: unrecognized arguments: --bogus (see python -m raystudy.grid --help)"
    )


def test_help_imports_no_torch_ray_or_mlflow():
    """Every --help (the overview and each command) is parsed before anything heavy
    loads: checked by what is in sys.modules after it, in a fresh interpreter per command."""
    code = (
        "import sys, io, contextlib\n"
        "from raystudy.__main__ import main\n"
        "argv = sys.argv[1:]\n"
        "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
        "    try:\n"
        "        main(argv)\n"
        "    except SystemExit as e:\n"
        "        assert e.code == 0, e.code\n"
        f"assert 'usage:' in out.getvalue()\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r}))\n"
    )
    for argv in [["--help"]] + [[c, "--help"] for c in LIGHT]:
        p = subprocess.run(
            [sys.executable, "-c", code, *argv],
            cwd=REPO,
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            timeout=60,
        )
        assert p.returncode == 0, (argv, p.stderr[-2000:])
        assert p.stdout.strip() == "[]", (argv, p.stdout)


def flags(parser: argparse.ArgumentParser):
    return [a for a in parser._actions if not isinstance(a, argparse._HelpAction)]


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_flag_has_help_and_list_flags_are_plural(command):
    parser = importlib.import_module(COMMANDS[command][0]).build_parser()
    for action in flags(parser):
        name = max(action.option_strings, key=len)
        assert action.help and len(action.help) > 8, f"{command} {name}: no help"
        # a flag taking a comma-separated list is named in the plural (singular kept as an alias)
        if "comma-separated" in action.help:
            assert action.option_strings[0].endswith("s"), f"{command} {action.option_strings}"


def test_plural_list_flags_take_one_value_and_old_singular_spelling(capsys):
    from raystudy.commands import prefetch

    for flag in ("--models", "--model"):
        args = prefetch.build_parser().parse_args([flag, "vit_demo"])
        assert prefetch.parse_models(args.models) == ["vit_demo"]


@pytest.mark.slow
def test_finetune_records_its_run_in_mlflow_and_saves_results(mlflow_uri, tmp_path, monkeypatch, capsys):
    import torch
    from mlflow import MlflowClient

    from raystudy.commands import finetune
    from raystudy.tracking import query

    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    before = torch.get_num_threads()
    try:
        rc = finetune.main(
            QUICK
            + [
                "--condition",
                "FC1",
                "--lr",
                "0.3",
                "--set",
                "probe_pairs=16",
                "--threads",
                "2",
                "--tracking-uri",
                mlflow_uri,
                "--quiet",
            ]
        )
        threads = torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
    out = capsys.readouterr().out
    assert rc == 0 and threads == 2, out
    # the probe summary: both modes, every component, before and after
    summary = out[out.index("plasticity, mean over layers") :].splitlines()
    assert summary[1].split() == ["mode", "component", "before", "after"]
    assert {(ln.split()[0], ln.split()[1]) for ln in summary[2:12]} == {
        (m, c) for m in ("shared", "in_situ") for c in ("LN1", "MHA", "LN2", "FC1", "FC2")
    }
    # results saved by default, under a name that says what ran
    folder = work / "runs" / "finetune" / "FC1-digits_c-sgd-lr0.3-s0"
    saved = json.loads((folder / "results.json").read_text())
    assert saved["status"] == "finished" and (folder / "config.yaml").is_file()
    assert (folder / "plasticity_after.csv").read_text().startswith("model,")
    # one MLflow trial run, recorded as the grid records a trial
    cl = MlflowClient(tracking_uri=mlflow_uri)
    exp = cl.get_experiment_by_name("raystudy-finetune-vit_demo")
    (run,) = query.find_runs(cl, exp.experiment_id, raystudy__role="trial")
    assert f"MLflow: run {run.info.run_id}" in out
    assert run.info.status == "FINISHED" and run.data.tags["raystudy.status"] == "finished"
    assert run.data.tags["condition"] == "FC1" and run.data.params["lr"] == "0.3"
    assert run.data.metrics["test_acc"] == pytest.approx(saved["test_acc"])
    assert [m.step for m in cl.get_metric_history(run.info.run_id, "val_acc")] == [2, 4]
    assert len(cl.get_metric_history(run.info.run_id, "grad_norm/FC1")) >= 2
    arts = {a.path for a in cl.list_artifacts(run.info.run_id)}
    assert {"config.yaml", "plasticity_before.csv", "plasticity_after.csv"} <= arts
    assert sorted(p.name for p in work.iterdir()) == ["runs"]  # only the store it was given


def test_finetune_no_mlflow_no_save_writes_nothing(tmp_path, monkeypatch, capsys):
    from raystudy.commands import finetune

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert finetune.main(QUICK + ["--no-mlflow", "--no-save", "--quiet"]) == 0
    assert "test acc" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []


def test_report_against_a_missing_store_is_one_line_and_creates_nothing(tmp_path):
    for argv in (
        ["report", "--experiment", "raystudy-demo-vit_demo"],
        ["export", "--experiment", "raystudy-demo-vit_demo", "--out", "best"],
    ):
        p = run(*argv, cwd=tmp_path)
        assert p.returncode == 2
        assert p.stderr.splitlines() == [
            f"error: no MLflow store at {tmp_path / 'mlflow.db'}: run the grid "
            "there first, or pass --tracking-uri (sqlite:///PATH or http://HOST:PORT)"
        ]
        assert list(tmp_path.iterdir()) == []


def test_download_without_network_is_one_line_exit_2(tmp_path):
    """A download that cannot reach its server (a proxy on a closed port stands in for no
    network, whatever this machine has) ends in one line, not urllib's traceback."""
    closed = "http://127.0.0.1:9"
    p = run(
        "finetune",
        "--dataset",
        "cifar10",
        "--download",
        "--data-root",
        str(tmp_path / "data"),
        "--no-mlflow",
        "--no-save",
        *QUICK,
        cwd=tmp_path,
        env={
            "http_proxy": closed,
            "https_proxy": closed,
            "HTTP_PROXY": closed,
            "HTTPS_PROXY": closed,
            "no_proxy": "",
            "NO_PROXY": "",
        },
    )
    assert p.returncode == 2, p.stderr[-3000:]
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: dataset 'cifar10': download failed ("), lines[-5:]
    assert "prefetch --datasets cifar10" in lines[0] and "Traceback" not in p.stderr


def test_probe_help_names_the_components_plasticity_probes():
    """probe spells its choices out so that --help needs no torch: they must stay plasticity's."""
    from raystudy.commands import probe
    from raystudy.measure import plasticity

    assert probe.COMPONENTS.split(",") == list(plasticity.PROBE_COMPONENTS)
    assert probe.PAIRINGS == plasticity.PAIRINGS
