import subprocess
import sys

import pytest
import yaml

from raystudy.commands import grid
from raystudy.spaces import grids, schema
from tests.helpers import class_folders, driver_env, fill


def test_paper_grid_for_vit_base_is_the_papers_grid_with_a_linear_probe_that_has_no_lr():
    space = grids.load_grid("paper")
    trials = grids.expand(space, "vit_base")
    assert len(trials) == 11 * (6 * 4 + 1) * 3 == 825
    assert len({t.config["dataset"] for t in trials}) == 11
    assert len({t.key for t in trials}) == 825
    probe = [t for t in trials if t.config["condition"] == "linear_probe"]
    assert len(probe) == 11 * 3 and len({(t.config["dataset"], t.config["seed"]) for t in probe}) == 33
    # the paper's protocol: ImageNet normalisation, sequential pairs, evaluation cadence per dataset
    assert {t.config["normalization"] for t in trials} == {"imagenet"}
    assert {t.config["probe_pairing"] for t in trials} == {"sequential"}
    # the reference probes ViT-B in batches of 64, ViT-L/H in 32 (apps/vit/scripts/analysis.sh)
    assert {t.config["probe_batch_size"] for t in trials} == {64}
    assert {t.config["probe_batch_size"] for t in grids.expand(space, "vit_huge", datasets=["pets"])} == {32}
    every = {t.config["dataset"]: t.config["eval_every"] for t in trials}
    assert every["cifar10c_snow"] == 350 and every["flowers102"] == 250 and every["pets"] == 200
    assert every["cifar10"] == every["domainnet_sketch"] == 500
    dn = [t for t in trials if t.config["dataset"] == "domainnet_sketch"]
    assert sorted({t.config["lr"] for t in dn}) == [3e-3, 1e-2, 3e-2, 6e-2]
    assert {t.config["steps"] for t in dn} == {20000}
    assert {t.config["steps"] for t in trials if t.config["dataset"] == "pets"} == {4000}
    assert {t.config["model"] for t in trials} == {"vit_base"}


def test_adamw_ablation_scales_the_lr_grid():
    space = grids.load_grid("paper")
    trials = grids.expand(space, "vit_base", datasets=["cifar10"], optimizers=["sgd", "adamw"])
    assert len(trials) == 2 * (6 * 4 + 1) * 3  # the linear probe has no lr axis
    lrs = sorted({t.config["lr"] for t in trials if t.config["optimizer"] == "adamw"})
    assert lrs == pytest.approx([1e-5, 3e-5, 1e-4, 3e-4])


def test_restrictions_and_overrides():
    space = grids.load_grid("demo")
    trials = grids.expand(space, None, conditions=["MHA+FC1"], overrides={"steps": 40, "warmup_steps": 4})
    assert {t.config["condition"] for t in trials} == {"MHA+FC1"}
    assert {t.config["steps"] for t in trials} == {40}
    assert len(trials) == 16  # 4 datasets x 2 lrs x 2 seeds


def test_trial_key_ignores_how_a_trial_runs_but_not_what_it_is():
    space = grids.load_grid("demo")
    a = grids.expand(space, None)[0]
    b = grids.expand(space, None, overrides={"device": "cpu", "num_workers": 2})[0]
    c = grids.expand(space, None, overrides={"steps": 301})[0]
    assert a.key == b.key != c.key


def _space(tmp_path, **changes):
    raw = yaml.safe_load(open(schema.space_path("demo")))
    raw.update(changes)
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(raw))
    return str(p)


