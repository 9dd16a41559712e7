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
import os
import socket
import subprocess
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from raystudy import components
from raystudy.config import FinetuneConfig, parse_value
from raystudy.errors import ConfigError

# Tag names of the run record.
ROLE, KEY, STATUS, ERROR, ATTEMPTS = (
    "raystudy.role",
    "raystudy.key",
    "raystudy.status",
    "raystudy.error",
    "raystudy.attempts",
)
STOPPED_AT = "raystudy.stopped_at"  # the step an adaptive policy stopped the trial at
WORKER, RESUMED_FROM, LAST_ERROR = "raystudy.worker", "raystudy.resumed_from", "raystudy.last_error"

# Final results logged as metrics.
FINAL_METRICS = ("best_val_acc", "test_acc", "test_loss", "best_step", "steps_done", "wall_s", "trainable_params")
# Step metrics reported by the loop.
STEP_METRICS = ("loss", "scheduled_lr", "val_acc", "val_loss", "best_val_acc")

# The experiment tag MLflow's UI reads to open an experiment as classic ML runs, not GenAI traces.
EXPERIMENT_KIND = ("mlflow.experimentKind", "custom_model_development")
# The run description the UI shows (Markdown) on a run's page and in the runs table.
NOTE = "mlflow.note.content"
MAX_NOTE = 8000  # MLflow's limit on a tag's value, the description's too
REPORT_HEAD = "\n## Analysis report"  # where the report starts in the parent run's description

# Statuses of a trial that is done: never run again. "stopped": ended early by a scheduler.
TERMINAL = ("finished", "diverged", "stopped")


class TrackingUnavailable(ConfigError):
    """The tracking server or store cannot be reached."""


def sqlite_path(uri: str) -> Path | None:
    """The file of a ``sqlite:///PATH`` store; None for any other URI."""
    return Path(uri[len("sqlite:///") :]) if uri.startswith("sqlite:///") else None


