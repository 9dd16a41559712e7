"""The dress rehearsal's trial (``raystudy.train.rehearsal``): the real trial's schedule and names,
numbers from a curve seeded by the trial's key, checkpoints and resumption, its time, no torch."""

import functools
import json
import subprocess
import sys

import pytest

from raystudy.train import rehearsal


@pytest.fixture()
def fast_config(fast_config):
    """conftest's fast trial, evaluated every 5 steps (at 5, 10 and its last, 12)."""
    return functools.partial(fast_config, eval_every=5)


@pytest.fixture()
def trial(fast_config):
    """Builds a trial as the driver hands it to the trainable: ``trial(key="k1", **cfg)``."""

    def make(key="k1", **cfg):
        return {"key": key, "finetune": fast_config(**cfg).to_dict(), "gpu": 0, "cpu": 1, "workers": 1}

    return make


class Checkpoint:
    """Tune's ``Checkpoint`` as the trainable uses it: a folder's files, kept."""

    def __init__(self, files):
        self.files = files

    @classmethod
    def from_directory(cls, d):
        from pathlib import Path

        return cls({p.name: p.read_text() for p in Path(d).iterdir()})

    def as_directory(self):
        import contextlib
        import tempfile
        from pathlib import Path

        @contextlib.contextmanager
        def folder():
            with tempfile.TemporaryDirectory() as d:
                for name, text in self.files.items():
                    (Path(d) / name).write_text(text)
                yield d

        return folder()


def collect(t, seconds=0.0, every_s=0.0, start=0, landscape=None):
    out = []
    rehearsal.run(
        t,
        seconds,
        lambda m, checkpoint=None: out.append((m, checkpoint)),
        Checkpoint,
        every_s,
        start,
        sleep=lambda s: None,
        landscape=landscape,
    )
    return out


# A search's landscape, by hand: the optimum at lr 1e-2 on [1e-4, 1] (log), warmup 30 on [0, 100],
# adamw, and the components MHA and FC1 of five.
LAND = {
    "lr": {"kind": "number", "best": 1e-2, "low": 1e-4, "high": 1.0, "log": True},
    "warmup_steps": {"kind": "number", "best": 30, "low": 0, "high": 100, "log": False},
    "optimizer": {"kind": "choice", "best": "adamw"},
    "components": {"kind": "subset", "best": ["MHA", "FC1"], "of": ["LN1", "MHA", "LN2", "FC1", "FC2"]},
}
AT_BEST = {"lr": 1e-2, "warmup_steps": 30, "optimizer": "adamw", "components": ["FC1", "MHA"]}


def test_the_schedule_and_names_are_the_real_trials(fast_config):
    """The engine's own reports, on a tiny config, against the rehearsal's: the same steps,
    the same metric names in each, the same evaluations carrying a state, the same final keys."""
    from raystudy.train import engine
    from raystudy.train.plan import resolve

    for cond, extra in (("MHA+FC1", {}), ("LN2", {"eval_every": 4, "eval_last": False, "steps": 10})):
        cfg = fast_config(**extra, condition=cond)
        real = []
        results = engine.train(resolve(cfg), report=lambda m, s: real.append((m, s is not None)))
        fake = list(rehearsal.reports("k", cfg))
        assert [(m["step"], sorted(m), ev) for m, ev in fake] == [(m["step"], sorted(m), ev) for m, ev in real]
        final = rehearsal.final_results("k", cfg)
        assert set(final) | {"wall_s"} == set(results)
        assert final["steps_done"] == results["steps_done"] and final["best_step"] in {
            m["step"] for m, ev in fake if ev
        }


def test_linear_probe_reports_only_its_final_results(trial):
    out = collect(trial(condition="linear_probe"))
    assert len(out) == 1
    final, ckpt = out[0]
    assert final["final"] == 1 and final["steps_done"] == 0 and final["history"] == [] and ckpt is None
    assert {"best_val_acc", "test_acc", "test_loss", "best_step", "trainable_params"} <= set(final)


