"""The record read back: runs by key, their statuses (what a resumed grid skips), what a run
logged, and one flat row per run for the analysis."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

from raystudy.tracking.connect import client, sqlite_path
from raystudy.tracking.tags import DATA_TAG, ERROR, KEY, ROLE, STATUS, TERMINAL, as_number
from raystudy.train.config import FinetuneConfig, parse_value


def find_runs(cl, exp_id: str, mlflow_status: str | None = None, **tags: str):
    """Runs of ``exp_id`` whose tags equal ``tags`` (``a__b`` names tag ``a.b``), and whose MLflow
    status is ``mlflow_status`` if given (RUNNING, FINISHED, ...), oldest first, all pages."""
    terms = [f"tags.`{k.replace('__', '.')}` = '{v}'" for k, v in tags.items()]
    flt = " and ".join(terms + ([f"attributes.status = '{mlflow_status}'"] if mlflow_status else []))
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
    found = None
    at = _database_of(cl, exp_id)
    if at is not None:
        store, where, params = at
        found = _sql_statuses(store, where, **params)
    return found if found is not None else searched_statuses(cl, exp_id)


def _database_of(cl, exp_id: str) -> tuple[str, str, dict[str, str]] | None:
    """(the database, the SQL condition on ``r`` and ``e`` that picks ``exp_id`` there, its
    parameters) where ``cl``'s runs can be read with SQL (``_store_of``), else None. Behind a
    tracking server, the same experiment there by id and name, or None."""
    store = _store_of(cl.tracking_uri)
    if store == cl.tracking_uri:
        return store, "r.experiment_id = CAST(:v AS INTEGER)", {"v": exp_id}
    if store is not None:
        name = cl.get_experiment(exp_id).name
        if _sql(store, _EXPERIMENT_SQL, v=exp_id) == [(name,)]:
            return store, "r.experiment_id = CAST(:v AS INTEGER) AND e.name = :name", {"v": exp_id, "name": name}
    return None


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

# The live trial runs of one experiment (``{where}``), and each one's MLflow status and start time,
# tags, params and latest metrics (``latest_metrics``: a key's value at its highest step, as
# MLflow's own search gives it; a NaN is kept as 0 with ``is_nan`` set).
_TRIALS_SQL = f"""
SELECT r.run_uuid FROM runs r
JOIN experiments e ON e.experiment_id = r.experiment_id
JOIN tags role ON role.run_uuid = r.run_uuid AND role.key = '{ROLE}' AND role.value = 'trial'
WHERE {{where}} AND r.lifecycle_stage = 'active'
"""
_RUNS_SQL = (
    "SELECT run_uuid, status, start_time FROM runs WHERE run_uuid IN ({trials}) ORDER BY start_time ASC, run_uuid ASC"
)
_TAGS_SQL = "SELECT run_uuid, key, value FROM tags WHERE run_uuid IN ({trials})"
_PARAMS_SQL = "SELECT run_uuid, key, value FROM params WHERE run_uuid IN ({trials})"
_METRICS_SQL = "SELECT run_uuid, key, value, is_nan FROM latest_metrics WHERE run_uuid IN ({trials})"


@dataclass(frozen=True)
class Recorded:
    """One run as the analysis reads it: its id, MLflow's status and start time (ms; 0 if none),
    its tags, params and latest metrics."""

    run_id: str
    status: str
    start_time: int
    tags: dict[str, str]
    params: dict[str, str]
    metrics: dict[str, float]

    @classmethod
    def of(cls, run) -> Recorded:
        """The record of an MLflow ``Run``."""
        i, d = run.info, run.data
        return cls(i.run_id, i.status, i.start_time or 0, dict(d.tags), dict(d.params), dict(d.metrics))


def trial_runs(cl, exp_id: str) -> list[Recorded]:
    """Every live trial run of ``exp_id``, oldest first: on a database store, or a tracking
    server whose database this process reaches (``STORE_ENV``), read with SQL in one transaction
    (``_sql_trial_runs``); else through MLflow's search, which builds every run's entities (half a
    minute at 10,000 runs)."""
    at = _database_of(cl, exp_id)
    found = _sql_trial_runs(*at) if at is not None else None
    if found is None:
        found = [Recorded.of(r) for r in find_runs(cl, exp_id, raystudy__role="trial")]
    return found


def _sql_trial_runs(store: str, where: str, params: dict[str, str]) -> list[Recorded] | None:
    """``trial_runs`` of the experiment ``where`` names in the database ``store``; None where
    ``_sql_reads`` answers None."""
    trials = _TRIALS_SQL.format(where=where)
    reads = [q.format(trials=trials) for q in (_RUNS_SQL, _TAGS_SQL, _PARAMS_SQL, _METRICS_SQL)]
    found = _sql_reads(store, reads, **params)
    if found is None:
        return None
    runs, tag_rows, param_rows, metric_rows = found
    tags: dict[str, dict[str, str]] = {run_id: {} for run_id, _, _ in runs}
    params_of: dict[str, dict[str, str]] = {run_id: {} for run_id, _, _ in runs}
    metrics: dict[str, dict[str, float]] = {run_id: {} for run_id, _, _ in runs}
    for run_id, key, value in tag_rows:
        tags.setdefault(run_id, {})[key] = value
    for run_id, key, value in param_rows:
        params_of.setdefault(run_id, {})[key] = value
    for run_id, key, value, is_nan in metric_rows:
        metrics.setdefault(run_id, {})[key] = math.nan if is_nan else float(value)
    return [
        Recorded(run_id, status, start or 0, tags[run_id], params_of[run_id], metrics[run_id])
        for run_id, status, start in runs
    ]


def _sql_statuses(uri: str, where: str, **params) -> dict[str, str] | None:
    """``statuses`` of the experiment ``where`` names (its ``:name``s are ``params``) in a database
    store; None where ``_sql`` answers None (MLflow's own search answers then)."""
    rows = _sql(uri, _STATUSES_SQL.format(where=where), **params)
    return None if rows is None else _fold(rows)


def _sql(uri: str, sql: str, **params) -> list[tuple] | None:
    """The rows of ``sql`` on the database store ``uri``, read with SQLAlchemy (a SQLite file
    opened read only); None for a store of another kind, or a schema the query does not know
    (another MLflow's), or a database that cannot be reached."""
    found = _sql_reads(uri, [sql], **params)
    return None if found is None else found[0]


def _sql_reads(uri: str, statements: list, **params) -> list[list[tuple]] | None:
    """The rows of each of ``statements`` (SQL text, or SQLAlchemy's ``text`` with its parameters
    bound), read in one transaction (``_sql``)."""
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
            clauses = [sqlalchemy.text(sql) if isinstance(sql, str) else sql for sql in statements]
            return [[tuple(r) for r in con.execute(clause, params).fetchall()] for clause in clauses]
    except sqlalchemy.exc.DBAPIError:
        return None
    finally:
        engine.dispose()


# A chunk of runs' histories of some keys, in the order MLflow's get_metric_history gives each one.
_HISTORY_SQL = """
SELECT run_uuid, key, step, value, is_nan FROM metrics WHERE run_uuid IN :ids AND key IN :keys
ORDER BY run_uuid, key, timestamp, step, value
"""
_IDS_SQL = "SELECT COUNT(*) FROM runs WHERE run_uuid IN :ids"
_CHUNK = 500  # run ids a query: well under every database's limit on bound parameters


def metric_histories(cl, run_ids, keys) -> dict[tuple[str, str], list[tuple[int, float]]] | None:
    """(run id, key) -> its (step, value) points, as ``cl.get_metric_history`` gives them, for every
    run of ``run_ids`` and key of ``keys`` that logged any: read with SQL where ``cl``'s store is a
    database this process reaches (``_store_of``; behind a tracking server, only where that
    database holds every one of the runs), a query per 500 runs instead of an MLflow call per run
    and key. None where SQL cannot answer: ask MLflow then."""
    import sqlalchemy

    store = _store_of(cl.tracking_uri)
    ids, keys = sorted(set(run_ids)), sorted(set(keys))
    if store is None or not ids or not keys:
        return None if store is None else {}
    found: dict[tuple[str, str], list[tuple[int, float]]] = {}
    for i in range(0, len(ids), _CHUNK):
        chunk = ids[i : i + _CHUNK]
        history = sqlalchemy.text(_HISTORY_SQL).bindparams(
            sqlalchemy.bindparam("ids", expanding=True), sqlalchemy.bindparam("keys", expanding=True)
        )
        reads = [history]
        if store != cl.tracking_uri:  # the server's database: it must be the one that holds these runs
            reads.append(sqlalchemy.text(_IDS_SQL).bindparams(sqlalchemy.bindparam("ids", expanding=True)))
        rows = _sql_reads(store, reads, ids=chunk, keys=keys)
        if rows is None or (len(rows) > 1 and rows[1] != [(len(chunk),)]):
            return None
        for run_id, key, step, value, is_nan in rows[0]:
            found.setdefault((run_id, key), []).append((step, math.nan if is_nan else float(value)))
    return found


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
    """The rows of runs (``Recorded``, or MLflow ``Run`` objects), with their start times (for
    deduplication)."""
    out = []
    for r in runs:
        r = r if isinstance(r, Recorded) else Recorded.of(r)
        out.append({**run_row(r.run_id, r.status, r.tags, r.params, r.metrics), "start_time": r.start_time})
    return out
