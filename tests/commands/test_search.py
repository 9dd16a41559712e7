import pytest
import yaml

from raystudy.commands import search, search_text
from raystudy.spaces import schema, searches
from raystudy.train.config import from_dict, validate

GOOD = {
    "study": "t",
    "base": {"model": "vit_demo", "dataset": "digits_c", "steps": 60, "eval_every": 10},
    "conditions": ["MHA"],
    "params": {
        "optimizer": {"choice": ["sgd", "adamw"]},
        "lr": {"loguniform": [1e-3, 0.5]},
        "warmup_steps": {"randint": [0, 10]},
        "momentum": {"uniform": [0.8, 0.99], "when": {"optimizer": "sgd"}},
        "beta2": {"uniform": [0.95, 0.999], "when": {"optimizer": "adamw"}},
    },
}


def write(tmp_path, raw):
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(raw))
    return str(p)


def test_bundled_spaces_load():
    for name in ("optimiser", "components"):
        s = searches.load_search(name)
        assert s.num_samples >= 1 and s.params
    comp = searches.load_search("components")
    assert comp.conditions == () and comp.searches_components
    assert comp.studies() == [("components", None)]
    names = {p.name for p in searches.load_search("optimiser").params}
    assert {"lr", "weight_decay", "warmup_steps", "optimizer", "batch_size"} <= names


def sample(space, cond="MHA", n=60):
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    res = []
    for _ in range(n):
        t = study.ask()
        res.append((t, searches.Sampler(space, cond, space.base, {"gpu": 0, "cpu": 1, "workers": 1})(t)["trial"]))
    return res


def test_trial_names_carry_condition_and_rounded_values(tmp_path):
    space = searches.load_search(write(tmp_path, GOOD))
    for t, trial in sample(space, n=10):
        cfg, parts = trial["finetune"], trial["name"].split("·")
        assert parts[0] == "MHA" and cfg["optimizer"] in parts
        assert f"lr{t.params['lr']:.2g}" in parts and f"warmup{cfg['warmup_steps']}" in parts
        assert len(trial["name"]) < 60


def test_a_rehearsals_optimum_sits_where_the_landscape_says_and_trials_carry_what_was_sampled(tmp_path):
    import math

    from raystudy.train import rehearsal

    land = searches.landscape(searches.load_search("optimiser"))
    # 0.3 of each (log) range: lr on [1e-4, 1], weight decay on [1e-6, 1e-1], warmup on randint [0, 100)
    assert land["lr"] == {"kind": "number", "best": pytest.approx(10**-2.8), "low": 1e-4, "high": 1.0, "log": True}
    assert land["weight_decay"]["best"] == pytest.approx(10**-4.5)
    assert land["warmup_steps"] == {"kind": "number", "best": 30, "low": 0, "high": 99, "log": False}
    assert land["momentum"]["best"] == pytest.approx(0.8 + 0.3 * 0.19)
    assert land["optimizer"] == {"kind": "choice", "best": "adamw"} and land["batch_size"]["best"] == 128
    comp = searches.landscape(searches.load_search("components"))["components"]
    assert comp == {"kind": "subset", "best": ["LN1", "MHA"], "of": ["LN1", "MHA", "LN2", "FC1", "FC2"]}

    space = searches.load_search(write(tmp_path, GOOD))
    land = searches.landscape(space)
    for t, trial in sample(space, n=20):
        assert trial["sampled"] == t.params  # this space's values are Optuna's params, by name
        assert ("momentum" in trial["sampled"]) == (trial["finetune"]["optimizer"] == "sgd")
        assert 0.95 - 0.6 < rehearsal.landscape_score(land, trial["sampled"]) < 0.95
    best = {k: v["best"] for k, v in land.items() if k != "beta2"}
    assert rehearsal.landscape_score(land, best) == pytest.approx(0.95) and math.isclose(best["warmup_steps"], 3)


def test_a_rehearsal_search_says_so_and_takes_one_cpu_a_trial_whatever_the_model_asks(capsys, tmp_path, monkeypatch):
    from raystudy.commands import search

    monkeypatch.chdir(tmp_path)
    argv = ["--model", "vit_base", "--conditions", "MHA", "--tracking-uri", f"sqlite:///{tmp_path}/m.db"]
    real = search.prepare(search.build_parser().parse_args(argv))
    assert real.rehearse is None and real.resources == {"gpu": 1.0, "cpu": 8.0, "workers": 1}
    job = search.prepare(search.build_parser().parse_args([*argv, "--rehearse", "0.5"]))
    assert job.rehearse == 0.5 and job.resources == {"gpu": 0.0, "cpu": 1.0, "workers": 1}
    out = capsys.readouterr().out
    assert "rehearsal: synthetic trials (about 0.5 s each on one CPU), no model or data" in out
    assert "recorded in experiment 'raystudy-search-optimiser-vit_base_patch16_224-rehearsal'" in out
    assert list(tmp_path.iterdir()) == []  # nothing recorded before the run


