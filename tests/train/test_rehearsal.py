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


def collect(t, seconds=0.0, every_s=0.0, start=0):
    out = []
    rehearsal.run(
        t,
        seconds,
        lambda m, checkpoint=None: out.append((m, checkpoint)),
        Checkpoint,
        every_s,
        start,
        sleep=lambda s: None,
    )
    return out


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