def default_uri() -> str:
    """$MLFLOW_TRACKING_URI, else a SQLite file in the working directory (MLflow 3's default)."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path.cwd() / 'mlflow.db'}"


def check_uri(uri: str, timeout: float = 5.0, must_exist: bool = False) -> None:
    """Fail fast, with one line, if ``uri`` cannot be used as a tracking store.

    ``must_exist``: a command that only reads (the analysis) refuses a SQLite store that is not
    there, where MLflow would create an empty one and report no experiment.
    """
    p = urlparse(uri)
    if p.scheme in ("http", "https"):
        host, port = p.hostname, p.port or (443 if p.scheme == "https" else 80)
        try:
            with socket.create_connection((host, port), timeout=timeout):
                pass
        except OSError as e:
            raise TrackingUnavailable(
                f"MLflow tracking server {uri} is unreachable ({e.strerror or e}); "
                "start it (mlflow server ...) or pass another --tracking-uri"
            ) from None
        import urllib.request

        try:
            with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout) as r:
                if r.status != 200:
                    raise OSError(f"HTTP {r.status}")
        except OSError as e:
            raise TrackingUnavailable(f"MLflow tracking server {uri} does not answer /health ({e})") from None
        _check_credentials(uri, timeout)
    elif p.scheme == "sqlite":
        path = sqlite_path(uri)
        if path is None or not path.parent.is_dir():
            raise TrackingUnavailable(f"tracking URI {uri!r}: folder {path.parent if path else '?'} does not exist")
        if must_exist and not path.is_file():
            raise TrackingUnavailable(
                f"no MLflow store at {path}: run the grid there first, or pass "
                "--tracking-uri (sqlite:///PATH or http://HOST:PORT)"
            )
        _check_sqlite(uri, path)
    elif p.scheme in ("postgresql", "mysql", "mssql") or p.scheme.startswith(("postgresql+", "mysql+")):
        pass  # checked by the first query
    else:
        raise TrackingUnavailable(
            f"unsupported tracking URI {uri!r}; use sqlite:///PATH, "
            "http(s)://HOST:PORT or a database URI (the file store is disabled in MLflow 3)"
        )


def _check_credentials(uri: str, timeout: float) -> None:
    """A server behind MLflow's basic-auth app (the cluster's) takes this environment's
    credentials; /health answers without them, so one API call asks with them."""
    import base64
    import os
    import urllib.error
    import urllib.request

    user, password = os.environ.get("MLFLOW_TRACKING_USERNAME"), os.environ.get("MLFLOW_TRACKING_PASSWORD")
    req = urllib.request.Request(uri.rstrip("/") + "/api/2.0/mlflow/experiments/search?max_results=1")
    if user is not None and password is not None:
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        req.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout):
            pass
    except urllib.error.HTTPError as e:
        if e.code in (401, 403):
            given = "refuses the credentials given" if user is not None else "asks for credentials"
            raise TrackingUnavailable(
                f"MLflow tracking server {uri} {given} (HTTP {e.code}): set MLFLOW_TRACKING_USERNAME and "
                "MLFLOW_TRACKING_PASSWORD (on the cluster's nodes: source ~/raystudy.env)"
            ) from None
    except OSError:
        pass  # reachable a moment ago: the driver's own writes will say what is wrong


def _check_sqlite(uri: str, path: Path) -> None:
    """An SQLite store MLflow can open and write, checked without writing to it."""
    import tempfile

    try:
        if path.exists():
            if not path.is_file():
                raise TrackingUnavailable(f"tracking URI {uri!r}: {path} is not a file")
            with open(path, "rb") as f:
                head = f.read(16)
            if head and head != b"SQLite format 3\x00":
                raise TrackingUnavailable(f"tracking URI {uri!r}: {path} is not an SQLite database")
            with open(path, "ab"):  # opened for writing, nothing written
                pass
            if head:
                _check_intact(path, path.stat().st_size, path.stat().st_mtime_ns)
        else:
            with tempfile.TemporaryFile(dir=path.parent):  # anonymous: never seen in the folder
                pass
    except OSError as e:
        raise TrackingUnavailable(f"tracking URI {uri!r}: cannot write {path} ({e.strerror or e})") from None


# SQLite's primary result codes for a damaged file: SQLITE_CORRUPT, SQLITE_NOTADB.
_DAMAGED = (11, 26)


@functools.lru_cache(maxsize=16)
def _check_intact(path: Path, size: int, mtime_ns: int) -> None:
    """A store whose every page SQLite reads back intact (``PRAGMA quick_check``, a pass over the
    file at disk speed), opened read only: a damaged store is refused before any work, the file
    untouched, where MLflow would fail midway through. Once per file version (size, mtime).

    The first pass takes no lock, so a driver writing to the store meanwhile never waits on it;
    only what looks damaged then is read again under a shared lock, past any write in flight."""
    problem = _quick_check(path, locked=False)
    if problem is not None:
        problem = _quick_check(path, locked=True)
    if problem is not None:
        rescued = path.with_name(f"{path.stem}-recovered{path.suffix}")
        raise TrackingUnavailable(
            f"MLflow store {path} is damaged (SQLite: {' '.join(problem.split())[:160]}); it was left as it is. "
            f"Restore a snapshot of it, or recover what SQLite can read with a sqlite3 that has the dbpage "
            f"module: sqlite3 {path} .recover | sqlite3 {rescued}, then pass --tracking-uri sqlite:///{rescued}"
        )


def _quick_check(path: Path, locked: bool) -> str | None:
    """What SQLite's quick_check finds wrong with ``path`` (None: intact, or not readable here,
    which MLflow's own error then says better); read only, without a lock unless ``locked``."""
    import sqlite3

    mode = "mode=ro" if locked else "mode=ro&immutable=1"
    try:
        con = sqlite3.connect(f"{path.resolve().as_uri()}?{mode}", uri=True, timeout=30)
        try:
            found = con.execute("PRAGMA quick_check(1)").fetchone()
        finally:
            con.close()
    except sqlite3.DatabaseError as e:
        return str(e) if (getattr(e, "sqlite_errorcode", 0) & 0xFF) in _DAMAGED else None
    if found == ("ok",):
        return None
    return str(found[0]).replace("*** in database main ***", "") if found else "no answer to quick_check"


_READY: set[str] = set()


