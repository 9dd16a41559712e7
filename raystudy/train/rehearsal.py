"""A dress rehearsal's trial: what ``run_trial`` reports, on its schedule, without model or data.

``raystudy grid --rehearse SECONDS`` runs the grid's driver as it is (lock, Ray, Tune, the MLflow
callbacks, checkpoints, recovery, an adaptive policy) with ``rehearse_trial`` in place of
``run_trial``. Each trial reports the real trial's metric names at the real trial's steps (every
``log_every`` steps and the last, an evaluation every ``eval_every`` steps and at the end as
``eval_last`` says; none for a closed-form condition), with a checkpoint at an evaluation every
``checkpoint_every_s`` seconds, and the real final metric names; the numbers come from a curve
seeded by the trial's key, so a rerun reports the same ones. It sleeps through about SECONDS in
all and imports neither torch nor timm: a rehearsal of a grid of thousands of trials costs its
driver's work, not the trials'.

A search's rehearsal (``raystudy search --rehearse``) draws each trial's plateau from a
*landscape* instead (``landscape_score``): a known function of the sampled config with a known
optimum, so that a rehearsal search can be checked for finding it.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from raystudy.models import components
from raystudy.train.config import FinetuneConfig, from_dict
from raystudy.train.report import Reporter

DEFAULT_S = 2.0  # seconds of one rehearsal trial when --rehearse names none
STATE_FILE = "rehearsal.json"  # a rehearsal's checkpoint: not the real trial's state.pt
SUFFIX = "-rehearsal"  # of the experiment a rehearsal records in, never a real study's


# ---------------------------------------------------------------- the real trial's schedule


def get_lr(step: int, base_lr: float, warmup_steps: int, total_steps: int) -> float:
    """The engine's lr schedule (linear warmup, cosine decay), kept here without torch; a test
    holds the two equal."""
    if step < warmup_steps:
        return base_lr * (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return 0.5 * base_lr * (1.0 + math.cos(math.pi * min(1.0, progress)))


def evaluates(done: int, cfg: FinetuneConfig) -> bool:
    """The engine's rule for an evaluation after step ``done`` (a test holds the two equal)."""
    last = done == cfg.steps and (cfg.eval_last or cfg.eval_every > cfg.steps)
    return done % cfg.eval_every == 0 or last


def schedule(cfg: FinetuneConfig, start: int = 0) -> Iterator[tuple[int, bool, bool]]:
    """(step, logs, evaluates) for each step after ``start`` at which the real trial reports
    something; a closed-form condition (the linear probe) takes no steps."""
    if cfg.condition in components.CLOSED_FORM:
        return
    for done in range(start + 1, cfg.steps + 1):
        logs = done % cfg.log_every == 0 or done == cfg.steps
        ev = evaluates(done, cfg)
        if logs or ev:
            yield done, logs, ev


# ---------------------------------------------------------------- a search's landscape

TOP = 0.95  # the plateau at a landscape's optimum
DEPTH = 0.6  # how far below it the plateau falls at the farthest config


def landscape_score(landscape: dict[str, dict[str, Any]], values: dict[str, Any]) -> float:
    """The plateau of the config whose sampled ``values`` (param name: value) a search drew, on
    ``landscape`` (param name: where its optimum is, ``spaces.searches.landscape``): ``TOP`` at
    the optimum, less ``DEPTH`` times the mean squared distance from it over the params sampled
    (a conditional param left out counts nothing). A number's distance is on its (log) range
    scaled to [0, 1], a choice's 0 or 1, a subset's the share of components it gets wrong."""
    d2 = []
    for name, spec in landscape.items():
        if name not in values:
            continue
        v, best = values[name], spec["best"]
        if spec["kind"] == "number":
            f = math.log if spec["log"] else float
            lo, hi = f(spec["low"]), f(spec["high"])
            d2.append(((f(v) - f(best)) / (hi - lo)) ** 2 if hi > lo else 0.0)
        elif spec["kind"] == "subset":
            d2.append(len(set(v) ^ set(best)) / max(1, len(spec["of"])))
        else:
            d2.append(0.0 if v == best else 1.0)
    return TOP - DEPTH * (sum(d2) / len(d2) if d2 else 0.0)


