"""MLflow tracking: one experiment per study, a parent run per grid, one run per trial, exactly once.

Each trial config has a deterministic key (``config.trial_key``). Runs are found by that key, never by
an in-memory map, so a driver that is killed and rerun reopens the same run instead of creating
a second one, and a finished key is skipped. All writes go through an explicit ``MlflowClient``
(no global tracking URI is set anywhere).

Layout (read back by ``analysis/``):
- tags ``raystudy.role`` = ``grid`` | ``trial`` | ``search``; ``raystudy.key``;
  ``raystudy.status`` = ``running`` | ``finished`` | ``diverged`` | ``stopped`` | ``failed`` |
  ``interrupted``; ``raystudy.error``;
  ``condition``, ``dataset``, ``model``, ``optimizer``; code and package versions.
- params: the full flat finetuning config (``run_config`` reads it back); metrics by step
  (``STEP_METRICS``; ``scheduled_lr`` is the lr of that step, the param ``lr`` the base lr);
  final ``best_val_acc`` (validation accuracy of the checkpoint tested), ``test_acc``.
``run_row`` is how a run becomes a row of the runs table every reader uses (grid, analysis).
"""

from __future__ import annotations

import functools
import math
import time
from typing import Any

from raystudy.measure import summary
from raystudy.models import components
from raystudy.tracking.connect import versions
from raystudy.tracking.query import find_runs, logged_upto, trial_status
from raystudy.tracking.tags import (
    ATTEMPTS,
    DATA_TAG,
    ERROR,
    FINAL_METRICS,
    KEY,
    LAST_ERROR,
    MAX_NOTE,
    NOTE,
    REPORT_HEAD,
    RESUMED_FROM,
    ROLE,
    STATUS,
    STEP_METRICS,
    STOPPED_AT,
    TERMINAL,
    WORKER,
    as_number,
)


def parent_run(cl, exp_id: str, grid_key: str, name: str, params: dict[str, Any], role: str = "grid") -> str:
    """The grid's parent run: found by its key, created once."""
    from mlflow.entities import Param

    found = find_runs(cl, exp_id, raystudy__role=role, raystudy__grid_key=grid_key)
    if found:
        run_id = found[0].info.run_id
        cl.update_run(run_id, status="RUNNING")
        return run_id
    tags = {ROLE: role, "raystudy.grid_key": grid_key, "mlflow.runName": name, **versions()}
    run = cl.create_run(exp_id, tags=tags, run_name=name)
    cl.log_batch(run.info.run_id, params=[Param(k, str(v)[:6000]) for k, v in params.items()])
    return run.info.run_id


def ranking_note(rows: list[dict[str, Any]], partial: bool = False) -> str:
    """The parent run's description (Markdown): the ranking of the conditions, best first. Each
    row: condition, test_acc, avg_rank, best_lr, runs (``analysis.tables.closing_ranking``'s columns)."""
    head = "## Ranking" + (" (partial: the grid has unfinished trials)" if partial else "")
    lines = [
        head,
        "",
        (
            "lr chosen on validation accuracy per dataset; test accuracy at that lr, mean over seeds "
            "then datasets; average rank over datasets (1 = best)."
        ),
        "",
        "| # | condition | test acc (%) | avg rank | lr | runs |",
        "|---:|---|---:|---:|---|---:|",
    ]
    lines += [
        f"| {i} | {r['condition']} | {100 * as_number(r['test_acc']):.2f} | {as_number(r['avg_rank']):.2f} | "
        f"{r['best_lr']} | {r['runs']} |"
        for i, r in enumerate(rows, 1)
    ]
    return "\n".join(lines) + "\n"