def test_dry_run_states_the_time_budget(capsys):
    from raystudy.commands import search

    assert search.main(["--dry-run", "--time-budget", "600", "--conditions", "MHA,FC1"]) == 0
    assert "time budget: 600 s per study, at most 1200 s" in capsys.readouterr().out
    assert search_text.budget_line(None, 2, 16).startswith("time budget: none")


def test_a_best_configs_test_accuracy_gives_a_spread_only_over_two_seeds_or_more():
    import math

    assert search_text.tested_line(0.83271, math.nan, 1) == "test 0.8327 (1 seed)"
    assert search_text.tested_line(0.83271, 0.01234, 3) == "test 0.8327 ± 0.0123 (3 seeds)"
    assert search_text.tested_line(math.nan, math.nan, 0) == "test: no seed finished"


def test_a_stopped_search_says_how_to_resume_and_shows_the_studies_it_ended_as_partial(capsys):
    assert search_text.stopped([]) == 130
    assert capsys.readouterr().out == "\nsearch stopped; run the same command to resume it\n"
    config = {"optimizer": "sgd", "lr": 0.3832, "weight_decay": 0.0, "warmup_steps": 30, "batch_size": 64}
    mha = {"condition": "MHA", "config": config, "val_acc": 0.78, "test_acc": 0.73, "test_std": float("nan")}
    mha.update(test_runs=1, finished=4, stopped=8)
    assert search_text.stopped([mha]) == 130
    out = capsys.readouterr().out.splitlines()
    assert out[1:4] == [
        "search stopped; run the same command to resume it",
        "",
        "PARTIAL, the 1 study done so far: best configuration per condition (chosen on validation, "
        "tested with fresh seeds):",
    ]
    assert out[4].split() == [
        *("MHA", "val", "0.7800", "test", "0.7300", "(1", "seed)"),
        *("[optimizer=sgd,", "lr=0.383,", "weight_decay=0,", "warmup_steps=30,", "batch_size=64]"),
        *("trials:", "4", "finished,", "8", "stopped", "early", "by", "ASHA"),
    ]


def test_dry_run_on_your_own_images_checks_them_and_says_what_it_converted(tmp_path, capsys):
    from PIL import Image

    root = tmp_path / "photos"
    for c, name in enumerate(("cat", "dog")):
        (root / name).mkdir(parents=True)
        for i in range(8):
            Image.new("RGB", (16, 16), (c * 100, i * 20, 50)).save(root / name / f"{i}.png")
    Image.new("L", (16, 16), 30).save(root / "cat" / "grey.png")
    assert search.main(["--dataset", "mine", "--data", str(root), "--dry-run", "--conditions", "MHA"]) == 0
    out = capsys.readouterr().out
    assert "vit_demo on mine; studies MHA" in out
    assert out.count("1 image(s) not RGB (L 1); converted to RGB") == 1 and "dry run: nothing started" in out
    # a search space's base may name the data itself, a path from the space file's folder
    raw = yaml.safe_load((schema.SEARCH_DIR / "optimiser.yaml").read_text())
    raw["base"] = {**raw["base"], "dataset": "mine", "data": "photos"}
    assert searches.load_search(write(tmp_path, raw)).base["data"] == str(root)


def test_conditionals_momentum_only_for_sgd_beta2_only_for_adamw(tmp_path):
    space = searches.load_search(write(tmp_path, GOOD))
    seen = set()
    for t, trial in sample(space):
        cfg = trial["finetune"]
        validate(from_dict(cfg))
        assert 1e-3 <= cfg["lr"] <= 0.5 and 0 <= cfg["warmup_steps"] <= 9
        seen.add(cfg["optimizer"])
        if cfg["optimizer"] == "sgd":
            assert "momentum" in t.params and "beta2" not in t.params
        else:
            assert "beta2" in t.params and "momentum" not in t.params
            assert cfg["betas"][1] == t.params["beta2"]
    assert seen == {"sgd", "adamw"}