def test_the_lr_and_evaluation_rules_are_the_engines(fast_config):
    from raystudy.train import engine

    for steps, warm in ((10, 0), (120, 12), (7, 3)):
        for step in range(steps + 2):
            assert rehearsal.get_lr(step, 0.3, warm, steps) == engine.get_lr(step, 0.3, warm, steps)
    for every, last in ((4, True), (4, False), (20, False), (3, True)):
        cfg = fast_config(steps=10, eval_every=every, eval_last=last)
        assert [rehearsal.evaluates(s, cfg) for s in range(1, 11)] == [engine.evaluates(s, cfg) for s in range(1, 11)]


def test_a_landscape_scores_its_optimum_top_and_less_by_the_mean_squared_distance_from_it():
    score = functools.partial(rehearsal.landscape_score, LAND)
    assert score(AT_BEST) == pytest.approx(0.95)
    # lr 1e-4: two decades of four off, 0.5 of the range: 0.25 squared, a quarter of it over four params
    assert score({**AT_BEST, "lr": 1e-4}) == pytest.approx(0.95 - 0.6 * 0.25 / 4)
    assert score({**AT_BEST, "warmup_steps": 80}) == pytest.approx(0.95 - 0.6 * 0.25 / 4)  # 50 of 100
    assert score({**AT_BEST, "optimizer": "sgd"}) == pytest.approx(0.95 - 0.6 * 1 / 4)
    assert score({**AT_BEST, "components": ["MHA", "LN1"]}) == pytest.approx(0.95 - 0.6 * 0.4 / 4)  # 2 of 5 wrong
    # a conditional param not sampled counts nothing: the mean is over the three sampled
    no_opt = {k: v for k, v in AT_BEST.items() if k != "optimizer"}
    assert score({**no_opt, "lr": 1e-4}) == pytest.approx(0.95 - 0.6 * 0.25 / 3)
    worst = {"lr": 1.0, "warmup_steps": 100, "optimizer": "sgd", "components": ["LN1", "LN2", "FC2"]}
    assert score(worst) == pytest.approx(0.95 - 0.6 * (0.5**2 + 0.7**2 + 1 + 1) / 4)


def test_a_search_trial_rises_to_its_configs_plateau_so_the_nearer_config_scores_higher(trial):
    land = {k: v for k, v in LAND.items() if k in ("lr", "optimizer")}
    near = {**trial("near", steps=60, eval_every=10), "sampled": {"lr": 2e-2, "optimizer": "adamw"}}
    far = {**trial("far", steps=60, eval_every=10), "sampled": {"lr": 0.5, "optimizer": "sgd"}}
    finals = {}
    for t in (near, far):
        plateau = rehearsal.landscape_score(land, t["sampled"])
        out = collect(t, landscape=land)
        finals[t["key"]] = out[-1][0]["best_val_acc"]
        # at the pace every search config shares the last evaluation is within its noise of the plateau
        assert abs(finals[t["key"]] - plateau) < 0.015, (finals, plateau)
        assert out[-1][0]["score"] == finals[t["key"]]
    assert finals["near"] > finals["far"] + 0.3
    # without a landscape the same key draws its own plateau (the grid's rehearsal), as before
    assert collect(near)[-1][0]["best_val_acc"] != finals["near"]


def test_a_trial_key_always_draws_the_same_curve_and_another_key_another(trial):
    a, b, other = collect(trial("k1")), collect(trial("k1")), collect(trial("k2"))
    strip = [{k: v for k, v in m.items() if k != "wall_s"} for m, _ in a]
    assert strip == [{k: v for k, v in m.items() if k != "wall_s"} for m, _ in b]
    assert [m.get("val_acc") for m, _ in a] != [m.get("val_acc") for m, _ in other]
    for m, _ in a:
        assert all(0 <= m[k] <= 1 for k in ("val_acc", "best_val_acc", "test_acc") if k in m)
    evals = [m for m, _ in a if "val_acc" in m and not m.get("final")]
    assert [m["best_val_acc"] for m in evals] == [max(e["val_acc"] for e in evals[: i + 1]) for i in range(len(evals))]
    assert a[-1][0]["best_val_acc"] == max(e["val_acc"] for e in evals)