def log_ranking(cl, run_id: str, rows: list[dict[str, Any]], partial: bool = False) -> None:
    """The study's answer on the parent run: ``test_acc/<condition>`` and ``rank/<condition>``
    (metrics the UI charts and compares) and the ranking as its description."""
    from mlflow.entities import Metric, RunTag

    ts = int(time.time() * 1000)
    run = cl.get_run(run_id)
    # Only what changed: a rerun of a finished grid ranks the same runs again, and a second point
    # of the same value would chart as history that never happened.
    metrics = [
        Metric(k, v, ts, 0)
        for r in rows
        for name, col in (("test_acc", "test_acc"), ("rank", "avg_rank"))
        for k, v in [(f"{name}/{r['condition']}", as_number(r[col]))]
        if math.isfinite(v) and run.data.metrics.get(k) != v
    ]
    # A report attached earlier stays (a rerun of a finished grid logs the ranking again).
    report = run.data.tags.get(NOTE, "").partition(REPORT_HEAD)[1:]
    note = ranking_note(rows, partial) + ("".join(report) if report[0] else "")
    cl.log_batch(run_id, metrics=metrics, tags=[RunTag(NOTE, note[:MAX_NOTE])])


def attach_report(cl, run_id: str, report_md: str, artifact: str = "analysis/report.md") -> None:
    """Add the analysis report to the parent run's description, below its ranking (cut to
    MLflow's tag limit, the whole report being the artifact ``artifact``)."""
    note = cl.get_run(run_id).data.tags.get(NOTE, "")
    note = note.split(REPORT_HEAD, 1)[0].rstrip("\n")  # a rerun replaces its section
    section = f"\n{REPORT_HEAD}\n\nThe full report and its figures: artifacts `{artifact}`.\n\n"
    room = MAX_NOTE - len(note) - len(section)
    if len(report_md) <= room:
        body = report_md
    else:  # whole lines, then a mark where it was cut
        body = report_md[: max(room - 40, 0)].rsplit("\n", 1)[0] + "\n\n… (cut; see the artifact)"
    cl.set_tag(run_id, NOTE, note + section + body)


def open_trial(
    cl,
    exp_id: str,
    parent_id: str | None,
    key: str,
    config: dict[str, Any],
    extra_tags: dict[str, str] | None = None,
    name: str | None = None,
) -> str:
    """Find the run of ``key`` and mark it running, or create it (named ``name``, else after its
    condition, dataset, optimizer, lr and seed): never two runs for one key."""
    from mlflow.entities import RunTag

    status, run = trial_status(cl, exp_id, key)
    if run is not None:
        run_id = run.info.run_id
        attempts = int(run.data.tags.get(ATTEMPTS, "1")) + 1
        cl.update_run(run_id, status="RUNNING")
        cl.log_batch(run_id, tags=[RunTag(STATUS, "running"), RunTag(ATTEMPTS, str(attempts))])
        if not run.data.params:  # a driver killed between creating the run and logging its config
            _log_config(cl, run_id, config)
        return run_id
    name = name or trial_name(config)
    tags = {
        ROLE: "trial",
        KEY: key,
        STATUS: "running",
        ATTEMPTS: "1",
        "mlflow.runName": name,
        **{k: str(config.get(k)) for k in ("condition", "dataset", "model", "optimizer")},
        **versions(),
        **data_tags(config.get("data") or ""),
        **(extra_tags or {}),
    }
    if parent_id:
        tags["mlflow.parentRunId"] = parent_id
    run = cl.create_run(exp_id, tags=tags, run_name=name)
    _log_config(cl, run.info.run_id, config)
    return run.info.run_id


def _log_config(cl, run_id: str, config: dict[str, Any]) -> None:
    from mlflow.entities import Param

    cl.log_batch(run_id, params=[Param(k, str(v)) for k, v in config.items()])
    cl.log_text(run_id, _yaml(config), "config.yaml")


@functools.lru_cache(maxsize=64)
def data_tags(data: str) -> dict[str, str]:
    """What identifies your own data at ``data`` for a run's record (``userdata.summary``: the
    location, the classes, the test split's size and the hash of its file list) as tags; none for a
    registry dataset. Listed once per process and location."""
    if not data:
        return {}
    from raystudy.data import userdata

    return {DATA_TAG + k: v for k, v in userdata.summary(data).items()}


