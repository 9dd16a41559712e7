"""The worker's reporting (``raystudy.train.report.Reporter`` with the trial's state files): step
measurements ride with the next evaluation; checkpoints by time."""

import pytest
import torch
from ray import tune

from raystudy.train import report, trial


def trial_reporter(report_fn, checkpoint_cls, every_s):
    """The reporter ``run_trial`` makes: the trial's state written as ``state.pt``."""
    return report.Reporter(report_fn, checkpoint_cls, every_s, trial._save_state)


class Recorder:
    def __init__(self):
        self.calls = []

    def __call__(self, metrics, checkpoint=None):
        state = trial._load_state(checkpoint) if checkpoint is not None else None
        self.calls.append((metrics, state))


def test_step_reports_wait_for_the_next_evaluation_and_travel_with_it():
    rec = Recorder()
    r = trial_reporter(rec, tune.Checkpoint, every_s=0)
    r({"step": 10, "loss": 1.0}, None)
    r({"step": 20, "loss": 0.9}, None)
    assert rec.calls == []  # no round trip to the driver for step measurements alone
    state = {"step": 20, "model": {"w": torch.ones(2)}, "best": {"val_acc": 0.5}}
    r({"step": 20, "val_acc": 0.5}, state)
    ((metrics, saved),) = rec.calls
    assert [h["step"] for h in metrics["history"]] == [10, 20] and metrics["score"] == 0.5
    assert saved["step"] == 20 and torch.equal(saved["model"]["w"], torch.ones(2))
    r({"step": 30, "loss": 0.8}, None)
    r({"step": 40, "val_acc": 0.4}, {"step": 40})
    assert rec.calls[1][0]["score"] == 0.5  # the best validation so far, for schedulers
    assert [h["step"] for h in rec.calls[1][0]["history"]] == [30]
    r({"step": 50, "loss": 0.7}, None)
    r.final({"steps_done": 50, "best_val_acc": 0.5, "test_acc": 0.45})
    last = rec.calls[-1][0]
    assert last["final"] == 1 and last["step"] == 50 and [h["step"] for h in last["history"]] == [50]
    assert r.pending == []


def test_a_diverged_step_reports_at_once():
    rec = Recorder()
    r = trial_reporter(rec, tune.Checkpoint, every_s=0)
    r({"step": 10, "loss": float("nan"), "diverged": 1.0}, None)
    assert len(rec.calls) == 1 and rec.calls[0][0]["diverged"] == 1.0 and rec.calls[0][1] is None


def test_checkpoints_go_with_evaluations_at_most_every_every_s(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(report.time, "monotonic", lambda: now[0])
    rec = Recorder()
    r = trial_reporter(rec, tune.Checkpoint, every_s=60)
    for step, t in ((10, 1030.0), (20, 1061.0), (30, 1100.0), (40, 1122.0)):
        now[0] = t
        r({"step": step, "val_acc": 0.1 * step}, {"step": step})
    # 30 s after the start: none; 61 s: one; 39 s after that: none; 61 s after it: one
    assert [s["step"] if s else None for _, s in rec.calls] == [None, 20, None, 40]


def test_the_checkpoint_interval_runs_from_the_state_not_from_the_reports_return(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(report.time, "monotonic", lambda: now[0])
    rec = Recorder()

    def slow_driver(metrics, checkpoint=None):  # the round trip of a report on a loaded head: 30 s
        rec(metrics, checkpoint)
        now[0] += 30.0

    r = trial_reporter(slow_driver, tune.Checkpoint, every_s=60)
    for step, t in ((10, 1061.0), (20, 1125.0)):
        now[0] = t
        r({"step": step, "val_acc": 0.1 * step}, {"step": step})
    # 64 s after the first checkpoint's state was taken, though only 34 s after its report returned
    assert [s["step"] if s else None for _, s in rec.calls] == [10, 20]


def test_a_reporter_without_a_checkpoint_class_reports_every_evaluation_and_saves_nothing(monkeypatch):
    # a DDP worker other than rank 0: it joins every report (Train's collective), and rank 0 alone
    # writes the state
    saved = []
    monkeypatch.setattr(trial, "_save_state", lambda state, folder: saved.append(state["step"]))
    rec = Recorder()
    r = trial_reporter(rec, None, every_s=0)
    r({"step": 10, "val_acc": 0.5}, {"step": 10})
    r({"step": 13, "preempted": 1.0}, {"step": 13})
    r.final({"steps_done": 13, "best_val_acc": 0.5})
    assert [(m["step"], s) for m, s in rec.calls] == [(10, None), (13, None), (13, None)] and saved == []
    r0 = trial_reporter(lambda metrics, checkpoint=None: None, tune.Checkpoint, every_s=0)  # rank 0
    r0({"step": 10, "val_acc": 0.5}, {"step": 10})
    assert saved == [10]


class _Planted:
    """A pickle that runs code when loaded: what a planted checkpoint would carry."""

    def __reduce__(self):
        import os

        return os.system, ("touch PLANTED",)


def test_checkpoint_state_loads_with_weights_only_and_a_planted_file_runs_nothing(tmp_path, monkeypatch):
    from raystudy.train import engine
    from raystudy.train.config import FinetuneConfig
    from raystudy.train.plan import resolve

    cfg = FinetuneConfig(
        pretrained=False,
        steps=4,
        warmup_steps=1,
        eval_every=2,
        log_every=2,
        batch_size=16,
        optimizer="adamw",
        probe_pairs=8,
        device="cpu",
    )
    states = []
    plan = resolve(cfg)
    engine.train(plan, report=lambda m, s: s is not None and states.append(s))
    folder = tmp_path / "ckpt"
    folder.mkdir()
    trial._save_state(states[0], str(folder))
    # what a resumed trial reads: tensors and plain types only, optimizer state included
    loaded = torch.load(folder / trial.STATE_FILE, weights_only=True)
    assert loaded["step"] == 2 and loaded["optimizer"]["state"]
    resumed = trial._load_state(tune.Checkpoint.from_directory(str(folder)))
    res = engine.train(plan, resume=resumed)
    assert res["status"] == "finished"

    monkeypatch.chdir(tmp_path)
    planted = tmp_path / "planted"
    planted.mkdir()
    torch.save({"step": 1, "x": _Planted()}, planted / trial.STATE_FILE)
    with pytest.raises(RuntimeError, match="refusing to load it"):
        trial._load_state(tune.Checkpoint.from_directory(str(planted)))
    assert not (tmp_path / "PLANTED").exists()


def test_a_preempted_step_checkpoints_whatever_the_interval(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(report.time, "monotonic", lambda: now[0])
    rec = Recorder()
    r = trial_reporter(rec, tune.Checkpoint, every_s=600)
    r({"step": 10, "loss": 1.0}, None)
    now[0] = 1001.0
    r({"step": 13, "preempted": 1.0}, {"step": 13})
    ((metrics, saved),) = rec.calls
    assert saved == {"step": 13} and [h["step"] for h in metrics["history"]] == [10]