# ---------------------------------------------------------------- the synthetic curve


def _rng(key: str, *salt: Any) -> random.Random:
    """A generator seeded by the trial's key (and ``salt``): the same numbers in any process."""
    digest = hashlib.sha256(":".join([key, *map(str, salt)]).encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


class Curve:
    """A trial's synthetic learning curve: accuracy rising to a plateau, loss falling, a little
    noise at each step; every value a function of the trial's key and the step alone.
    ``plateau``: a search's known one (``landscape_score``), reached at the same pace by every
    config, so that the best validation accuracy ranks configs as their plateaus do."""

    def __init__(self, key: str, cfg: FinetuneConfig, plateau: float | None = None):
        r = _rng(key)
        self.key, self.cfg = key, cfg
        self.plateau = 0.55 + 0.4 * r.random()  # validation accuracy it rises to
        self.rate = 3.0 + 5.0 * r.random()  # how many plateau-widths of the run it takes to rise
        if plateau is not None:
            self.plateau, self.rate = plateau, 6.0
        self.loss0 = 1.5 + r.random()
        self.groups = sorted(components.trainable_components(cfg.condition))

    def _progress(self, step: int) -> float:
        return 1.0 - math.exp(-self.rate * step / max(1, self.cfg.steps))

    def step_metrics(self, step: int) -> dict[str, Any]:
        """What the real trial reports every ``log_every`` steps (after ``step`` steps)."""
        r = _rng(self.key, "train", step)
        loss = self.loss0 * (1.0 - 0.9 * self._progress(step)) * (1.0 + 0.05 * r.uniform(-1, 1))
        norms = {f"grad_norm/{g}": 0.1 + r.random() for g in self.groups}
        total = math.sqrt(sum(v * v for v in norms.values()))
        lr = get_lr(step - 1, self.cfg.lr, self.cfg.warmup_steps, self.cfg.steps)  # the lr of that step
        return {"step": step, "scheduled_lr": lr, "loss": loss, **norms, "grad_norm/total": total}

    def val(self, step: int) -> tuple[float, float]:
        """(validation accuracy, validation loss) after ``step`` steps."""
        r = _rng(self.key, "val", step)
        acc = min(1.0, max(0.0, self.plateau * self._progress(step) + 0.01 * r.uniform(-1, 1)))
        return acc, self.loss0 * (1.0 - 0.8 * acc)

    def final(self, best: dict[str, Any], last_loss: float) -> dict[str, Any]:
        """The real trial's final results (``engine.train``'s keys), from the best evaluation."""
        r = _rng(self.key, "final")
        val_acc = best["val_acc"] if best["step"] >= 0 else self.plateau
        test_acc = min(1.0, max(0.0, val_acc + 0.02 * r.uniform(-1, 1)))
        counts = {g: 1000 * (1 + int(100 * r.random())) for g in self.groups}
        closed = self.cfg.condition in components.CLOSED_FORM
        return {
            "status": "finished",
            "steps_done": 0 if closed else self.cfg.steps,
            "trainable_params": sum(counts.values()),
            **{f"trainable_params/{k}": v for k, v in counts.items()},
            "best_val_acc": val_acc,
            "best_step": 0 if closed else best["step"],
            "test_acc": test_acc,
            "test_loss": self.loss0 * (1.0 - 0.8 * test_acc),
            **({} if closed else {"final_loss": last_loss}),
        }


def reports(
    key: str, cfg: FinetuneConfig, start: int = 0, plateau: float | None = None
) -> Iterator[tuple[dict[str, Any], bool]]:
    """(metrics, evaluation) in the order the real trial hands them to its reporter after step
    ``start``: a step's measurements, then its evaluation (which a checkpoint may go with)."""
    curve = Curve(key, cfg, plateau)
    best = -1.0
    for s in range(1, start + 1):  # the best so far, as a resumed trial's checkpoint holds it
        if evaluates(s, cfg):
            best = max(best, curve.val(s)[0])
    for step, logs, ev in schedule(cfg, start):
        if logs:
            yield curve.step_metrics(step), False
        if ev:
            acc, loss = curve.val(step)
            best = max(best, acc)
            yield {"step": step, "val_acc": acc, "val_loss": loss, "best_val_acc": best}, True


def final_results(key: str, cfg: FinetuneConfig, plateau: float | None = None) -> dict[str, Any]:
    """The final results the trial reports: the same whether it ran straight or resumed."""
    curve = Curve(key, cfg, plateau)
    best = {"val_acc": -1.0, "step": -1}
    last_loss = math.nan
    for step, logs, ev in schedule(cfg):
        if logs:
            last_loss = curve.step_metrics(step)["loss"]
        if ev and (acc := curve.val(step)[0]) > best["val_acc"]:
            best = {"val_acc": acc, "step": step}
    return curve.final(best, last_loss)


# ---------------------------------------------------------------- the Tune trainable


def _save_state(state: dict[str, Any], folder: str) -> None:
    """A rehearsal checkpoint: the step and the score it was taken at, as JSON."""
    (Path(folder) / STATE_FILE).write_text(json.dumps(state))


def _resume_step(checkpoint) -> int:
    """The step a rehearsal checkpoint was taken at (0: none)."""
    if checkpoint is None:
        return 0
    with checkpoint.as_directory() as d:
        path = Path(d) / STATE_FILE
        return int(json.loads(path.read_text())["step"]) if path.is_file() else 0


def run(
    trial: dict[str, Any],
    seconds: float,
    report_fn: Callable,
    checkpoint_cls=None,
    every_s: float = 0.0,
    start: int = 0,
    sleep: Callable[[float], None] = time.sleep,
    landscape: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """One rehearsal trial from step ``start``: each report at its share of ``seconds`` (the
    steps left take the time left), then the final one; returns the final results. A search's
    trial (``landscape`` given) rises to its config's plateau on it."""
    cfg = from_dict(trial["finetune"])
    plateau = None if landscape is None else landscape_score(landscape, trial["sampled"])
    t0 = time.monotonic()
    points = list(reports(trial["key"], cfg, start, plateau))
    reporter = Reporter(report_fn, checkpoint_cls, every_s, _save_state)
    span = max(1, cfg.steps - start)
    left = seconds * span / max(1, cfg.steps) if points else seconds
    for metrics, ev in points:
        wait = t0 + left * (metrics["step"] - start) / span - time.monotonic()
        if wait > 0:
            sleep(wait)
        # an evaluation's state: the step, and the score the reporter will hold once it has it
        reporter(metrics, {"step": metrics["step"], "best": max(reporter.best, metrics["val_acc"])} if ev else None)
    if not points and (wait := t0 + left - time.monotonic()) > 0:  # the linear probe: one fit, no steps
        sleep(wait)
    results = {**final_results(trial["key"], cfg, plateau), "wall_s": time.monotonic() - t0, "resumed_from": start}
    reporter.final(results)
    return results


def rehearse_trial(tune_config: dict[str, Any]) -> None:
    """The Tune trainable of a rehearsal: ``run_trial``'s config (``trial``, ``checkpoint_every_s``)
    and ``rehearse_s``, the seconds it lasts (and a search's ``rehearse_landscape``); resumes from
    its own checkpoint after a retry."""
    from ray import tune

    start = _resume_step(tune.get_checkpoint())
    run(
        tune_config["trial"],
        float(tune_config.get("rehearse_s", DEFAULT_S)),
        tune.report,
        tune.Checkpoint,
        float(tune_config.get("checkpoint_every_s", 0)),
        start,
        landscape=tune_config.get("rehearse_landscape"),
    )


def experiment_name(experiment: str) -> str:
    """The experiment a rehearsal of ``experiment`` records in."""
    return experiment if experiment.endswith(SUFFIX) else experiment + SUFFIX


def tune_trainable():
    """``rehearse_trial`` as Tune runs it: on one CPU, whatever the trial would ask (it sleeps)."""
    from ray import tune

    return tune.with_resources(rehearse_trial, tune.PlacementGroupFactory([{"CPU": 1}]))