def grid_data_params(configs: list[dict[str, Any]]) -> dict[str, str]:
    """The grid parent run's record of its own data: per dataset with ``data``, its location and
    test split (``data/<dataset>``, ``data/<dataset>/test_size``, ``data/<dataset>/test_hash``)."""
    out: dict[str, str] = {}
    for c in configs:
        tags = data_tags(c.get("data") or "")
        if tags and f"data/{c['dataset']}" not in out:
            out[f"data/{c['dataset']}"] = tags[DATA_TAG + "location"]
            out[f"data/{c['dataset']}/test_size"] = tags[DATA_TAG + "test_size"]
            out[f"data/{c['dataset']}/test_hash"] = tags[DATA_TAG + "test_hash"]
    return out


def trial_name(config: dict[str, Any]) -> str:
    """A run name short enough for the runs table: ``MHA·digits_c·lr0.3·s1`` (lr to 3 significant
    digits; the optimizer only when it is not SGD, the paper's; the linear probe has no lr)."""
    parts = [str(config.get("condition")), str(config.get("dataset"))]
    if config.get("optimizer", "sgd") != "sgd":
        parts.append(str(config.get("optimizer")))
    if components.has_lr(str(config.get("condition"))):
        lr = as_number(config.get("lr"))
        parts.append(f"lr{lr:.3g}" if not math.isnan(lr) else f"lr{config.get('lr')}")
    parts.append(f"s{config.get('seed')}")
    return "·".join(parts)


def plasticity_metrics(table: list[dict[str, Any]], prefix: str = "plasticity") -> dict[str, float]:
    """Per-component summaries of a plasticity table (rows of mode, layer, component, mean):
    ``<prefix>/<mode>/<component>`` = the mean over layers (``measure.summary.layer_means``, as
    the report's component table averages them); finite values only."""
    means = summary.layer_means(table, ("mode", "component"))
    return {f"{prefix}/{mode}/{component}": float(v) for (mode, component), v in means.items() if math.isfinite(v)}


def log_steps(cl, run_id: str, reports: list[dict[str, Any]], upto: dict[str, int] | None = None) -> None:
    """Log the numeric step metrics of several reports (each with its ``step``) in few batches.

    ``upto`` (kind -> last step logged, updated here) drops points already logged: a trial
    resumed from a checkpoint reports again the steps its earlier attempt had run past it.
    """
    from mlflow.entities import Metric

    ts = int(time.time() * 1000)
    upto = {} if upto is None else upto
    batch = []
    for m in reports:
        step = int(m.get("step", 0))
        kinds = set()
        for k, v in m.items():
            if _is_step_metric(k) and isinstance(v, (int, float)) and not isinstance(v, bool):
                kind = _kind(k)
                if step > upto.get(kind, -1):
                    batch.append(Metric(k, float(v), ts, step))
                    kinds.add(kind)
        for kind in kinds:
            upto[kind] = step
    for i in range(0, len(batch), 1000):  # MLflow takes at most 1,000 metrics a batch
        cl.log_batch(run_id, metrics=batch[i : i + 1000])


def _kind(metric: str) -> str:
    """Step measurements and evaluations are reported apart, each in step order."""
    return "eval" if metric.startswith("val_") or metric == "best_val_acc" else "train"


def _is_step_metric(k: str) -> bool:
    return k in STEP_METRICS or k.startswith("grad_norm/")


