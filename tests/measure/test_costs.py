"""Pricing trials from measured step times (raystudy.measure.costs) and the grid's dry run that uses them."""

import json

import pytest
import yaml

from raystudy.commands import grid
from raystudy.measure import costs
from raystudy.spaces import grids, schema


def doc(models=None, **extra):
    return {
        "format": costs.FORMAT,
        "gpu": "NVIDIA H200",
        "date": "2026-05-01T12:00:00+00:00",
        "command": "python benchmarks/gpu_acceptance.py --out /tmp/gpu",
        "models": models
        if models is not None
        else {"vit_base_patch16_224": {"batch_per_gpu": 256, "seconds_per_step": {"full": 0.2, "MHA": 0.1}}},
        **extra,
    }


def table(**model):
    base = {"batch_per_gpu": 256, "seconds_per_step": {"full": 0.2, "MHA": 0.1}}
    return costs.parse_step_times(doc({"vit_base": {**base, **model}}))


def test_two_conditions_known_steps_give_known_hours():
    # full: 0.2 s at 256 images -> 0.4 s at 512; 1000 steps = 400 s, twice = 800 s.
    # MHA:  0.1 s at 256 -> 0.2 s at 512; 2000 steps = 400 s, three times = 1200 s. 2000 s in all.
    trials = [costs.TrialCost("full", 1000, 512)] * 2 + [costs.TrialCost("MHA", 2000, 512)] * 3
    est = costs.estimate("vit_base", trials, step_times=table())
    assert est.hours == pytest.approx(2000 / 3600)
    assert est.by_condition == pytest.approx({"full": 800 / 3600, "MHA": 1200 / 3600})
    assert (est.measured, est.estimated, est.unpriced) == (5, 0, 0)
    assert "from measured step times (NVIDIA H200, 2026-05-01" in est.describe()


def test_ddp_workers_split_the_batch_and_multiply_the_gpus():
    # 4 workers: 128 images per GPU -> 0.1 s per step; 1000 steps = 100 s wall on 4 GPUs = 400 GPU-s
    t = [costs.TrialCost("full", 1000, 512, workers=4, gpus=4)]
    assert costs.estimate("vit_base", t, step_times=table()).hours == pytest.approx(400 / 3600)
    assert costs.trial_seconds("vit_base", "full", 1000, 512, table(), workers=4) == (pytest.approx(100.0), "measured")


def test_data_feed_factor_and_compiled_times():
    t = table(data_feed_factor=1.5, compiled_seconds_per_step={"full": 0.1})
    assert costs.step_seconds(t, "vit_base", "full", 256) == pytest.approx(0.3)
    assert costs.step_seconds(t, "vit_base", "full", 256, compiled=True) == pytest.approx(0.15)
    # no compiled measurement of MHA: the eager one prices a compiled trial
    assert costs.step_seconds(t, "vit_base", "MHA", 256, compiled=True) == pytest.approx(0.15)


def test_what_the_table_lacks_falls_back_to_the_flop_estimate():
    trials = [costs.TrialCost("full", 100, 512), costs.TrialCost("LN1", 100, 512)]
    est = costs.estimate("vit_base", trials, step_times=table(), fallback=0.5)
    assert est.by_condition == pytest.approx({"full": 40 / 3600, "LN1": 50 / 3600})
    assert (est.measured, est.estimated) == (1, 1)
    assert "1 trials from measured step times" in est.describe() and "1 from step_seconds=0.5" in est.describe()
    # another model: nothing measured, all from the estimate, and the note says why
    est = costs.estimate("vit_large", trials, step_times=table(), fallback=0.5)
    assert est.hours == pytest.approx(100 / 3600) and est.measured == 0
    assert "has no measurement of vit_large_patch16_224" in est.describe()
    # neither source
    est = costs.estimate("vit_large", trials, step_times=table())
    assert est.hours is None and est.unpriced == 2


def test_a_missing_file_is_a_note_not_an_error(tmp_path):
    est = costs.estimate(
        "vit_base", [costs.TrialCost("full", 10, 512)], step_times=tmp_path / "none.json", fallback=0.36
    )
    assert est.hours == pytest.approx(3.6 / 3600)
    assert "step_seconds=0.36 from the space, a FLOP estimate" in est.describe()
    assert "none.json not found" in est.describe()


