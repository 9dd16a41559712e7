"""The record read back: runs by key, their statuses (what a resumed grid skips), what a run
logged, and one flat row per run for the analysis."""

from __future__ import annotations

import math
import os
from typing import Any

from raystudy.tracking.connect import client, sqlite_path
from raystudy.tracking.tags import DATA_TAG, ERROR, KEY, ROLE, STATUS, TERMINAL, as_number
from raystudy.train.config import FinetuneConfig, parse_value


def find_runs(cl, exp_id: str, **tags: str):
    """Runs of ``exp_id`` whose tags equal ``tags`` (``a__b`` names tag ``a.b``), oldest first, all pages."""
    flt = " and ".join(f"tags.`{k.replace('__', '.')}` = '{v}'" for k, v in tags.items())
    runs, token = [], None
    while True:
        page = cl.search_runs(
            [exp_id], filter_string=flt, max_results=5000, order_by=["attributes.start_time ASC"], page_token=token
        )
        runs += list(page)
        token = page.token
        if not token:
            return runs


def statuses(cl, exp_id: str) -> dict[str, str]:
    """The raystudy status of every trial key of ``exp_id``, in one query (terminal ones win): on a
    database store, or a tracking server whose database this process reaches (``STORE_ENV``), one
    SQL query over the tags (``_sql_statuses``); else MLflow's search."""
    store = _store_of(cl.tracking_uri)
    found = None
    if store == cl.tracking_uri:
        found = _sql_statuses(store, "r.experiment_id = CAST(:v AS INTEGER)", v=exp_id)
    elif store is not None:  # the server's own database: the same experiment there, by id and name
        name = cl.get_experiment(exp_id).name
        where = "r.experiment_id = CAST(:v AS INTEGER) AND e.name = :name"
        if _sql(store, _EXPERIMENT_SQL, v=exp_id) == [(name,)]:
            found = _sql_statuses(store, where, v=exp_id, name=name)
    return found if found is not None else searched_statuses(cl, exp_id)


def searched_statuses(cl, exp_id: str) -> dict[str, str]:
    """``statuses`` through MLflow's search, which loads every run's params and metrics too:
    seconds at the paper's size, and growing with it."""
    runs = find_runs(cl, exp_id, raystudy__role="trial")
    return _fold((run.data.tags.get(KEY), run.data.tags.get(STATUS)) for run in runs)


def _fold(pairs) -> dict[str, str]:
    """(key, status) pairs of trial runs, oldest first, as one status per key: a terminal one
    wins (the oldest of them), else the newest."""
    out: dict[str, str] = {}
    for key, status in pairs:
        if key and out.get(key) not in TERMINAL:
            out[key] = status
    return out


def known_statuses(uri: str, experiment: str) -> dict[str, str]:
    """``statuses`` of experiment ``experiment`` in the store at ``uri``, read only: empty when
    the store (a SQLite file) or the experiment does not exist yet, and neither is created."""
    db = sqlite_path(uri)
    if db is not None and not db.is_file():
        return {}
    store = _store_of(uri)
    if store is not None:
        found = _sql_statuses(store, "e.name = :v AND e.lifecycle_stage = 'active'", v=experiment)
        if found is not None:
            return found
    cl = client(uri)
    exp = cl.get_experiment_by_name(experiment)
    if exp is None or exp.lifecycle_stage == "deleted":
        return {}
    return searched_statuses(cl, exp.experiment_id)


# The database behind a tracking server, where this process reaches it (a cluster's head, a SLURM
# job's first node: cluster/node.sh and cluster/slurm/job.sh export it): what is done is then one
# query there too, instead of the server's search, which sends every run whole (seconds at the
# paper's size, half a minute at 10,000 runs).
STORE_ENV = "RAYSTUDY_TRACKING_STORE"


def _store_of(uri: str) -> str | None:
    """The database ``uri``'s runs are read from with SQL: ``uri`` itself, the one behind a
    tracking server that ``STORE_ENV`` names, or None (MLflow's search answers)."""
    if _is_database(uri):
        return uri
    behind = os.environ.get(STORE_ENV, "")
    return behind if uri.startswith(("http://", "https://")) and _is_database(behind) else None


def _is_database(uri: str) -> bool:
    """Whether MLflow keeps ``uri``'s runs in a SQL database it reaches itself (no server between)."""
    from mlflow.store.db.db_types import DATABASE_ENGINES

    return uri.split(":", 1)[0].split("+", 1)[0] in DATABASE_ENGINES


