"""What a study's store says once its last command has ended: every trial once, ended, its steps
once, its final numbers its last reported ones; a search's Optuna study and MLflow agreeing; the
store whole; a snapshot that restores; and each command's last line clear. One checker for the
nemesis (``benchmarks/nemesis.py``) and the scale benchmarks' exactly-once counts.

    python benchmarks/checker.py --store sqlite:///work/mlflow.db --experiment raystudy-scale100-vit_demo-rehearsal
    python benchmarks/checker.py --store ... --search STUDY --optuna work/runs/optuna/optuna.db --logs work/driver*.log

The store is read with SQL (SQLAlchemy: a SQLite file or a PostgreSQL URI, MLflow's own tables),
never through the tracking server, so a server that is down or paused does not hide a run.
Exit status: 0 without anomalies, 1 with any (each printed on a line), 2 for bad input.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

# Statuses a trial's run may end in (raystudy.tracking.tags.TERMINAL); a search's ``failed`` and
# ``interrupted`` runs are ends too (their configs are not drawn again), a grid's are not.
ENDED = ("finished", "diverged", "stopped")
SEARCH_ENDED = (*ENDED, "failed", "interrupted")
# A line of a Python traceback, or the exception line that ends one.
TRACEBACK = re.compile(
    r'^(Traceback \(most recent call last\)|\s+File "|\s+\^+\s*$|([\w.]+\.)?\w*(Error|Exception)(:|$))'
)

# Ray's C++ fatal error, which aborts the process after its stack: "[2026-12-06 20:14:46,641 C 22032
# 22032] raylet_ipc_client.cc:85: ...", then "*** StackTrace Information ***".
RAY_FATAL = re.compile(r"^(\[[\d-]+ [\d:,]+ C \d+ \d+\] |\*\*\* StackTrace Information \*\*\*)")


@dataclasses.dataclass(frozen=True)
class Anomaly:
    kind: str  # twice, lost, running, unended, step_twice, final, optuna, integrity, snapshot, last_line
    detail: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.detail}"


# ---------------------------------------------------------------- reading the store


def _engine(store: str):
    import sqlalchemy

    return sqlalchemy.create_engine(store if "://" in store else f"sqlite:///{store}")


def _rows(engine, sql: str, **params) -> list[tuple]:
    import sqlalchemy

    with engine.connect() as c:
        return [tuple(r) for r in c.execute(sqlalchemy.text(sql), params)]


def trial_runs(store: str, experiment: str | None = None, search: str | None = None) -> list[dict]:
    """Each active trial run of ``experiment`` (any, when None), of the Optuna study ``search``
    when given: its id, MLflow status, ``raystudy.key`` and ``raystudy.status``."""
    engine = _engine(store)
    try:
        sql = (
            "select r.run_uuid, r.status, k.value, s.value from runs r "
            "join tags role on role.run_uuid = r.run_uuid and role.key = 'raystudy.role' and role.value = 'trial' "
            "left join tags k on k.run_uuid = r.run_uuid and k.key = 'raystudy.key' "
            "left join tags s on s.run_uuid = r.run_uuid and s.key = 'raystudy.status' "
            "join experiments e on e.experiment_id = r.experiment_id "
            "where r.lifecycle_stage = 'active'"
        )
        params = {}
        if experiment is not None:
            sql, params["e"] = sql + " and e.name = :e", experiment
        if search is not None:
            sql += (
                " and exists (select 1 from tags q where q.run_uuid = r.run_uuid"
                " and q.key = 'raystudy.search' and q.value = :q)"
            )
            params["q"] = search
        return [dict(zip(("run", "mlflow", "key", "status"), r)) for r in _rows(engine, sql, **params)]
    finally:
        engine.dispose()


def counts(runs: list[dict], ended=ENDED) -> dict:
    """The exactly-once counts of ``trial_runs``: runs, distinct keys, ended (by ``raystudy.status``), RUNNING."""
    return {
        "runs": len(runs),
        "keys": len({r["key"] for r in runs}),
        "ended": sum(r["status"] in ended for r in runs),
        "running": sum(r["mlflow"] == "RUNNING" for r in runs),
    }


def steps_twice(store: str, runs: list[str]) -> list[tuple]:
    """(run, metric, step, times) of each metric step logged more than once in ``runs``."""
    if not runs:
        return []
    engine = _engine(store)
    try:
        sql = "select run_uuid, key, step, count(*) from metrics group by run_uuid, key, step having count(*) > 1"
        wanted = set(runs)
        return [r for r in _rows(engine, sql) if r[0] in wanted]
    finally:
        engine.dispose()


def histories(store: str, runs: list[str], keys=("best_val_acc", "steps_done", "loss")) -> dict[str, dict]:
    """run -> metric -> {step: value} of ``keys`` (step 0 is a final result, as raystudy logs them)."""
    engine = _engine(store)
    out: dict[str, dict] = {r: {} for r in runs}
    try:
        names = ",".join(f"'{k}'" for k in keys)
        for run, key, step, value in _rows(
            engine, f"select run_uuid, key, step, value from metrics where key in ({names})"
        ):
            if run in out:
                out[run].setdefault(key, {})[int(step)] = value
    finally:
        engine.dispose()
    return out


# ---------------------------------------------------------------- the checks (pure: facts in, anomalies out)


def once(runs: list[dict], expected: set[str] | int | None, ended=ENDED) -> list[Anomaly]:
    """Every trial key in one run, each run ended and none RUNNING; ``expected``: the keys (or how
    many) the study holds, so that one never recorded is reported lost."""
    out = []
    for key, n in Counter(r["key"] for r in runs).items():
        if n > 1:
            out.append(Anomaly("twice", f"trial {key} has {n} runs"))
    keys = {r["key"] for r in runs}
    if isinstance(expected, int) and len(keys) < expected:
        out.append(Anomaly("lost", f"{expected - len(keys)} of {expected} trials have no run"))
    elif isinstance(expected, set):
        out += [Anomaly("lost", f"trial {k} has no run") for k in sorted(expected - keys)]
    for r in runs:
        if r["mlflow"] == "RUNNING":
            out.append(Anomaly("running", f"run {r['run']} (trial {r['key']}) is RUNNING"))
        elif r["status"] not in ended:
            out.append(Anomaly("unended", f"run {r['run']} (trial {r['key']}) ended {r['status']!r}"))
    return out


def steps(twice: list[tuple]) -> list[Anomaly]:
    """A metric step logged more than once."""
    return [Anomaly("step_twice", f"run {r} logged {k} at step {s} {n} times") for r, k, s, n in twice]


def finals(runs: list[dict], history: dict[str, dict]) -> list[Anomaly]:
    """A finished trial's final ``best_val_acc`` (step 0) equal to the last one it reported, and its
    ``steps_done`` to its last training step (a trial without steps, the linear probe, has neither)."""
    out = []
    for r in runs:
        if r["status"] != "finished":
            continue
        h = history.get(r["run"], {})
        best, done, loss = h.get("best_val_acc", {}), h.get("steps_done", {}), h.get("loss", {})
        reported = {s: v for s, v in best.items() if s > 0}
        if reported and 0 not in best:
            out.append(
                Anomaly("final", f"run {r['run']} (trial {r['key']}) is finished without its final best_val_acc")
            )
        elif reported and best[0] != reported[max(reported)]:
            last = reported[max(reported)]
            out.append(
                Anomaly("final", f"run {r['run']} final best_val_acc {best[0]!r} is not its last reported {last!r}")
            )
        steps_ = [s for s in loss if s > 0]
        if steps_ and 0 in done and int(done[0]) != max(steps_):
            out.append(Anomaly("final", f"run {r['run']} steps_done {done[0]:g} but its last step is {max(steps_)}"))
    return out


def agree(runs: list[dict], optuna: dict[str, int]) -> list[Anomaly]:
    """A search: each trial Optuna holds COMPLETE is one ended MLflow run (finished, diverged or
    stopped) and each ended run one COMPLETE trial; ``optuna``: its trials by state."""
    ended, complete = sum(r["status"] in ENDED for r in runs), optuna.get("COMPLETE", 0)
    if ended > complete:
        return [
            Anomaly("optuna", f"MLflow holds {ended} ended runs, Optuna {complete} COMPLETE trials: some ran again")
        ]
    if ended < complete:
        return [
            Anomaly("optuna", f"Optuna holds {complete} COMPLETE trials, MLflow {ended} ended runs: some were lost")
        ]
    return []


def last_lines(logs: dict[str, str]) -> list[Anomaly]:
    """Each command's output (name -> text) ends in a clear line, not a traceback, and has none."""
    out = []
    for name, text in logs.items():
        lines = [x for x in text.splitlines() if x.strip()]
        if lines and TRACEBACK.match(lines[-1]):
            out.append(Anomaly("last_line", f"{name} ends in a traceback: {lines[-1].strip()[:200]}"))
        elif any(x.startswith("Traceback (most recent call last)") for x in lines):
            out.append(Anomaly("last_line", f"{name} prints a traceback before its last line"))
        elif any(RAY_FATAL.match(x) for x in lines):
            out.append(Anomaly("last_line", f"{name} prints Ray's fatal error and its C++ stack"))
    return out