@pytest.mark.parametrize(
    "changes,needle",
    [
        (dict(colour="red"), "unknown key 'colour' in search space"),
        (dict(grid={"lr": {"loguniform": [1e-3, 1e-1]}}), "sampling distribution"),
        (dict(grid={"lrr": {"grid_search": [0.1]}}), "unknown key 'lrr'"),
        (dict(grid={"lr": {"grid_search": []}}), "expected {grid_search"),
        (dict(datasets={}), "at least one dataset"),
        (dict(datasets={"mnist": {}}), "unknown dataset 'mnist'"),
        (dict(tune={"retries": 3}), "unknown key 'retries'"),
        (dict(study="../../x"), "study '../../x'"),  # it names the folder under --storage
        (dict(study="a/b"), "study 'a/b'"),
    ],
)
def test_bad_spaces_are_refused_before_any_trial(tmp_path, changes, needle, capsys):
    assert grid.main(["--space", _space(tmp_path, **changes), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--space", "nope"], "unknown search space 'nope'"),
        (["--space", "demo", "--datasets", "cifar10"], "--datasets: cifar10 not in this space"),
        (["--space", "demo", "--conditions", "EMBED"], "--conditions: EMBED not in this space"),
        (["--space", "demo", "--conditions", "FC3"], "unknown component 'FC3'"),
        (["--space", "demo", "--optimizers", "lion"], "--optimizers: lion not in this space"),
        (["--space", "demo", "--model", "resnet50"], "not a timm VisionTransformer"),
        (["--space", "demo", "--set", "lrr=1"], "unknown config key 'lrr'"),
        (["--space", "demo", "--max-failures", "-1"], "--max-failures"),
    ],
)
def test_bad_flags_exit_2(argv, needle, capsys):
    assert grid.main(argv + ["--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err


def test_dry_run_paper_vit_base_prints_datasets_trials_and_gpu_hours(capsys):
    assert grid.main(["--model", "vit_base", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "825 trials = 11 datasets" in out
    assert "GPUs per trial: 1" in out and "GPU-hours" in out
    assert "nothing started" in out


def test_dry_run_vit_huge_uses_ddp_workers(capsys):
    assert grid.main(["--model", "vit_huge", "--dry-run"]) == 0
    assert "GPUs per trial: 4 (4 DDP workers)" in capsys.readouterr().out


def test_unreachable_tracking_server_and_unknown_address_exit_2(tmp_path, capsys):
    assert grid.main(["--space", "demo", "--tracking-uri", "http://127.0.0.1:9"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unreachable" in err[0]
    uri = f"sqlite:///{tmp_path}/m.db"
    assert grid.main(["--space", "demo", "--tracking-uri", uri, "--address", "127.0.0.1:9"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no Ray cluster answers" in err[0]
    assert grid.main(["--space", "demo", "--tracking-uri", "file:///tmp/x"]) == 2
    assert "file store is disabled" in capsys.readouterr().err


SMALL = {
    "study": "t",
    "base": {"model": "vit_demo", "steps": 40},
    "grid": {"condition": {"grid_search": ["MHA", "LN2"]}, "lr": {"grid_search": [0.1, 0.3]}, "seed": 0},
    "datasets": {"digits_c": {}},
    "models": {"vit_demo": {"gpu": 1, "cpu": 1, "step_seconds": 90}},
}


def _record(uri, trials, accs):
    """Finished runs of ``trials`` in the store, written as the grid's driver writes them."""
    from raystudy.tracking import connect, record

    cl = connect.client(uri)
    exp = connect.experiment_id(cl, "raystudy-t-vit_demo", connect.default_artifact_location(uri))
    for t, acc in zip(trials, accs):
        run = record.open_trial(cl, exp, None, t.key, t.config)
        record.finish_trial(cl, run, {"status": "finished", "final": 1, "best_val_acc": acc, "test_acc": acc})


def test_dry_run_counts_what_mlflow_holds_and_a_finished_grid_answers_without_ray(tmp_path, mlflow_uri):
    space_file = tmp_path / "space.yaml"
    space_file.write_text(yaml.safe_dump(SMALL))
    trials = grids.expand(grids.load_grid(str(space_file)), "vit_demo")
    order = sorted(trials, key=lambda t: (t.config["condition"], t.config["lr"]))  # LN2 0.1, 0.3, MHA 0.1, 0.3
    flags = ["--space", str(space_file), "--tracking-uri", mlflow_uri]
    import subprocess
    import sys

    def grid_run(*extra):  # a fresh process: whether it imported Ray is its own
        code = (
            "import sys; from raystudy.commands import grid; rc = grid.main(sys.argv[1:]); "
            "print('ray imported:', 'ray' in sys.modules, "
            "'; scipy.stats imported:', 'scipy.stats' in sys.modules); sys.exit(rc)"
        )
        return subprocess.run(
            [sys.executable, "-c", code, *flags, *extra], cwd=tmp_path, capture_output=True, text=True, timeout=300
        )

    fresh = tmp_path / "fresh.db"
    assert grid.main(["--space", str(space_file), "--tracking-uri", f"sqlite:///{fresh}", "--dry-run"]) == 0
    assert not fresh.exists()  # a dry run reads the store, never creates one

    _record(mlflow_uri, order[:3], [0.2, 0.3, 0.5])
    p = grid_run("--dry-run")
    assert p.returncode == 0, p.stderr
    # 40 steps x 90 s: a GPU-hour per trial; the one left to run is one of the grid's four
    assert "estimate 4 GPU-hours" in p.stdout
    assert "already done (in MLflow): 3 of 4 trials; 1 to run, 1 GPU-hours" in p.stdout, p.stdout
    assert "ray imported: False" in p.stdout

    _record(mlflow_uri, order[3:], [0.4])
    p = grid_run()
    assert p.returncode == 0, p.stdout + p.stderr
    assert "all 4 trials are already done" in p.stdout and "ray imported: False" in p.stdout
    assert "scipy.stats imported: False" in p.stdout  # the ranking is printed without it (~2 s of CPU)
    lines = p.stdout.splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.startswith("ranking"))
    # LN2 best on validation at lr 0.3 (0.3), MHA at lr 0.1 (0.5): MHA first
    assert lines[head + 2].split()[:2] == ["MHA", "0.5000"] and lines[head + 3].split()[:2] == ["LN2", "0.3000"]
    assert "PARTIAL" not in p.stdout


def test_dry_run_adaptive_projects_the_paper_grid(capsys):
    assert grid.main(["--model", "vit_base", "--dry-run", "--adaptive", "halving"]) == 0
    out = capsys.readouterr().out
    # per (dataset, condition) of 4 lrs x 3 seeds: seed 0 runs 2 lrs whole and 2 to the
    # milestone, seeds 1 and 2 the 2 kept lrs (6.5 of 12 trials' steps at a 25% milestone);
    # CIFAR-10-C evaluates every 350 steps, so its milestone is 2,800 of 10,000: 54.4% over the
    # grid instead of 54.2%
    assert "from the grid's shape: 54.4% of the steps" in out
    full = float(out.split("estimate ")[1].split(" GPU-hours")[0].replace(",", ""))
    spent = float(out.split("54.4% of the steps, ")[1].split(" of ")[0].replace(",", ""))
    assert 0.52 * full < spent < 0.57 * full and "nothing started" in out


def test_dry_run_adaptive_race_projects_both_ends(capsys):
    assert grid.main(["--model", "vit_base", "--dry-run", "--adaptive", "race"]) == 0
    out = capsys.readouterr().out
    # at best one lr per cell of 4 lrs x 3 seeds runs every seed and the other three stop at the
    # first milestone of the first seed, 12.5% of the steps rounded up to an evaluation (0.125 to
    # 0.15 of the steps across the paper's datasets): (3 + 3 x f) / 12, between 28.1% and 28.75%
    assert "every lr stays in the race: 100.0% of the steps" in out
    assert "one lr per cell is left at the first milestone: 28.4% of the steps" in out


@pytest.mark.parametrize("hub", [False, True], ids=["folder", "hf"])
def test_a_grid_whose_data_changed_under_its_recorded_runs_says_so_in_one_line_and_refuses(
    tmp_path, mlflow_uri, capsys, hub
):
    # ``hf:`` names a hub dataset, here one Hugging Face reads from a local folder offline
    from raystudy.tracking import connect, record

    photos = class_folders(tmp_path / "photos")
    data = f"hf:{photos}" if hub else str(photos)
    argv = ["--data", f"mine={data}", "--conditions", "MHA", "--tracking-uri", mlflow_uri, "--experiment", "e"]
    job = grid.prepare(grid.build_parser().parse_args(argv))  # not a dry run: its trials listed
    cl = connect.client(mlflow_uri)
    exp = connect.experiment_id(cl, "e", connect.default_artifact_location(mlflow_uri))
    for t in job.trials[:2]:  # two runs recorded on the data as it was
        record.finish_trial(cl, record.open_trial(cl, exp, None, t.key, t.config), {"test_acc": 0.5})
    assert grid.main(argv + ["--dry-run"]) == 0  # unchanged: no word of it
    capsys.readouterr()

    class_folders(photos, classes=("cat",), n=3, start=100)  # images added to a finished study's folder
    assert grid.main(argv + ["--dry-run"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1, err
    said = f"error: data {data} changed since the study's 2 recorded runs on it saw it: 3 file(s) added"
    assert err.startswith(said), err
    assert "the test split's hash" in err and "--experiment" in err and "--accept-data-change" in err, err
    assert grid.main(argv + ["--dry-run", "--accept-data-change"]) == 0


def test_a_grid_started_on_a_full_disk_stops_in_one_line(tmp_path, small_disk):
    # Seen by the nemesis (seed 1, a grid on SQLite): the same command rerun while its storage's
    # disk was still full ended in a traceback: its lock's write, or Tune's state as a Tuner was made.
    fill(small_disk)
    cmd = [sys.executable, "-m", "raystudy.grid", "--rehearse", "0.2", "--datasets", "digits_c", "--quiet"]
    cmd += ["--storage", str(small_disk / "runs"), "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}"]
    cmd += ["--num-cpus", "2", "--ray-temp-dir", str(tmp_path / "ray")]
    p = subprocess.run(cmd, cwd=tmp_path, env=driver_env(), capture_output=True, text=True, timeout=300)
    out = p.stdout + p.stderr
    lines = [line for line in out.splitlines() if line.strip()]
    assert p.returncode == 130 and "Traceback" not in out, out[-3000:]
    assert sum(line.startswith(f"error: the disk is full: {small_disk}") for line in lines) == 1, out[-3000:]
    # then a rehearsal's last line, which says its numbers are no result
    assert lines[-2] == "grid stopped: 0 of 26 trials done; run the same command to resume it", lines[-3:]
    assert lines[-1].startswith("rehearsal: synthetic trials"), lines[-3:]