# The live trial runs of one experiment (``{where}``), oldest first as ``find_runs`` gives them,
# with their key and status tags: MLflow's tables (runs, tags, experiments), read, never written.
_STATUSES_SQL = f"""
SELECT k.value, s.value FROM runs r
JOIN experiments e ON e.experiment_id = r.experiment_id
JOIN tags role ON role.run_uuid = r.run_uuid AND role.key = '{ROLE}' AND role.value = 'trial'
LEFT JOIN tags k ON k.run_uuid = r.run_uuid AND k.key = '{KEY}'
LEFT JOIN tags s ON s.run_uuid = r.run_uuid AND s.key = '{STATUS}'
WHERE {{where}} AND r.lifecycle_stage = 'active'
ORDER BY r.start_time ASC, r.run_uuid ASC
"""


_EXPERIMENT_SQL = "SELECT name FROM experiments WHERE experiment_id = CAST(:v AS INTEGER)"


def _sql_statuses(uri: str, where: str, **params) -> dict[str, str] | None:
    """``statuses`` of the experiment ``where`` names (its ``:name``s are ``params``) in a database
    store; None where ``_sql`` answers None (MLflow's own search answers then)."""
    rows = _sql(uri, _STATUSES_SQL.format(where=where), **params)
    return None if rows is None else _fold(rows)


def _sql(uri: str, sql: str, **params) -> list[tuple] | None:
    """The rows of ``sql`` on the database store ``uri``, read with SQLAlchemy (a SQLite file
    opened read only); None for a store of another kind, or a schema the query does not know
    (another MLflow's), or a database that cannot be reached."""
    if not _is_database(uri):
        return None
    import sqlalchemy

    db = sqlite_path(uri)
    if db is not None:
        import sqlite3

        engine = sqlalchemy.create_engine(
            "sqlite://", creator=lambda: sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True, timeout=30)
        )
    else:
        engine = sqlalchemy.create_engine(uri, poolclass=sqlalchemy.pool.NullPool)
    try:
        with engine.connect() as con:
            return [tuple(r) for r in con.execute(sqlalchemy.text(sql), params).fetchall()]
    except sqlalchemy.exc.DBAPIError:
        return None
    finally:
        engine.dispose()


def trial_status(cl, exp_id: str, key: str) -> tuple[str | None, Any]:
    """(raystudy status, run) of the run with ``key``, or (None, None)."""
    found = find_runs(cl, exp_id, raystudy__role="trial", raystudy__key=key)
    if not found:
        return None, None
    # Exactly once by construction; should a store hold two anyway, the terminal one is the record.
    found.sort(key=lambda r: r.data.tags.get(STATUS) not in TERMINAL)
    return found[0].data.tags.get(STATUS), found[0]


def recorded_data(uri: str, experiment: str, locations: set[str]) -> dict[str, tuple[dict[str, str], int]]:
    """Location (of ``locations``) -> (the ``userdata.summary`` the latest ended trial run on it
    recorded, how many ended trial runs are on it), read from the store at ``uri`` (nothing created)."""
    db = sqlite_path(uri)
    if db is not None and not db.is_file():
        return {}
    cl = client(uri)
    exp = cl.get_experiment_by_name(experiment)
    if exp is None:
        return {}
    out: dict[str, tuple[dict[str, str], int]] = {}
    runs = find_runs(cl, exp.experiment_id, raystudy__role="trial")
    for run in sorted(runs, key=lambda r: -(r.info.start_time or 0)):
        tags = run.data.tags
        where = tags.get(DATA_TAG + "location")
        if where in locations and tags.get(STATUS) in TERMINAL:
            seen, n = out.get(where, ({k[len(DATA_TAG) :]: v for k, v in tags.items() if k.startswith(DATA_TAG)}, 0))
            out[where] = (seen, n + 1)
    return out


def logged_upto(cl, run_id: str) -> dict[str, int]:
    """The last step of each kind (``_kind``) a run already has: where a resumed attempt's
    points become new."""
    return {
        kind: max((m.step for m in cl.get_metric_history(run_id, key)), default=-1)
        for kind, key in (("train", "loss"), ("eval", "val_acc"))
    }


# ---------------------------------------------------------------- the run record, read back

_MLFLOW_STATUS = {
    "FINISHED": "finished",
    "FAILED": "failed",
    "KILLED": "failed",
    "RUNNING": "running",
    "SCHEDULED": "running",
}
CONFIG_TYPES = set(FinetuneConfig.__dataclass_fields__)


def run_config(params: dict[str, str]) -> dict[str, Any]:
    """A run's params (MLflow keeps strings) back as config values, as ``FinetuneConfig.to_dict``
    gives them (pairs as lists); other keys are left out."""
    out = {k: parse_value(k, str(v)) for k, v in params.items() if k in CONFIG_TYPES}
    return {k: list(v) if isinstance(v, tuple) else v for k, v in out.items()}


def run_status_of(run_status: str, tags: dict[str, str], metrics: dict[str, float]) -> tuple[str, str]:
    """A trial run's raystudy status and, when it is not what the run says of itself, why: the
    ``raystudy.status`` tag, MLflow's own status if the tag is absent, and ``failed`` for a run
    finished without a test accuracy."""
    status = tags.get(STATUS) or _MLFLOW_STATUS.get(run_status, "failed")
    if status == "finished" and math.isnan(as_number(metrics.get("test_acc"))):
        return "failed", "finished without a test_acc metric"
    return status, ""