# ---------------------------------------------------------------- what needs a store or a server


def optuna_states(optuna_db: Path, study: str) -> dict[str, int]:
    """Optuna's trials of ``study`` by state, read from its SQLite storage."""
    with sqlite3.connect(f"file:{optuna_db}?mode=ro", uri=True, timeout=30) as c:
        rows = c.execute(
            "select state, count(*) from trials t join studies s using (study_id) "
            "where s.study_name = ? group by state",
            (study,),
        ).fetchall()
    return {str(s): n for s, n in rows}


def integrity(store: str) -> list[Anomaly]:
    """SQLite's integrity check of a file store; on any store, each run's latest metric (MLflow's
    ``latest_metrics``, what the runs table shows) at the highest step that metric has."""
    out = []
    if store.startswith("sqlite:///") or "://" not in store:
        path = store.removeprefix("sqlite:///")
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30) as c:
            ok = c.execute("pragma integrity_check").fetchone()[0]
        if ok != "ok":
            out.append(Anomaly("integrity", f"SQLite's integrity check of {path}: {ok}"))
    engine = _engine(store)
    try:
        sql = (
            "select l.run_uuid, l.key, l.step, m.top from latest_metrics l join "
            "(select run_uuid, key, max(step) as top from metrics group by run_uuid, key) m "
            "on m.run_uuid = l.run_uuid and m.key = l.key where l.step <> m.top"
        )
        out += [
            Anomaly("integrity", f"run {r} latest {k} at step {s}, its highest step {t}")
            for r, k, s, t in _rows(engine, sql)
        ]
    finally:
        engine.dispose()
    return out


