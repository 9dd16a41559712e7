"""The tracking store: its URI checked before any trial (credentials, a SQLite file intact and
writable), the client, the study's experiment."""

from __future__ import annotations

import functools
import os
import socket
import subprocess
from pathlib import Path
from urllib.parse import urlparse

from raystudy.errors import ConfigError
from raystudy.tracking.tags import experiment_tags


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
    drivers creating the schema at once otherwise leave a half-made store no one can open.
    Through a tracking server MLflow writes two lines of links to stdout as each run ends: a
    grid's console of thousands of trials would be those lines, so they are off unless the
    environment asks for them (the console and ``browse`` say where the runs are)."""
    from mlflow import MlflowClient

    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
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


def default_artifact_location(uri: str) -> str | None:
    """Artifacts next to a local SQLite store (absolute, so any working directory finds them)."""
    db = sqlite_path(uri)
    return None if db is None else (db.parent / "mlartifacts").resolve().as_uri()


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