def client(uri: str):
    """An MlflowClient for ``uri``. A SQLite store is created or migrated under a file lock:
    drivers creating the schema at once otherwise leave a half-made store no one can open."""
    from mlflow import MlflowClient

    db = sqlite_path(uri)
    if db is None or uri in _READY:
        return MlflowClient(tracking_uri=uri)
    import fcntl

    with open(db.with_name(f".{db.name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        cl = MlflowClient(tracking_uri=uri)
        cl.search_experiments(max_results=1)  # opening the store makes or upgrades its schema
    _READY.add(uri)
    return cl


def experiment_id(cl, name: str, artifact_location: str | None = None) -> str:
    """The id of experiment ``name``, created if missing (race-safe), with ``experiment_tags``."""
    exp = cl.get_experiment_by_name(name)
    if exp is not None:
        if exp.lifecycle_stage == "deleted":
            cl.restore_experiment(exp.experiment_id)
        for k, v in experiment_tags().items():  # an experiment an older raystudy made
            if exp.tags.get(k) != v:
                cl.set_experiment_tag(exp.experiment_id, k, v)
        return exp.experiment_id
    try:
        return cl.create_experiment(name, artifact_location=artifact_location, tags=experiment_tags())
    except Exception:
        exp = cl.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id


# The runs table as raystudy wants it seen: the key metrics and the status as columns (MLflow's
# defaults, Source, Models and Dataset, are empty here), best test accuracy first. Stored as a
# view the UI shares by URL (an experiment tag ``mlflow.sharedViewState.<key>``, JSON).
VIEW_KEY = "raystudy"
RUNS_VIEW = {
    "orderByKey": "metrics.`test_acc`",
    "orderByAsc": False,
    "selectedColumns": ["metrics.`test_acc`", "metrics.`best_val_acc`", "tags.`raystudy.status`"],
}


def experiment_tags() -> dict[str, str]:
    """Every raystudy experiment's tags: classic ML runs, and ``RUNS_VIEW`` where ``runs_url``
    points the UI."""
    import json

    return {EXPERIMENT_KIND[0]: EXPERIMENT_KIND[1], f"mlflow.sharedViewState.{VIEW_KEY}": json.dumps(RUNS_VIEW)}


def runs_url(uri: str, exp_id: str, server: str = "http://127.0.0.1:5000") -> str:
    """The UI page of experiment ``exp_id``'s runs in raystudy's view (``share_runs_view``). A
    tracking server serves its own UI; a database store is served by ``mlflow ui`` at ``server``."""
    base = uri.rstrip("/") if urlparse(uri).scheme in ("http", "https") else server
    return f"{base}/#/experiments/{exp_id}/runs?viewStateShareKey={VIEW_KEY}"


def browse_lines(uri: str, exp_id: str) -> list[str]:
    """Where to look at the runs: the command serving a database store, and the runs page."""
    if urlparse(uri).scheme in ("http", "https"):
        return [f"browse: {runs_url(uri, exp_id)}"]
    return [f"browse: mlflow ui --backend-store-uri {uri}", f"  then open {runs_url(uri, exp_id)}"]


def default_artifact_location(uri: str) -> str | None:
    """Artifacts next to a local SQLite store (absolute, so any working directory finds them)."""
    db = sqlite_path(uri)
    return None if db is None else (db.parent / "mlartifacts").resolve().as_uri()


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
    """The raystudy status of every trial key of ``exp_id``, in one query (terminal ones win)."""
    out: dict[str, str] = {}
    for run in find_runs(cl, exp_id, raystudy__role="trial"):
        key, status = run.data.tags.get(KEY), run.data.tags.get(STATUS)
        if key and out.get(key) not in TERMINAL:
            out[key] = status
    return out


def known_statuses(uri: str, experiment: str) -> dict[str, str]:
    """``statuses`` of experiment ``experiment`` in the store at ``uri``, read only: empty when
    the store (a SQLite file) or the experiment does not exist yet, and neither is created."""
    db = sqlite_path(uri)
    if db is not None and not db.is_file():
        return {}
    cl = client(uri)
    exp = cl.get_experiment_by_name(experiment)
    if exp is None or exp.lifecycle_stage == "deleted":
        return {}
    return statuses(cl, exp.experiment_id)


def versions() -> dict[str, str]:
    """Code and package versions, for tags."""
    import importlib.metadata as md

    out = {}
    for pkg in ("raystudy", "torch", "timm", "ray", "mlflow", "peft", "optuna"):
        try:
            out[f"version.{pkg}"] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, cwd=Path(__file__).parent
        ).stdout.strip()
        if sha:
            out["mlflow.source.git.commit"] = sha
    except (OSError, subprocess.SubprocessError):
        pass
    return out


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
        f"| {i} | {r['condition']} | {100 * _num(r['test_acc']):.2f} | {_num(r['avg_rank']):.2f} | "
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
        for k, v in [(f"{name}/{r['condition']}", _num(r[col]))]
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


def trial_status(cl, exp_id: str, key: str) -> tuple[str | None, Any]:
    """(raystudy status, run) of the run with ``key``, or (None, None)."""
    found = find_runs(cl, exp_id, raystudy__role="trial", raystudy__key=key)
    if not found:
        return None, None
    # Exactly once by construction; should a store hold two anyway, the terminal one is the record.
    found.sort(key=lambda r: r.data.tags.get(STATUS) not in TERMINAL)
    return found[0].data.tags.get(STATUS), found[0]


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


DATA_TAG = "raystudy.data."  # a run on your own data: raystudy.data.location, .test_size, .test_hash, ...


@functools.lru_cache(maxsize=64)
def data_tags(data: str) -> dict[str, str]:
    """What identifies your own data at ``data`` for a run's record (``userdata.summary``: the
    location, the classes, the test split's size and the hash of its file list) as tags; none for a
    registry dataset. Listed once per process and location."""
    if not data:
        return {}
    from raystudy import userdata

    return {DATA_TAG + k: v for k, v in userdata.summary(data).items()}


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
        lr = _num(config.get("lr"))
        parts.append(f"lr{lr:.3g}" if not math.isnan(lr) else f"lr{config.get('lr')}")
    parts.append(f"s{config.get('seed')}")
    return "·".join(parts)


def plasticity_metrics(table: list[dict[str, Any]], prefix: str = "plasticity") -> dict[str, float]:
    """Per-component summaries of a plasticity table (rows of mode, layer, component, mean):
    ``<prefix>/<mode>/<component>`` = the mean over layers, as the report's component table
    averages them; finite values only."""
    sums: dict[str, list[float]] = {}
    for row in table:
        v = _num(row.get("mean"))
        if math.isfinite(v):
            sums.setdefault(f"{prefix}/{row['mode']}/{row['component']}", []).append(v)
    return {k: sum(v) / len(v) for k, v in sums.items()}


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


def logged_upto(cl, run_id: str) -> dict[str, int]:
    """The last step of each kind (``_kind``) a run already has: where a resumed attempt's
    points become new."""
    return {
        kind: max((m.step for m in cl.get_metric_history(run_id, key)), default=-1)
        for kind, key in (("train", "loss"), ("eval", "val_acc"))
    }


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


def _result_note(results: dict[str, Any]) -> str:
    return f"test {100 * _num(results.get('test_acc')):.1f} · val {100 * _num(results.get('best_val_acc')):.1f}"


def close_stale(cl, exp_id: str, **tags: str) -> int:
    """Mark trial runs (matching ``tags``) still RUNNING as interrupted and KILLED; returns how many.

    Called where no trial of them can still be running (a search after its Tuner returned, or
    before it starts after a kill), so no run is ever left RUNNING.
    """
    from mlflow.entities import RunTag

    n = 0
    for run in find_runs(cl, exp_id, raystudy__role="trial", **tags):
        if run.info.status != "RUNNING":
            continue
        if run.data.tags.get(STATUS) == "running":
            cl.log_batch(run.info.run_id, tags=[RunTag(STATUS, "interrupted")])
            cl.set_terminated(run.info.run_id, status="KILLED")
            n += 1
        elif run.data.tags.get(STATUS) in TERMINAL:  # its driver died inside finish_trial: the result stands
            cl.set_terminated(run.info.run_id, status="FINISHED")
    return n


def fail_trial(cl, run_id: str, error: str) -> None:
    """End a trial's run FAILED, status ``failed``, with the last of ``error``."""
    from mlflow.entities import RunTag

    cl.log_batch(run_id, tags=[RunTag(STATUS, "failed"), RunTag(ERROR, error[-5000:])])
    cl.set_terminated(run_id, status="FAILED")


def note_worker(cl, run_id: str, where: str) -> None:
    """Tag the node and process (``ip:pid``) that runs the trial, for debugging."""
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


def _num(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def run_status_of(run_status: str, tags: dict[str, str], metrics: dict[str, float]) -> tuple[str, str]:
    """A trial run's raystudy status and, when it is not what the run says of itself, why: the
    ``raystudy.status`` tag, MLflow's own status if the tag is absent, and ``failed`` for a run
    finished without a test accuracy."""
    status = tags.get(STATUS) or _MLFLOW_STATUS.get(run_status, "failed")
    if status == "finished" and math.isnan(_num(metrics.get("test_acc"))):
        return "failed", "finished without a test_acc metric"
    return status, ""


def run_row(
    run_id: str, run_status: str, tags: dict[str, str], params: dict[str, str], metrics: dict[str, float]
) -> dict[str, Any]:
    """The row of one trial run in the runs table, from its MLflow status, tags, params, metrics.

    ``val_acc`` is the final ``best_val_acc`` (the validation accuracy of the checkpoint that was
    tested), ``test_acc`` its test accuracy. The status is the ``raystudy.status`` tag (MLflow's
    own status if the tag is absent); a run tagged finished without a test accuracy is marked
    failed. Accuracies are NaN unless finished: never zeros in a mean; a diverged run's tested
    best checkpoint is apart, in ``diverged_val_acc`` and ``diverged_test_acc``.
    ``trainable_params`` is the run's logged count (NaN when it logged none).
    """
    status, why = run_status_of(run_status, tags, metrics)
    error = tags.get(ERROR, "") or why
    done = status == "finished"
    seed, probes = _num(params.get("seed")), _num(params.get("probe_pairs"))
    return {
        "run_id": run_id,
        "model": tags.get("model") or params.get("model", "unknown"),
        "optimizer": tags.get("optimizer") or params.get("optimizer", "unknown"),
        "low_data": str(params.get("low_data", "False")).lower() == "true",
        "dataset": tags.get("dataset") or params.get("dataset"),
        "condition": tags.get("condition") or params.get("condition"),
        "lr": _num(params.get("lr")),
        "seed": int(seed) if not math.isnan(seed) else -1,
        "val_acc": _num(metrics.get("best_val_acc")) if done else math.nan,
        "test_acc": _num(metrics.get("test_acc")) if done else math.nan,
        "status": status,
        "parent_run_id": tags.get("mlflow.parentRunId", ""),
        "key": tags.get(KEY, ""),
        "error": error,
        "probe_pairs": -1 if math.isnan(probes) else int(probes),
        # how accuracy was counted and the linear probe fitted (runs before these keys: the defaults)
        "accuracy": params.get("accuracy", "per_image"),
        "linear_probe_data": params.get("linear_probe_data", "clean"),
        # logged by finished and diverged runs alike: the count does not depend on the outcome
        "trainable_params": _num(metrics.get("trainable_params")),
        # a diverged run's best checkpoint before it diverged, tested: what the paper's code keeps
        "diverged_val_acc": _num(metrics.get("best_val_acc")) if status == "diverged" else math.nan,
        "diverged_test_acc": _num(metrics.get("test_acc")) if status == "diverged" else math.nan,
    }


def val_curve(cl, run_id: str) -> list[tuple[int, float]]:
    """A run's validation accuracy by step, as (step, value) pairs in step order."""
    return sorted((m.step, m.value) for m in cl.get_metric_history(run_id, "val_acc"))


def policy_view(cl, run):
    """What the adaptive policy has seen of one recorded trial run (``adaptive.Seen``): its
    validation curve, whether it ended, its best validation accuracy if it finished. A resumed
    driver and a replay of a finished grid both start from it."""
    from raystudy import adaptive

    status, _ = run_status_of(run.info.status, run.data.tags, run.data.metrics)
    return adaptive.seen_of(val_curve(cl, run.info.run_id), status, run.data.metrics.get("best_val_acc", math.nan))


def rows(runs) -> list[dict[str, Any]]:
    """The rows of MLflow ``Run`` objects, with their start times (for deduplication)."""
    return [
        {
            **run_row(r.info.run_id, r.info.status, r.data.tags, r.data.params, r.data.metrics),
            "start_time": r.info.start_time or 0,
        }
        for r in runs
    ]


__all__ = [
    "default_uri",
    "runs_url",
    "browse_lines",
    "trial_name",
    "plasticity_metrics",
    "experiment_tags",
    "ranking_note",
    "log_ranking",
    "attach_report",
    "check_uri",
    "client",
    "experiment_id",
    "parent_run",
    "open_trial",
    "log_steps",
    "finish_trial",
    "fail_trial",
    "trial_status",
    "find_runs",
    "statuses",
    "close_stale",
    "run_status_of",
    "run_row",
    "policy_view",
    "rows",
    "run_config",
    "TrackingUnavailable",
]