def snapshot(path: Path, pg_uri: str | None = None) -> list[Anomaly]:
    """The snapshot ``path`` restores: a ``.sqlite.gz`` unpacks to a whole SQLite store whose
    MLflow tables read; a ``.pgdump`` restores (pg_restore) into a new database on ``pg_uri``'s
    server, whose tables read. (A snapshot taken before any trial ended holds none: no anomaly.)"""
    if path.name.endswith(".sqlite.gz"):
        with tempfile.TemporaryDirectory() as tmp:
            db = Path(tmp) / "mlflow.db"
            try:
                with gzip.open(path) as src, db.open("wb") as dst:
                    shutil.copyfileobj(src, dst)
                found = integrity(f"sqlite:///{db}")
                trial_runs(f"sqlite:///{db}")  # MLflow's tables are there and read
            except (OSError, sqlite3.Error, EOFError) as e:
                return [Anomaly("snapshot", f"{path} does not restore: {e}")]
            return [Anomaly("snapshot", f"{path}: {a}") for a in found]
    if path.name.endswith(".pgdump") and pg_uri:
        return _pg_snapshot(path, pg_uri)
    return [Anomaly("snapshot", f"{path}: not a snapshot this checker restores")]


def _pg_snapshot(path: Path, pg_uri: str) -> list[Anomaly]:
    import sqlalchemy

    scratch = f"snapcheck{abs(hash(path)) % 10**8}"
    admin = sqlalchemy.create_engine(pg_uri, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as c:
            c.execute(sqlalchemy.text(f"drop database if exists {scratch}"))
            c.execute(sqlalchemy.text(f"create database {scratch}"))
        url = sqlalchemy.engine.make_url(pg_uri).set(database=scratch, drivername="postgresql")
        libpq = url.render_as_string(hide_password=False)
        tool = shutil.which("pg_restore") or next(
            iter(sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_restore"))[-1:]), None
        )
        p = subprocess.run(
            [str(tool), "--no-owner", "--no-privileges", "--exit-on-error", "-d", libpq, str(path)],
            capture_output=True,
            text=True,
        )
        if p.returncode != 0:
            return [Anomaly("snapshot", f"{path} does not restore: {p.stderr.strip()[-300:]}")]
        trial_runs(str(url.set(drivername="postgresql+psycopg2").render_as_string(hide_password=False)))
        return []
    finally:
        with admin.connect() as c:
            c.execute(sqlalchemy.text(f"drop database if exists {scratch}"))
        admin.dispose()


def check(
    store: str,
    experiment: str | None = None,
    *,
    expected: set[str] | int | None = None,
    search: str | None = None,
    optuna_db: Path | None = None,
    logs: dict[str, str] | None = None,
    snapshots: list[Path] = (),
    pg_uri: str | None = None,
) -> list[Anomaly]:
    """Every check over the store ``store`` (the study's ``experiment``; a search's study ``search``
    with its Optuna storage ``optuna_db``), the commands' ``logs`` and the newest of ``snapshots``."""
    runs = trial_runs(store, experiment, search)
    found = once(runs, expected, SEARCH_ENDED if search else ENDED)
    ids = [r["run"] for r in runs]
    found += steps(steps_twice(store, ids))
    found += finals(runs, histories(store, ids))
    if search and optuna_db is not None:
        found += agree(runs, optuna_states(optuna_db, search))
    found += integrity(store)
    if snapshots:
        found += snapshot(sorted(snapshots, key=lambda p: p.name)[-1], pg_uri)
    return found + last_lines(logs or {})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--store", required=True, help="the MLflow store: sqlite:///PATH, a SQLite file or postgresql://...")
    p.add_argument("--experiment", help="the study's experiment (all, when left out)")
    p.add_argument("--trials", type=int, help="how many trials the study holds (a trial never recorded is lost)")
    p.add_argument("--search", help="a search's Optuna study name")
    p.add_argument("--optuna", type=Path, help="the search's Optuna storage (optuna.db)")
    p.add_argument(
        "--logs", nargs="*", type=Path, default=[], help="the commands' output, each checked for a clear last line"
    )
    args = p.parse_args(argv)
    if "://" not in args.store and not Path(args.store).is_file():
        print(
            f"checker: --store {args.store}: no such file; use sqlite:///PATH, a SQLite file or a database URI",
            file=sys.stderr,
        )
        return 2
    if (args.search is None) != (args.optuna is None):
        print("checker: --search and --optuna go together (a search's study and its storage)", file=sys.stderr)
        return 2
    logs = {str(p): p.read_text(errors="replace") for p in args.logs}
    found = check(
        args.store, args.experiment, expected=args.trials, search=args.search, optuna_db=args.optuna, logs=logs
    )
    for a in found:
        print(a)
    print(f"{len(found)} anomalies")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