# The runs table's columns, the one list every reader of the runs uses (the grid, analysis.load):
# the study's own, then its bookkeeping, then a diverged run's tested best checkpoint (which
# analysis.load counts as finished or drops).
RUN_COLUMNS = [
    "run_id",
    "model",
    "optimizer",
    "low_data",
    "dataset",
    "condition",
    "lr",
    "seed",
    "val_acc",
    "test_acc",
    "status",
]
EXTRA_COLUMNS = [
    "parent_run_id",
    "key",
    "error",
    "probe_pairs",
    "start_time",
    "trainable_params",
    "accuracy",
    "linear_probe_data",
]
DIVERGED_TESTED = ["diverged_val_acc", "diverged_test_acc"]
# A row's columns: ``start_time`` is MLflow's of the run, not of its record (``rows`` adds it).
ROW_COLUMNS = [c for c in RUN_COLUMNS + EXTRA_COLUMNS + DIVERGED_TESTED if c != "start_time"]


def _tested(metrics: dict[str, float], key: str, before_any: str) -> float:
    """A diverged run's ``key`` metric, else ``before_any`` (logged where it diverged before its first
    evaluation), else NaN."""
    value = as_number(metrics.get(key))
    return value if not math.isnan(value) else as_number(metrics.get(before_any))


def run_row(
    run_id: str, run_status: str, tags: dict[str, str], params: dict[str, str], metrics: dict[str, float]
) -> dict[str, Any]:
    """The row of one trial run in the runs table, from its MLflow status, tags, params, metrics.

    ``val_acc`` is the final ``best_val_acc`` (the validation accuracy of the checkpoint that was
    tested), ``test_acc`` its test accuracy. The status is the ``raystudy.status`` tag (MLflow's
    own status if the tag is absent); a run tagged finished without a test accuracy is marked
    failed. Accuracies are NaN unless finished: never zeros in a mean; a diverged run's tested
    best checkpoint is apart, in ``diverged_val_acc`` and ``diverged_test_acc``.
    ``trainable_params`` is the run's logged count (NaN when it logged none). Its columns are
    ``ROW_COLUMNS``.
    """
    status, why = run_status_of(run_status, tags, metrics)
    error = tags.get(ERROR, "") or why
    done = status == "finished"
    seed, probes = as_number(params.get("seed")), as_number(params.get("probe_pairs"))
    values = {
        "run_id": run_id,
        "model": tags.get("model") or params.get("model", "unknown"),
        "optimizer": tags.get("optimizer") or params.get("optimizer", "unknown"),
        "low_data": str(params.get("low_data", "False")).lower() == "true",
        "dataset": tags.get("dataset") or params.get("dataset"),
        "condition": tags.get("condition") or params.get("condition"),
        "lr": as_number(params.get("lr")),
        "seed": int(seed) if not math.isnan(seed) else -1,
        "val_acc": as_number(metrics.get("best_val_acc")) if done else math.nan,
        "test_acc": as_number(metrics.get("test_acc")) if done else math.nan,
        "status": status,
        "parent_run_id": tags.get("mlflow.parentRunId", ""),
        "key": tags.get(KEY, ""),
        "error": error,
        "probe_pairs": -1 if math.isnan(probes) else int(probes),
        # how accuracy was counted and the linear probe fitted (runs before these keys: the defaults)
        "accuracy": params.get("accuracy", "per_image"),
        "linear_probe_data": params.get("linear_probe_data", "clean"),
        # logged by finished and diverged runs alike: the count does not depend on the outcome
        "trainable_params": as_number(metrics.get("trainable_params")),
        # a diverged run's best checkpoint before it diverged, tested: what the paper's code keeps;
        # diverged before its first evaluation, its class-0 accuracies (what the paper's code tests)
        "diverged_val_acc": _tested(metrics, "best_val_acc", "class0_val_acc") if status == "diverged" else math.nan,
        "diverged_test_acc": _tested(metrics, "test_acc", "class0_test_acc") if status == "diverged" else math.nan,
    }
    return {c: values[c] for c in ROW_COLUMNS}  # the columns in the list's order, none beside it


def val_curve(cl, run_id: str) -> list[tuple[int, float]]:
    """A run's validation accuracy by step, as (step, value) pairs in step order."""
    return sorted((m.step, m.value) for m in cl.get_metric_history(run_id, "val_acc"))


def rows(runs) -> list[dict[str, Any]]:
    """The rows of MLflow ``Run`` objects, with their start times (for deduplication)."""
    return [
        {
            **run_row(r.info.run_id, r.info.status, r.data.tags, r.data.params, r.data.metrics),
            "start_time": r.info.start_time or 0,
        }
        for r in runs
    ]
