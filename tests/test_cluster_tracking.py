"""The cluster's tracking server as cluster/node.sh runs it on the head: MLflow on PostgreSQL, behind
MLflow's basic-auth app (slow: a real database server, a real `mlflow server`, a real grid).

node.sh initialises a PostgreSQL server in a state folder of the test's own and starts it on a port
of its own on 127.0.0.1 (as Debian's postgres user when the tests run as root: PostgreSQL refuses
root), then `mlflow server --app-name basic-auth` on it. Everything is stopped by its pid files."""

import base64
import glob
import os
import re
import shutil
import signal
import stat
import subprocess
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from tests.commands.test_grid_ray import SPACE, grid_cmd, write_space
from tests.helpers import driver_env, free_port, output_of, search_runs, start
from tests.test_cluster import answers, exports

# One xdist worker: the tests share one database and tracking server.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("cluster_tracking")]

REPO = Path(__file__).resolve().parent.parent
NODE_SH = REPO / "cluster" / "node.sh"
PG_CTL = shutil.which("pg_ctl") or next(iter(sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))), None)
SEARCH = "/api/2.0/mlflow/experiments/search?max_results=1"


def node_sh(env, *args, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(NODE_SH), *args], env=env, capture_output=True, text=True, timeout=timeout)


def stop_postgres(state: Path) -> None:
    """The test's PostgreSQL, stopped by its pid (what node.sh stop-postgres left running)."""
    pidfile = state / "postgres" / "postmaster.pid"
    if pidfile.is_file():
        try:
            os.kill(int(pidfile.read_text().split()[0]), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


def db_rows(server, query: str) -> list[tuple]:
    """``query``'s rows, read from the server's database itself with the secret node.sh keeps."""
    import psycopg2

    conn = psycopg2.connect(
        host="127.0.0.1", port=server.pg_port, user="mlflow", dbname="mlflow", passfile=str(server.state / "pgpass")
    )
    try:
        with conn.cursor() as cur:
            cur.execute(query)
            return cur.fetchall()
    finally:
        conn.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    if PG_CTL is None:
        pytest.skip("no PostgreSQL server programs (pg_ctl): apt-get install -y postgresql (.ci/run installs it)")
    # Short (PostgreSQL's socket lives in its data folder) and open to the postgres user when we are root.
    state = Path(tempfile.mkdtemp(prefix="rspg", dir="/tmp"))
    state.chmod(0o711)
    home = tmp_path_factory.mktemp("home")
    pg_port, port = free_port(), free_port()
    env = {**driver_env(), "RAYSTUDY_STATE": str(state), "RAYSTUDY_PG_PORT": str(pg_port), "HOME": str(home)}
    try:
        p = node_sh(env, "mlflow", str(port), "postgres", str(state / "artifacts"))
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
        uri = re.search(r"MLflow tracking server: (http://\S+)", p.stdout).group(1)
        yield SimpleNamespace(uri=uri, state=state, env=env, home=home, out=p.stdout + p.stderr, pg_port=pg_port)
    finally:
        node_sh(env, "stop-mlflow", timeout=60)
        node_sh(env, "stop-postgres", timeout=60)
        stop_postgres(state)
        shutil.rmtree(state, ignore_errors=True)


def test_the_head_runs_mlflow_on_its_own_postgresql_and_requires_credentials(server):
    import psutil

    assert f"store postgresql+psycopg2://mlflow@127.0.0.1:{server.pg_port}/mlflow" in server.out
    postmaster = psutil.Process(int((server.state / "postgres" / "postmaster.pid").read_text().split()[0]))
    assert postmaster.username() != "root"
    assert {c.laddr for c in postmaster.net_connections("tcp") if c.status == "LISTEN"} == {
        ("127.0.0.1", server.pg_port)
    }
    creds = exports(server.state / "mlflow-credentials")
    user, secret = creds["MLFLOW_TRACKING_USERNAME"], creds["MLFLOW_TRACKING_PASSWORD"]
    assert secret not in server.out and secret not in (server.state / "mlflow.log").read_text()
    for f in ("mlflow-credentials", "mlflow-auth.ini", "pgpass", "mlflow-server-key"):
        assert stat.S_IMODE((server.state / f).stat().st_mode) == 0o600, f

    def status(login=None):
        req = urllib.request.Request(server.uri + SEARCH)
        if login:
            req.add_header("Authorization", "Basic " + base64.b64encode(login.encode()).decode())
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code

    assert answers(server.uri + "/health") == 200  # what node.sh and the driver's check poll
    assert status() == 401
    assert status(f"{user}:not-{secret}") == 401
    assert status(f"{user}:{secret}") == 200
    assert status(f"{user}:not-{secret}") == 401  # a verified credential is kept, not its user's name

    # Every node's ~/raystudy.env gives a shell the credentials (the workers get the file from the head).
    p = node_sh(server.env, "env", "6379", server.uri.rsplit(":", 1)[1], "10.0.0.9")
    assert p.returncode == 0 and secret not in p.stdout, p.stdout + p.stderr
    p = subprocess.run(
        ["bash", "-c", "source ~/raystudy.env; echo $MLFLOW_TRACKING_USERNAME:$MLFLOW_TRACKING_PASSWORD"],
        env=server.env,
        capture_output=True,
        text=True,
    )
    assert p.stdout.strip() == f"{user}:{secret}"


def test_a_bad_store_is_refused_in_one_line(tmp_path):
    env = {**driver_env(), "RAYSTUDY_STATE": str(tmp_path)}  # a head where nothing has run yet
    for store, what in (
        ("mysql", "use sqlite, postgres or a database URI"),
        ("postgresql://mlflow:s3cret@db.example.com/mlflow", "names a secret"),
        ("postgresql://mlflow@db.example.com/mlflow", "no secret for postgresql://mlflow@db.example.com/mlflow"),
    ):
        p = node_sh(env, "mlflow", str(free_port()), store, str(tmp_path / "artifacts"))
        assert p.returncode == 2 and p.stderr.startswith("error: ") and what in p.stderr, p.stderr
        assert len(p.stderr.strip().splitlines()) == 1 and "s3cret" not in p.stderr
    assert not (tmp_path / "mlflow.pid").exists()  # nothing started


@pytest.mark.skipif(os.geteuid() != 0, reason="PostgreSQL runs as the postgres user only when node.sh runs as root")
def test_a_root_head_whose_state_the_postgres_user_cannot_reach_says_so_in_one_line(tmp_path):
    closed = Path(tempfile.mkdtemp(prefix="rspg", dir="/tmp"))  # mode 700, root's
    try:
        env = {**driver_env(), "RAYSTUDY_STATE": str(closed / "state"), "RAYSTUDY_PG_PORT": str(free_port())}
        p = node_sh(env, "mlflow", str(free_port()), "postgres", str(tmp_path / "artifacts"))
        assert p.returncode == 2 and p.stderr.startswith("error: the postgres user cannot reach"), p.stderr
        assert len(p.stderr.strip().splitlines()) == 1
        assert not (closed / "state" / "mlflow.pid").exists()  # nothing started
    finally:
        shutil.rmtree(closed, ignore_errors=True)


# Three grids at once, as the paper's experiments invite (ViT-B, ViT-L, ViT-H): different studies,
# conditions and datasets, so no trial of one is a trial of another.
GRIDS = {
    "raystudy-three-a": ("a", ["MHA", "LN2", "FC1"], "digits_c"),
    "raystudy-three-b": ("b", ["LN1", "FC2", "full"], "digits_c"),
    "raystudy-three-c": ("c", ["MHA", "LN2", "FC1"], "digits_blur"),
}


def test_three_grids_at_once_each_record_every_trial_once_in_their_own_experiment(
    server, tmp_path, demo_weights, shared_ray, monkeypatch
):
    """Three drivers started together against the head's server (four workers on PostgreSQL), each
    with its experiment and storage, with the credentials as on the head (~/raystudy.env exports
    them); they join one Ray, as drivers on a cluster's head do. The same command again records
    nothing twice; without the credentials, or with wrong ones, a driver refuses in one line."""

    creds = exports(server.state / "mlflow-credentials")
    env = driver_env(**creds)
    procs, cmds = {}, {}
    for exp, (study, conditions, dataset) in GRIDS.items():
        work = tmp_path / study
        work.mkdir()
        space = {
            **SPACE,
            "study": study,
            "base": {**SPACE["base"], "steps": 20, "eval_every": 10, "log_every": 5},
            "grid": {"condition": {"grid_search": conditions}, "lr": 0.1, "seed": 0},
            "datasets": {dataset: {}},
        }
        cmd = grid_cmd(write_space(work, space), shared_ray, "--tracking-uri", server.uri, "--experiment", exp)
        cmds[exp] = cmd = cmd + ["--storage", str(work / "ray")]
        procs[exp] = start(cmd, work, env=env)
    outs = {}
    for exp, proc in procs.items():
        try:
            proc.wait(timeout=540)
        finally:
            outs[exp] = output_of(proc)
        assert proc.returncode == 0, f"{exp}: {outs[exp]}"
    assert not list(tmp_path.glob("*/mlflow.db"))  # everything went to the server
    exp = next(iter(GRIDS))
    p = subprocess.run(cmds[exp], cwd=tmp_path / "a", capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0 and "all 3 trials are already done" in p.stdout, p.stdout[-3000:] + p.stderr[-3000:]
    wrong = {**creds, "MLFLOW_TRACKING_PASSWORD": "not-" + creds["MLFLOW_TRACKING_PASSWORD"]}
    for extra, said in (({}, "asks for credentials (HTTP 401)"), (wrong, "refuses the credentials given (HTTP 401)")):
        dry = [*cmds[exp], "--dry-run"]
        p = subprocess.run(
            dry, cwd=tmp_path / "a", capture_output=True, text=True, timeout=300, env=driver_env(**extra)
        )
        assert p.returncode == 2 and said in p.stderr and "Traceback" not in p.stderr, p.stdout + p.stderr
        assert p.stderr.strip().count("\n") == 0 and wrong["MLFLOW_TRACKING_PASSWORD"] not in p.stderr

    for k, v in creds.items():
        monkeypatch.setenv(k, v)
    parents, keys = {}, []
    for exp, (_study, conditions, dataset) in GRIDS.items():
        df = search_runs(server.uri, exp)
        assert set(df["status"]) == {"FINISHED"}, df[["status", "tags.mlflow.runName"]]  # nothing RUNNING
        trials, parent = df[df["tags.raystudy.role"] == "trial"], df[df["tags.raystudy.role"] == "grid"]
        assert sorted(trials["tags.mlflow.runName"]) == sorted(f"{c}·{dataset}·lr0.1·s0" for c in conditions)
        assert trials["tags.raystudy.key"].is_unique and set(trials["tags.raystudy.status"]) == {"finished"}
        # the grid's own parent, in its own experiment: no run of another grid in it
        assert len(parent) == 1 and set(trials["tags.mlflow.parentRunId"]) == {parent["run_id"].iloc[0]}
        parents[exp] = (parent["start_time"].iloc[0], parent["end_time"].iloc[0])
        keys += list(trials["tags.raystudy.key"])
    assert len(set(keys)) == 9  # no trial of one grid recorded as another's
    # they ran at the same time: every grid started before any of them ended
    assert max(s for s, _ in parents.values()) < min(e for _, e in parents.values()), parents

    # in the database: each experiment's runs, and no run of the three outside them
    rows = db_rows(
        server,
        "select e.name, count(*), count(distinct t.value) from runs r "
        "join experiments e on e.experiment_id = r.experiment_id "
        "join tags t on t.run_uuid = r.run_uuid and t.key = 'raystudy.key' "
        "join tags role on role.run_uuid = r.run_uuid and role.key = 'raystudy.role' and role.value = 'trial' "
        "where e.name like 'raystudy-three-%' group by e.name order by e.name",
    )
    assert rows == [(exp, 3, 3) for exp in GRIDS]
    rows = db_rows(  # read with the secret node.sh keeps in the head's pgpass
        server,
        "select distinct r.status from runs r join experiments e on e.experiment_id = r.experiment_id "
        "where e.name like 'raystudy-three-%'",
    )
    assert rows == [("FINISHED",)]

    # A driver on the head reads what is done from the server's database in one query, not
    # through the server's search (node.sh's raystudy.env names it); a database that is not the
    # server's (no such experiment there) leaves the answer to the search.
    from raystudy.tracking import connect, query

    cl = connect.client(server.uri)
    exp_id = cl.get_experiment_by_name(exp).experiment_id
    want = query.searched_statuses(cl, exp_id)
    assert len(want) == 3 and set(want.values()) == {"finished"}
    other = f"sqlite:///{tmp_path / 'not-the-servers.db'}"
    connect.client(other).search_experiments()  # an empty store of its own
    monkeypatch.setenv(query.STORE_ENV, other)
    assert query.statuses(cl, exp_id) == want
    monkeypatch.setenv(query.STORE_ENV, (server.state / "mlflow-store").read_text().strip())
    monkeypatch.setenv("PGPASSFILE", str(server.state / "pgpass"))
    searched = pd.DataFrame(query.rows(query.find_runs(cl, exp_id, raystudy__role="trial")))
    monkeypatch.setattr(query, "searched_statuses", None)  # from here on, SQL alone answers
    assert query.statuses(cl, exp_id) == want and query.known_statuses(server.uri, exp) == want
    # and so are the trial runs the report reads, whole
    monkeypatch.setattr(query, "find_runs", None)
    pd.testing.assert_frame_equal(pd.DataFrame(query.rows(query.trial_runs(cl, exp_id))), searched)
    # and their curves, in the order MLflow's call per run and key gives them
    ids, keys = list(searched["run_id"]), ["loss", "val_acc"]
    curves = {(r, k): [(m.step, m.value) for m in cl.get_metric_history(r, k)] for r in ids for k in keys}
    assert query.metric_histories(cl, ids, keys) == {rk: points for rk, points in curves.items() if points}


def test_postgres_started_again_on_another_port_while_it_runs_says_so_in_one_line(server):
    other = free_port()
    p = node_sh(server.env, "postgres", str(other))
    assert p.returncode == 2 and p.stdout == "", p.stdout + p.stderr
    assert len(p.stderr.splitlines()) == 1, p.stderr
    assert p.stderr.startswith(f"error: the head's PostgreSQL already runs on port {server.pg_port}, not {other}")
    assert "stop-postgres" in p.stderr, p.stderr
    same = node_sh(server.env, "postgres", str(server.pg_port))  # the port it runs on: its URI, as before
    assert same.returncode == 0 and same.stdout.strip().endswith(f"127.0.0.1:{server.pg_port}/mlflow"), same.stderr
