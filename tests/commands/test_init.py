"""``raystudy init``: the written space loads, dry-runs and keeps the paper's protocol scaled to the
data; an existing file is never overwritten; and (slow) the space runs as it is: an image folder
with a grey and a CMYK image -> init -> grid -> every trial finished in MLflow with the test split's hash."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from raystudy.commands import init
from raystudy.data import userdata
from raystudy.spaces import grids, starter
from tests.helpers import REPO, class_folders, experiment_runs


def image_folder(root: Path, n: int = 8) -> Path:
    """Two classes of ``n`` 16x16 PNGs (dark and bright), a grey PNG and a CMYK JPEG among them."""
    class_folders(root, ("dark", "bright"), n=n, spread=80, step=160)
    Image.new("L", (16, 16), 20).save(root / "dark" / "grey.png")
    Image.new("CMYK", (16, 16), (0, 0, 0, 10)).save(root / "bright" / "cmyk.jpg")
    return root


def run_init(tmp_path: Path, *argv: str) -> int:
    """``raystudy init ARGV`` in ``tmp_path``, in this process; its exit status."""
    old = os.getcwd()
    os.chdir(tmp_path)
    try:
        return init.main(list(argv))
    finally:
        os.chdir(old)


def test_the_written_space_loads_dry_runs_and_keeps_the_papers_grid(tmp_path, capfd, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    image_folder(tmp_path / "photos")
    assert run_init(tmp_path, "--model", "vit_demo", "--data", "photos", "--out", "study/space.yaml") == 0
    out = capfd.readouterr().out
    assert "image(s) not RGB (CMYK 1, L 1); converted to RGB" in out
    assert "75 trials = 1 datasets × 7 conditions" in out  # 6 conditions x 4 lrs x 3 seeds + the linear probe's 3
    assert "adaptive race" in out and "dry run: nothing started" in out
    path = tmp_path / "study" / "space.yaml"
    assert path.read_text().startswith("# Written by: raystudy init")
    space, paper = grids.load_grid(str(path)), grids.load_grid("paper")
    assert space.datasets["photos"]["data"] == str(tmp_path / "photos")  # written relative, read absolute
    assert space.grid["lr"] == paper.grid["lr"] and space.grid["seed"] == paper.grid["seed"]
    assert space.grid["condition"] == ["LN1", "MHA", "LN2", "FC1", "FC2", "full", "linear_probe"]
    assert space.optimizers == paper.optimizers
    assert space.base["normalization"] == "checkpoint"  # the demo model is grey: ImageNet's statistics are RGB
    plan = grids.plan(space, "vit_demo")
    assert plan["trials"] == 75 and plan["datasets"] == ["photos"]
    # 18 images: a fixed test split of 4, a pool of 14, 11 of them for training per run
    assert space.base["batch_size"] == 8 and space.datasets["photos"]["steps"] == grids.MIN_STEPS
    assert space.datasets["photos"]["eval_every"] == grids.MIN_STEPS // grids.EVALUATIONS


def test_an_existing_file_is_never_overwritten(tmp_path, capsys):
    image_folder(tmp_path / "photos")
    (tmp_path / "space.yaml").write_text("mine\n")
    assert run_init(tmp_path, "--model", "vit_demo", "--data", "photos") == 2
    assert "exists; init never overwrites" in capsys.readouterr().err
    assert (tmp_path / "space.yaml").read_text() == "mine\n"


def test_the_protocol_scales_with_the_data():
    big = starter.protocol(40_000, demo=False)
    assert big == {"steps": 782, "warmup_steps": 156, "eval_every": 39, "batch_size": 512}  # 10 epochs
    assert starter.protocol(10**8, demo=False)["steps"] == grids.PAPER_STEPS
    small = starter.protocol(11, demo=True)
    assert small["batch_size"] == 8 and small["steps"] == grids.MIN_STEPS
    assert starter.protocol(11, demo=True, steps=4) == {"steps": 4, "warmup_steps": 1, "eval_every": 1, "batch_size": 8}


def test_a_paper_model_takes_the_papers_resources_and_normalisation(tmp_path):
    image_folder(tmp_path / "photos", n=40)
    part = userdata.partition(userdata.scan(str(tmp_path / "photos")))
    assert grids.training_size(part) == 53  # 82 images: a test split of 16, 13 of the pool for validation
    doc = starter.space_doc("vit_base", "photos", "photos", starter.protocol(grids.training_size(part), demo=False))
    assert doc["base"]["normalization"] == "imagenet" and doc["base"]["batch_size"] == 32
    assert doc["models"] == {"vit_base": grids.load_grid("paper").models["vit_base"]}
    assert starter.dataset_name("/x/my photos.csv", None) == "my_photos"
    assert starter.dataset_name("/x/cifar10", None) == "cifar10_own"


@pytest.mark.slow
def test_init_then_grid_finishes_every_trial_with_the_test_split_recorded(
    tmp_path, demo_weights, mlflow_uri, shared_ray
):
    from tests.commands.test_grid_ray import trial_runs
    from tests.helpers import driver_env

    env = driver_env(PYTHONPATH=str(REPO))
    image_folder(tmp_path / "photos")
    cmd = [sys.executable, "-m", "raystudy"]
    p = subprocess.run(
        [*cmd, "init", "--model", "vit_demo", "--data", "photos", "--steps", "4", "--seeds", "1"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    grid = [*cmd, "grid", "--space", "space.yaml", "--conditions", "MHA,linear_probe"]
    grid += ["--quiet", *shared_ray]  # 4 lrs of MHA and the linear probe: 5 trials
    p = subprocess.run(grid, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "5 finished, 0 diverged, 0 failed, 0 unfinished" in p.stdout
    assert p.stdout.count("converted to RGB") == 1  # said once
    part = userdata.partition(userdata.scan(str(tmp_path / "photos")))
    df = trial_runs(mlflow_uri, "raystudy-photos-vit_demo")
    assert len(df) == 5 and set(df["status"]) == {"FINISHED"}
    assert set(df["tags.raystudy.data.test_hash"]) == {part.test_hash}
    assert set(df["tags.raystudy.data.test_size"]) == {"4"}
    assert set(df["tags.raystudy.data.location"]) == {str(tmp_path / "photos")}
    assert set(df["params.data"]) == {str(tmp_path / "photos")} and set(df["params.dataset"]) == {"photos"}
    import mlflow

    cl = mlflow.MlflowClient(mlflow_uri)
    parent = experiment_runs(cl, "raystudy-photos-vit_demo", "tags.`raystudy.role` = 'grid'")[0]
    assert parent.data.params["data/photos/test_hash"] == part.test_hash


@pytest.mark.slow
def test_an_image_broken_after_the_check_fails_its_trial_by_name_and_the_grid_goes_on(
    tmp_path, demo_weights, mlflow_uri, shared_ray
):
    import yaml

    from tests.commands.test_grid_ray import trial_runs
    from tests.helpers import driver_env

    good, bad = image_folder(tmp_path / "good"), image_folder(tmp_path / "bad")
    space = {
        "study": "broken",
        "base": {"model": "vit_demo", "steps": 4, "warmup_steps": 1, "eval_every": 2, "batch_size": 8},
        "grid": {"condition": "MHA", "lr": 0.01, "seed": 0},
        "datasets": {"good": {"data": "good"}, "bad": {"data": "bad"}},
        "tune": {"max_failures": 0, "max_concurrent": 1},
    }
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(space))
    for root in (good, bad):
        userdata.verify(str(root))  # the checks' verdicts, as a first grid run leaves them
    # A test image broken after the check, its size and mtime kept: the cached verdict still holds
    victim = Path(userdata.partition(userdata.scan(str(bad))).test.items[0])
    st = victim.stat()
    victim.write_bytes(b"\0" * st.st_size)
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))
    grid = [sys.executable, "-m", "raystudy", "grid", "--space", "space.yaml", "--quiet", *shared_ray]
    p = subprocess.run(
        grid, cwd=tmp_path, env=driver_env(PYTHONPATH=str(REPO)), capture_output=True, text=True, timeout=900
    )
    assert p.returncode == 1, p.stdout[-3000:] + p.stderr[-3000:]
    assert "1 finished, 0 diverged, 1 failed, 0 unfinished" in p.stdout
    df = trial_runs(mlflow_uri, "raystudy-broken-vit_demo").set_index("params.dataset")
    assert df.loc["good", "status"] == "FINISHED" and df.loc["bad", "status"] == "FAILED"
    assert (
        victim.name in df.loc["bad", "tags.raystudy.error"]
        and "cannot be decoded" in df.loc["bad", "tags.raystudy.error"]
    )


def test_grid_data_adds_your_images_to_a_space_with_the_protocol_scaled(tmp_path, capsys, monkeypatch):
    from raystudy.commands import grid

    image_folder(tmp_path / "photos")
    monkeypatch.chdir(tmp_path)
    space = grids.with_data(grids.load_grid("paper"), {"photos": "photos"})
    entry = space.datasets["photos"]
    assert entry == {"data": str(tmp_path / "photos"), **grids.scaled_protocol(11, 512)}
    assert entry["batch_size"] == 8 and entry["steps"] == grids.MIN_STEPS  # not the paper's 2,000 warmup steps
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert (
        grid.main(["--model", "vit_base", "--data", "photos=photos", "--dry-run", "--tracking-uri", "sqlite:///m.db"])
        == 0
    )
    out = capsys.readouterr().out
    assert "75 trials = 1 datasets" in out and "  datasets: photos\n" in out and "converted to RGB" in out