def test_write_and_load_round_trip_with_canonical_conditions(tmp_path):
    d = doc(
        {"vit_base": {"batch_per_gpu": 256, "seconds_per_step": {"full": 0.2, "mha+fc1": 0.15, "Linear_Probe": 0.05}}}
    )
    p = costs.write_step_times(tmp_path / "st.json", d)
    t = costs.load_step_times(p)
    assert t.path == str(p) and t.gpu == "NVIDIA H200"
    assert t.models["vit_base_patch16_224"].seconds == {"full": 0.2, "MHA+FC1": 0.15, "linear_probe": 0.05}
    assert costs.step_seconds(t, "vit_base_patch16_224.orig_in21k", "FC1+MHA", 512) == pytest.approx(0.3)


@pytest.mark.parametrize(
    "bad,needle",
    [
        ({"format": "v0"}, "format must be 'raystudy-step-times/1'"),
        ({"models": {}}, "'models' must map architectures"),
        (
            {"models": {"vit_base": {"batch_per_gpu": 0, "seconds_per_step": {"full": 1}}}},
            "batch_per_gpu must be a positive",
        ),
        (
            {"models": {"vit_base": {"batch_per_gpu": 8, "seconds_per_step": {"full": -1}}}},
            "seconds_per_step.full must be a positive",
        ),
        ({"models": {"vit_base": {"batch_per_gpu": 8, "seconds_per_step": {"FC3": 1}}}}, "unknown component 'FC3'"),
        ({"models": {"vit_base": {"batch_per_gpu": 8, "seconds_per_step": {}, "speed": 1}}}, "unknown key 'speed'"),
    ],
)
def test_bad_step_times_are_refused_in_one_line(tmp_path, bad, needle):
    p = tmp_path / "st.json"
    p.write_text(json.dumps({**doc(), **bad}))
    with pytest.raises(costs.StepTimesError) as e:
        costs.load_step_times(p)
    assert needle in str(e.value) and "\n" not in str(e.value)
    p.write_text("{not json")
    with pytest.raises(costs.StepTimesError, match="not readable JSON"):
        costs.load_step_times(p)


# ---------------------------------------------------------------- the grid's dry run


def paper_space(tmp_path, step_times):
    raw = yaml.safe_load(schema.space_path("paper").read_text())
    raw["step_times"] = step_times
    p = tmp_path / "paper_measured.yaml"
    p.write_text(yaml.safe_dump(raw))
    return p


PER_CONDITION = {"full": 0.2, "LN1": 0.1, "MHA": 0.1, "LN2": 0.1, "FC1": 0.1, "FC2": 0.1, "linear_probe": 0.1}