def finish_trial(cl, run_id: str, results: dict[str, Any]) -> None:
    """Log final results and artifacts; ``finished`` and ``diverged`` both end FINISHED."""
    from mlflow.entities import Metric, RunTag

    ts = int(time.time() * 1000)
    metrics = [
        Metric(k, float(v), ts, 0)
        for k, v in results.items()
        if (k in FINAL_METRICS or k.startswith("trainable_params/")) and isinstance(v, (int, float)) and v == v
    ]
    status = results.get("status", "finished")
    if status == "stopped":  # stopped early: its partial numbers are not final results
        metrics = [m for m in metrics if m.key in ("steps_done", "wall_s")]
    # Beside the CSVs, per-component summaries as metrics, which the UI charts across runs:
    # plasticity/ of the pretrained model (what the report ranks), plasticity_after/ finetuned.
    for name, prefix in (("plasticity_before", "plasticity"), ("plasticity_after", "plasticity_after")):
        metrics += [Metric(k, v, ts, 0) for k, v in plasticity_metrics(results.get(name) or [], prefix).items()]
    ended = _ended_metrics(cl, run_id)
    metrics = [m for m in metrics if m.key not in ended]
    tags = [RunTag(STATUS, status)]
    if status == "finished" and "test_acc" in results:  # the runs table shows descriptions by default
        tags.append(RunTag(NOTE, _result_note(results)))
    for i in range(0, len(metrics), 1000):  # MLflow takes at most 1,000 metrics a batch
        cl.log_batch(run_id, metrics=metrics[i : i + 1000], tags=tags if i == 0 else [])
    if not metrics:
        cl.log_batch(run_id, tags=tags)
    for name in ("plasticity_before", "plasticity_after"):
        table = results.get(name)
        if table:
            import pandas as pd

            cl.log_text(run_id, pd.DataFrame(table).to_csv(index=False), f"{name}.csv")
    cl.set_terminated(run_id, status="FINISHED")


def _ended_metrics(cl, run_id: str) -> set[str]:
    """The final metrics (step 0) the run has already: MLflow commits a batch's metrics before its
    tags, so a driver killed between them left an end's metrics without its status, and the
    trial's rerun ends it again. What is there stays (no step twice); the rest is added."""
    have = set(cl.get_run(run_id).data.metrics)
    if not any(k in have for k in FINAL_METRICS if not _is_step_metric(k)):
        return set()  # no end was written: the usual case, one read
    steps = {k for k in have if _is_step_metric(k)}
    return (have - steps) | {k for k in steps if any(m.step == 0 for m in cl.get_metric_history(run_id, k))}


def _result_note(results: dict[str, Any]) -> str:
    return (
        f"test {100 * as_number(results.get('test_acc')):.1f} · val {100 * as_number(results.get('best_val_acc')):.1f}"
    )


def close_stale(cl, exp_id: str, **tags: str) -> int:
    """Mark trial runs (matching ``tags``) still RUNNING as interrupted and KILLED; returns how many.

    Called where no trial of them can still be running (a search after its Tuner returned, or
    before it starts after a kill), so no run is ever left RUNNING.
    """
    from mlflow.entities import RunTag

    n = 0
    # RUNNING ones alone: a long grid calls this after each of its Tune runs, and all its runs
    # read each time made the driver's peak memory grow with the grid
    for run in find_runs(cl, exp_id, mlflow_status="RUNNING", raystudy__role="trial", **tags):
        if run.data.tags.get(STATUS) == "running":
            cl.log_batch(run.info.run_id, tags=[RunTag(STATUS, "interrupted")])
            cl.set_terminated(run.info.run_id, status="KILLED")
            n += 1
        elif run.data.tags.get(STATUS) in TERMINAL:  # its driver died inside finish_trial: the result stands
            cl.set_terminated(run.info.run_id, status="FINISHED")
    return n


def fail_trial(cl, run_id: str, error: str, status: str = "failed") -> None:
    """End a trial's run FAILED, status ``failed``, with the last of ``error``; or, ``status``
    ``interrupted`` (a Ctrl-C, no error of its own), KILLED."""
    from mlflow.entities import RunTag

    if status == "interrupted":
        cl.set_tag(run_id, STATUS, status)
        cl.set_terminated(run_id, status="KILLED")
        return
    cl.log_batch(run_id, tags=[RunTag(STATUS, "failed"), RunTag(ERROR, error[-5000:])])
    cl.set_terminated(run_id, status="FAILED")


