"""docs/your_data.md end to end, once per kind of data: generated images (examples/make_images.py)
→ ``raystudy init`` → ``raystudy grid --space`` (a few steps) → ``raystudy report``, which opens
with the answer. The folder's run starts with a truncated file, refused by name before anything runs,
as a user would meet it; its greyscale and CMYK images are converted and said once."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import driver_env

REPO = Path(__file__).resolve().parent.parent
RAYSTUDY = [sys.executable, "-m", "raystudy"]


def run(args: list[str], cwd: Path, timeout: int = 900) -> subprocess.CompletedProcess:
    """A command line as a user runs it, in ``cwd``; its output kept for the assertions."""
    env = driver_env(PYTHONPATH=str(REPO))
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def make_images(tmp: Path, fmt: str, *extra: str) -> str:
    """The docs' example set in ``fmt``; the path ``init --data`` takes."""
    p = run([sys.executable, str(REPO / "examples" / "make_images.py"), "data", "--format", fmt, *extra], tmp)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip()


def init_grid_report(tmp: Path, data: str, name: str, shared_ray: list[str]) -> str:
    """init → grid → report as docs/your_data.md runs them; the report's markdown."""
    p = run(
        [*RAYSTUDY, "init", "--model", "vit_demo", "--data", data, "--name", name, "--steps", "6", "--seeds", "1"], tmp
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "wrote space.yaml" in p.stdout and "adaptive race" in p.stdout
    grid = [*RAYSTUDY, "grid", "--space", "space.yaml", "--conditions", "MHA,linear_probe", "--quiet", *shared_ray]
    p = run(grid, tmp)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "5 finished, 0 diverged, 0 failed, 0 unfinished" in p.stdout
    report = [*RAYSTUDY, "report", "--experiment", f"raystudy-{name}-vit_demo", "--out", "report", "--no-figures"]
    p = run(report, tmp)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return (tmp / "report" / "report.md").read_text()


def check_answer(md: str, name: str, tmp: Path) -> None:
    """The report opens with the answer, on this data, and its winner's config is beside it."""
    headings = [line for line in md.splitlines() if line.startswith("## ")]
    assert headings[0].startswith("## The answer") and "stable" in headings[1]
    answer = md.split(headings[0])[1].split(headings[1])[0]
    assert name in answer and "MHA" in answer and "linear_probe" in answer
    (config,) = (tmp / "report" / "best_config").glob("*.yaml")
    assert config.stem in ("MHA", "linear_probe") and config.name in answer
    import yaml

    cfg = yaml.safe_load(config.read_text())
    assert cfg["dataset"] == name and cfg["data"] and cfg["condition"] == config.stem


@pytest.mark.slow
def test_an_image_folder_with_a_broken_file_then_without(tmp_path, demo_weights, mlflow_uri, shared_ray):
    data = make_images(tmp_path, "folder", "--broken")
    p = run([*RAYSTUDY, "init", "--model", "vit_demo", "--data", data], tmp_path)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and "broken.jpg" in lines[0], p.stderr
    assert not (tmp_path / "space.yaml").exists() and not list(tmp_path.glob("mlruns*"))
    (broken,) = (tmp_path / data).rglob("broken.jpg")
    broken.unlink()  # what the user does next
    md = init_grid_report(tmp_path, data, "digits_folder", shared_ray)
    check_answer(md, "digits_folder", tmp_path)


@pytest.mark.slow
def test_a_csv_of_paths_and_labels(tmp_path, demo_weights, mlflow_uri, shared_ray):
    data = make_images(tmp_path, "csv")
    assert data.endswith("labels.csv")
    md = init_grid_report(tmp_path, data, "digits_csv", shared_ray)
    check_answer(md, "digits_csv", tmp_path)


@pytest.mark.slow
def test_a_hugging_face_dataset_saved_to_disk(tmp_path, demo_weights, mlflow_uri, shared_ray):
    pytest.importorskip("datasets")  # the test extra installs it
    data = make_images(tmp_path, "hf")
    md = init_grid_report(tmp_path, data, "digits_hf", shared_ray)
    check_answer(md, "digits_hf", tmp_path)
    shutil.rmtree(tmp_path / "report")