def test_tune_sees_the_real_reporting_checkpoints_and_a_resume_goes_on_where_it_stopped(trial):
    out = collect(trial())
    evals = [(m, c) for m, c in out if not m.get("final")]
    assert [m["step"] for m, _ in evals] == [5, 10, 12]  # eval_every 5, and the last step
    assert [h["step"] for h in evals[0][0]["history"]] == [3]  # step measurements travel with the next report
    assert all(c is not None for _, c in evals)  # checkpoint_every_s 0: at every evaluation
    assert out[-1][0]["final"] == 1 and out[-1][0]["resumed_from"] == 0
    assert all(m["score"] == m["best_val_acc"] for m, _ in evals)

    # the checkpoint: the step and the score there (the reporter's, shared with the real trial)
    saved = [json.loads(c.files[rehearsal.STATE_FILE]) for _, c in evals]
    assert saved == [{"step": m["step"], "best": m["score"]} for m, _ in evals]
    step = rehearsal._resume_step(evals[0][1])
    assert step == 5
    resumed = collect(trial(), start=step)
    assert [m["step"] for m, _ in resumed] == [10, 12, 12]
    assert resumed[0][0]["val_acc"] == evals[1][0]["val_acc"]
    same = ("best_val_acc", "test_acc", "test_loss", "best_step", "steps_done", "final_loss")
    assert {k: resumed[-1][0][k] for k in same} == {k: out[-1][0][k] for k in same}
    assert resumed[-1][0]["resumed_from"] == 5

    # a checkpoint every hour: none in a short trial, as the real trial's interval
    assert all(c is None for _, c in collect(trial(), every_s=3600))


def test_a_trial_takes_about_its_seconds_and_a_resumed_one_what_is_left(trial):
    import time

    for start, share in ((0, 1.0), (6, 0.5)):  # from step 6 of 12: half the time is left
        t0 = time.monotonic()
        rehearsal.run(trial(), 0.4, lambda m, checkpoint=None: None, start=start)
        assert 0.4 * share <= time.monotonic() - t0 < 0.4 * share + 0.3
    naps = []  # each wait aims at its step's share of the time from the start
    rehearsal.run(trial(), 2.0, lambda m, checkpoint=None: None, sleep=naps.append)
    assert max(naps) == pytest.approx(2.0, abs=0.05) and naps[0] == pytest.approx(0.5, abs=0.05)  # step 3 of 12


def test_the_trainable_imports_neither_torch_nor_timm():
    code = (
        "import sys; from raystudy.train import rehearsal; from raystudy.driver import grid_run; "
        "print(sorted(m for m in ('torch', 'timm') if m in sys.modules))"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.stdout.strip() == "[]", p.stderr[-2000:]


def test_a_rehearsal_records_in_its_own_experiment():
    assert rehearsal.experiment_name("raystudy-paper-vit_b") == "raystudy-paper-vit_b-rehearsal"
    assert rehearsal.experiment_name("x-rehearsal") == "x-rehearsal"


def test_a_dry_run_of_a_rehearsal_says_so_first_and_last_and_prices_the_real_grid(
    tmp_path, mlflow_uri, capsys, monkeypatch
):
    from raystudy.commands import grid

    monkeypatch.chdir(tmp_path)
    assert grid.main(["--rehearse", "--dry-run", "--tracking-uri", mlflow_uri]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    line = (
        "rehearsal: synthetic trials (about 2 s each), no model or data; "
        "recorded in experiment 'raystudy-demo-vit_demo-rehearsal'"
    )
    assert out[0] == line and out[-1] == line
    assert out[1].startswith("grid demo for vit_demo: 104 trials") and "dry run: nothing started" in out
    assert grid.main(["--rehearse", "0.5", "--experiment", "mine", "--dry-run", "--tracking-uri", mlflow_uri]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert "(about 0.5 s each)" in first and first.endswith("experiment 'mine-rehearsal'")