def steps_of(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The step reports that ``results`` (a trial's reports in order) carry: each one's ``history``
    (the measurements held back for it), then the report itself unless it is the final one."""
    steps: list[dict[str, Any]] = []
    for r in results:
        steps += list(r.get("history") or [])
        if not r.get("final"):
            steps.append(r)
    return steps


class TrialRecord:
    """A trial's run written in the one order every writer keeps (the grid's Tune callback, the
    trials recovered from Tune's files, the finetune command): its step metrics as they come
    (``log``), then its end (``end``: ``stopped`` at its last step when the results end without a
    final one, the final results, the step it resumed from) or its failure (``fail``).

    ``upto`` (kind -> last step logged) is read from the run at the first ``log``, and again after
    a ``log`` that failed: a run reopened by a retry or a rerun, or written again after a lost
    answer, logs no point twice.
    """

    def __init__(self, cl, run_id: str):
        self.cl, self.run_id = cl, run_id
        self.upto: dict[str, int] | None = None

    def log(self, results: list[dict[str, Any]]) -> None:
        """Log the step metrics ``results`` carry (``steps_of``) that the run does not have yet."""
        if self.upto is None:
            self.upto = logged_upto(self.cl, self.run_id)
        upto = dict(self.upto)
        try:
            log_steps(self.cl, self.run_id, steps_of(results), upto)
        except BaseException:
            # The write is tried again whole (the backlog, a retry): a server may have stored a
            # batch whose answer never came (killed or stopped as it answered), so what the run
            # has is read again rather than assumed.
            self.upto = None
            raise
        self.upto = upto

    def end(self, last: dict[str, Any], final: bool | None = None) -> None:
        """Log the final results ``last`` and end the run. Not ``final`` (by default: ``last`` has
        no ``final`` key, as when a scheduler or the policy stopped the trial early) records it
        ``stopped`` at its last step, without test accuracy."""
        if not (last.get("final") if final is None else final):
            last = {**last, "status": "stopped", "steps_done": int(last.get("step", 0))}
            note_stopped(self.cl, self.run_id, last["steps_done"])
        finish_trial(self.cl, self.run_id, last)
        if last.get("resumed_from"):
            note_resumed(self.cl, self.run_id, last["resumed_from"])

    def fail(self, error: str, status: str = "failed") -> None:
        """End the run ``failed`` with ``error``, or ``interrupted`` (``fail_trial``)."""
        fail_trial(self.cl, self.run_id, error, status)


def note_worker(cl, run_id: str, where: str) -> None:
    """Tag the node and process (``ip:pid``; a DDP trial's workers, comma-separated) that runs the trial."""
    cl.set_tag(run_id, WORKER, where)


def note_stopped(cl, run_id: str, step: int) -> None:
    """Tag the step a scheduler stopped the trial at (its results follow in ``finish_trial``)."""
    cl.set_tag(run_id, STOPPED_AT, str(step))


def note_resumed(cl, run_id: str, step: int) -> None:
    """Tag the checkpoint step a resumed trial continued from."""
    cl.set_tag(run_id, RESUMED_FROM, str(int(step)))


def note_retry(cl, run_id: str, error: str) -> None:
    """Count one more attempt of a trial that Tune retries, and keep the failed attempt's error."""
    attempts = int(cl.get_run(run_id).data.tags.get(ATTEMPTS, "1")) + 1
    cl.set_tag(run_id, ATTEMPTS, str(attempts))
    cl.set_tag(run_id, LAST_ERROR, error[-5000:])


def mark_stopped_late(cl, run_id: str, step: int, rule: str) -> None:
    """Record a finished run as ``stopped`` at ``step`` by the policy's ``rule``: the policy's
    decision came after the trial ended."""
    from mlflow.entities import RunTag

    cl.log_batch(
        run_id,
        tags=[
            RunTag(STATUS, "stopped"),
            RunTag(STOPPED_AT, str(step)),
            RunTag("raystudy.stopped_late", "1"),
            RunTag("raystudy.stop_rule", rule),
        ],
    )


def tag_parent(cl, run_id: str, status: str) -> None:
    """Tag a grid's or search's parent run with its status (running, finished, interrupted, ...)."""
    cl.set_tag(run_id, STATUS, status)


def end_run(cl, run_id: str) -> None:
    """End a parent run FINISHED (its outcome is its status tag)."""
    cl.set_terminated(run_id, status="FINISHED")


def _yaml(d: dict[str, Any]) -> str:
    import yaml

    return yaml.safe_dump({k: (list(v) if isinstance(v, tuple) else v) for k, v in d.items()}, sort_keys=False)