def test_component_subsets_become_conditions(tmp_path):
    raw = {**GOOD, "params": {"components": {"subset_of": ["LN1", "MHA", "FC1"]}, "lr": {"uniform": [0.1, 0.2]}}}
    space = searches.load_search(write(tmp_path, raw))
    conds = {trial["finetune"]["condition"] for _, trial in sample(space, None, 80)}
    assert "head_only" in conds and "LN1+MHA+FC1" in conds and "MHA" in conds
    assert all(set(c.split("+")) <= {"LN1", "MHA", "FC1"} for c in conds if c != "head_only")


@pytest.mark.parametrize(
    "params,needle",
    [
        ({"lr": {"lognormal": [1e-3, 1.0]}}, "unknown distribution 'lognormal'"),
        ({"lr": {"loguniform": [1.0, 1e-3]}}, "lower bound 1.0 is not below upper bound 0.001"),
        ({"lr": {"loguniform": [0, 1]}}, "positive lower bound"),
        ({"momentum": {"uniform": [0.8, 0.9], "when": {"optimiser": "sgd"}}}, "unknown parameter 'optimiser'"),
        (
            {"optimizer": {"choice": ["sgd"]}, "momentum": {"uniform": [0.8, 0.9], "when": {"optimizer": "lion"}}},
            "must be a choice among ['sgd']",
        ),
        ({"learning_rate": {"uniform": [0.1, 0.2]}}, "unknown parameter 'learning_rate'"),
        ({"warmup_steps": {"randint": [0.5, 3]}}, "integer bounds"),
        ({"components": {"subset_of": ["MHA", "FC3"]}}, "subset_of"),
    ],
)
def test_malformed_spaces_are_refused_before_any_trial(tmp_path, params, needle, capsys):
    raw = {**GOOD, "params": params}
    assert search.main(["--space", write(tmp_path, raw), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err


def test_unknown_space_key_and_bad_budget(tmp_path, capsys):
    assert search.main(["--space", write(tmp_path, {**GOOD, "trials": 3}), "--dry-run"]) == 2
    assert "unknown key 'trials'" in capsys.readouterr().err
    assert search.main(["--space", write(tmp_path, {**GOOD, "budget": {"num_samples": 0}}), "--dry-run"]) == 2
    assert "num_samples" in capsys.readouterr().err
    assert search.main(["--space", "nope", "--dry-run"]) == 2
    assert "unknown search space 'nope'" in capsys.readouterr().err


def test_space_that_samples_invalid_configs_is_refused(tmp_path, capsys):
    raw = {**GOOD, "params": {"warmup_steps": {"randint": [0, 500]}}}  # steps is 60
    assert search.main(["--space", write(tmp_path, raw), "--dry-run"]) == 2
    assert "warmup_steps" in capsys.readouterr().err


@pytest.mark.parametrize("hub", [False, True], ids=["folder", "hf"])
def test_a_search_whose_data_changed_under_its_recorded_runs_says_so_in_one_line_and_refuses(
    tmp_path, mlflow_uri, capsys, hub
):
    # A trial's key holds its data's location, not its contents: a resumed study would mix trials
    # on both. ``hf:`` names a hub dataset, here one Hugging Face reads from a local folder offline.
    from raystudy.tracking import connect, record
    from tests.helpers import class_folders

    photos = class_folders(tmp_path / "photos")
    data = f"hf:{photos}" if hub else str(photos)
    argv = ["--dataset", "mine", "--data", data, "--conditions", "MHA", "--tracking-uri", mlflow_uri]
    argv += ["--experiment", "e", "--dry-run"]
    cl = connect.client(mlflow_uri)
    exp = connect.experiment_id(cl, "e", connect.default_artifact_location(mlflow_uri))
    config = {"model": "vit_demo", "dataset": "mine", "data": data, "condition": "MHA", "lr": 0.1, "seed": 0}
    for key in ("k1", "k2"):  # two trials of the study recorded on the data as it was
        record.finish_trial(cl, record.open_trial(cl, exp, None, key, config), {"test_acc": 0.5})
    assert search.main(argv) == 0  # unchanged: no word of it
    capsys.readouterr()

    class_folders(photos, classes=("cat",), n=3, start=100)  # images added under the study
    assert search.main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1, err
    assert err.startswith(f"error: data {data} changed since the study's 2 recorded runs on it saw it: 3 file(s) added")
    assert "run the search as a new study (--experiment NEW_NAME)" in err and "--accept-data-change" in err, err
    assert search.main([*argv, "--accept-data-change"]) == 0