def test_dry_run_prices_trials_from_the_measured_file_the_space_names(tmp_path, capsys):
    sub = tmp_path / "measured"
    sub.mkdir()
    costs.write_step_times(
        sub / "h200.json", doc({"vit_base": {"batch_per_gpu": 256, "seconds_per_step": PER_CONDITION}})
    )
    space_file = paper_space(tmp_path, "measured/h200.json")  # relative to the space's folder
    assert grid.main(["--space", str(space_file), "--model", "vit_base", "--datasets", "pets", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "from measured step times (NVIDIA H200, 2026-05-01" in out and "h200.json" in out
    assert "step_seconds" not in out
    # pets: 4000 steps x 4 lrs x 3 seeds = 48,000 steps per condition at batch 512 (2 x 256):
    # full 0.4 s -> 5.33 h; LN1, MHA, LN2, FC1, FC2 0.2 s -> 2.67 h each; the linear probe takes no
    # steps (a logistic regression on frozen features) -> 0 h; 18.67 h in all
    space = grids.load_grid(str(space_file))
    est = grids.gpu_hours(space, "vit_base", grids.expand(space, "vit_base", ["pets"]))
    assert est.by_condition["full"] == pytest.approx(48_000 * 0.4 / 3600)
    assert est.by_condition["LN1"] == pytest.approx(48_000 * 0.2 / 3600)
    assert est.by_condition.get("linear_probe", 0.0) == 0.0
    assert est.hours == pytest.approx(48_000 * (0.4 + 5 * 0.2) / 3600)
    assert "estimate 19 GPU-hours" in out and "GPU-hours per condition: LN1 3," in out and "full 5," in out


def test_dry_run_without_the_named_file_uses_step_seconds_and_says_so(tmp_path, capsys):
    space_file = paper_space(tmp_path, "measured/missing.json")
    assert grid.main(["--space", str(space_file), "--model", "vit_base", "--datasets", "pets", "--dry-run"]) == 0
    out = capsys.readouterr().out
    # 48,000 steps per condition x 6 (the linear probe takes none) x 0.17 s = 13.6 h
    assert "estimate 14 GPU-hours (step_seconds=0.17 from the space, a FLOP estimate" in out
    assert "missing.json not found" in out


def test_dry_run_with_a_malformed_measured_file_exits_2(tmp_path, capsys):
    (tmp_path / "bad.json").write_text(json.dumps({"format": "nope"}))
    space_file = paper_space(tmp_path, "bad.json")
    assert grid.main(["--space", str(space_file), "--model", "vit_base", "--datasets", "pets", "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "format must be" in err[0], err


def test_a_space_whose_step_times_is_not_a_path_is_refused(tmp_path, capsys):
    assert grid.main(["--space", str(paper_space(tmp_path, 3)), "--model", "vit_base", "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "step_times must be a file path, got 3" in err[0], err


# ---------------------------------------------------------------- compile: auto


def verdicts_doc(**extra):
    return {
        "format": costs.VERDICTS_FORMAT,
        "gpu": "NVIDIA H200",
        "date": "2026-12-05T12:00:00Z",
        "conditions": {
            "full": {"holds": True, "compile_s_cold": 40.0, "compile_s_warm": 12.0},
            "MHA": {"holds": False, "compile_s_cold": 30.0},
            "LN1": {"holds": True, "compile_s_cold": 25.0},
        },
        **extra,
    }


def test_compile_auto_is_on_only_on_a_gpu_in_one_process_where_the_verdict_holds(tmp_path):
    p = tmp_path / "v.json"
    p.write_text(json.dumps(verdicts_doc()))
    v = costs.load_compile_verdicts(p)
    assert v.holds == {"full": True, "MHA": False, "LN1": True}
    assert v.seconds == {"full": 12.0, "MHA": 30.0, "LN1": 25.0}  # warm where measured, else cold
    assert costs.compile_on("auto", "full", "cuda", v) and costs.compile_on("auto", "LN1", "cuda", v)
    assert not costs.compile_on("auto", "MHA", "cuda", v)  # its verdict fails
    assert not costs.compile_on("auto", "FC1", "cuda", v)  # no verdict recorded
    assert not costs.compile_on("auto", "full", "cpu", v)  # off on a CPU
    assert not costs.compile_on("auto", "full", "cuda", v, workers=4)  # DDP under compile: untested
    assert not costs.compile_on("auto", "full", "cuda", None)  # no file: off
    assert costs.compile_on(True, "MHA", "cpu", v) and not costs.compile_on(False, "full", "cuda", v)
    p.write_text(json.dumps(verdicts_doc(smoke=True)))  # a smoke run's verdicts are never read
    assert costs.load_compile_verdicts(p) is None
    assert costs.load_compile_verdicts(tmp_path / "missing.json") is None
    p.write_text(json.dumps({"format": "something else"}))
    with pytest.raises(costs.StepTimesError, match="raystudy-compile-verdicts/1"):
        costs.load_compile_verdicts(p)


def test_the_dry_run_prices_compile_auto_from_the_verdicts_compile_seconds_included(tmp_path, monkeypatch):
    sub = tmp_path / "measured"
    sub.mkdir()
    times = dict(PER_CONDITION, full=0.2)
    model = {"batch_per_gpu": 256, "seconds_per_step": times, "compiled_seconds_per_step": {"full": 0.1, "MHA": 0.05}}
    costs.write_step_times(sub / "h200.json", doc({"vit_base": model}))
    space = grids.load_grid(str(paper_space(tmp_path, "measured/h200.json")))
    monkeypatch.setattr(costs, "COMPILE_VERDICTS", tmp_path / "none.json")

    def hours(compile_setting):
        trials = grids.expand(space, "vit_base", ["pets"], overrides={"compile": compile_setting})
        return grids.gpu_hours(space, "vit_base", trials).by_condition

    eager, auto_without_file = hours(False), hours("auto")
    assert auto_without_file == pytest.approx(eager)  # no verdicts recorded: auto stays off
    (tmp_path / "v.json").write_text(json.dumps(verdicts_doc()))
    monkeypatch.setattr(costs, "COMPILE_VERDICTS", tmp_path / "v.json")
    auto = hours("auto")
    # pets: 48,000 steps per condition in 12 trials; full compiled at 0.2 s a step (512 images)
    # plus 12 s of compiling per trial; MHA's verdict fails: eager; LN1 holds but has no compiled
    # step time: eager steps, its compiles added
    assert auto["full"] == pytest.approx((48_000 * 0.2 + 12 * 12.0) / 3600)
    assert auto["MHA"] == pytest.approx(eager["MHA"])
    assert auto["LN1"] == pytest.approx(eager["LN1"] + 12 * 25.0 / 3600)
