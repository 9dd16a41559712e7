"""Snapshots of the cluster's MLflow store (cluster/node.sh): taken while MLflow writes, the newest N
kept, and restored into a new head's empty store before MLflow starts.

The end-to-end tests run the real thing: `node.sh mlflow` (a real `mlflow server` behind its basic-auth
app, on SQLite or on a PostgreSQL server of the test's own), a writer logging runs through it while
snapshots are taken (SQLite's online backup API, pg_dump), then a second, empty head restoring the
newest snapshot (pg_restore for PostgreSQL) and its server reading the runs back. The bucket is a
folder, or S3's API as moto's server answers it to the real `aws` CLI."""

import json
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

from tests.commands.test_grid_ray import SPACE, grid_cmd, write_space
from tests.helpers import driver_env, free_port, wait_for
from tests.test_cluster import exports
from tests.test_cluster_tracking import PG_CTL, node_sh, stop_postgres

REPO = Path(__file__).resolve().parent.parent
RESTORED = re.compile(r"^restored MLflow's store from the snapshot (\S+)$", re.M)

# Logs runs through the tracking server until told to stop; each finished run's id goes to a file.
WRITER = """
import sys
from pathlib import Path
from mlflow import MlflowClient
from mlflow.entities import Metric

done, stop = Path(sys.argv[1]), Path(sys.argv[2])
client = MlflowClient()
exp = client.create_experiment("backups")
i = 0
while not stop.exists():
    run = client.create_run(exp, run_name=f"run{i}")
    rid = run.info.run_id
    client.log_batch(rid, metrics=[Metric("loss", 1.0 / (s + 1), 0, s) for s in range(50)])
    client.log_param(rid, "i", str(i))
    client.set_terminated(rid)
    with done.open("a") as f:
        f.write(rid + "\\n")
    i += 1
"""


def one_line_error(p: subprocess.CompletedProcess, what: str) -> None:
    assert p.returncode == 2 and p.stderr.startswith("error: ") and what in p.stderr, p.stdout + p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr


# ---------------------------------------------------------------- bad input, offline


def test_bad_backup_settings_are_refused_in_one_line(tmp_path):
    env = {**driver_env(), "RAYSTUDY_STATE": str(tmp_path / "state"), "HOME": str(tmp_path)}
    for var, value, what in (
        ("RAYSTUDY_BACKUP_KEEP", "0", "RAYSTUDY_BACKUP_KEEP=0: use how many snapshots to keep, 1 or more"),
        ("RAYSTUDY_BACKUP_KEEP", "a few", "use how many snapshots to keep"),
        ("RAYSTUDY_BACKUP_MINUTES", "0", "RAYSTUDY_BACKUP_MINUTES=0: use minutes between snapshots"),
        ("RAYSTUDY_BACKUP_MINUTES", "hourly", "use minutes between snapshots, a number above 0"),
    ):
        for args in (("mlflow", str(free_port()), "sqlite", str(tmp_path / "art"), str(tmp_path / "b")), ("snapshot",)):
            one_line_error(node_sh({**env, var: value}, *args), what)
    assert not (tmp_path / "state" / "mlflow.pid").exists()  # nothing started
    # a snapshot or a restore before MLflow ever ran on this head: nothing to copy, nowhere to put it
    one_line_error(node_sh(env, "snapshot"), "no mlflow-store in")
    one_line_error(node_sh(env, "restore"), "no mlflow-store in")


def test_a_restore_by_hand_never_overwrites_a_store_nor_a_snapshot_copies_an_empty_one(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    db = state / "mlflow.db"
    sqlite3.connect(db).execute("create table t (x)").connection.close()
    (state / "mlflow-store").write_text(f"sqlite:///{db}\n")
    (state / "mlflow-backups").write_text(f"{tmp_path / 'bucket'}\n")
    before = db.read_bytes()
    p = node_sh({**driver_env(), "RAYSTUDY_STATE": str(state)}, "restore")
    one_line_error(p, "is not empty: stop MLflow and move it aside first")
    assert db.read_bytes() == before
    # nor is an empty store's snapshot ever the newest, the one a new head would restore
    db.unlink()
    p = node_sh({**driver_env(), "RAYSTUDY_STATE": str(state)}, "snapshot")
    one_line_error(p, "is empty: nothing to snapshot")
    assert not db.exists() and not (tmp_path / "bucket").exists()


def test_both_cluster_files_back_the_store_up_off_the_head():
    import yaml

    aws = yaml.safe_load((REPO / "cluster.yaml").read_text())
    assert any(
        "node.sh mlflow" in c and c.endswith('"$RAYSTUDY_STORAGE/mlflow-backups"')
        for c in aws["head_start_ray_commands"]
    )
    local = yaml.safe_load((REPO / "cluster.local.yaml").read_text())
    assert len(local["metadata"]["mlflow"].split()) == 7  # bash node.sh mlflow PORT STORE ARTIFACTS BACKUPS
    # the head's packages take the store's snapshots: pg_dump with a managed database too
    setup = " ".join(aws["head_setup_commands"])
    assert "postgresql://*) pkg=postgresql-client" in setup


# ---------------------------------------------------------------- a store, snapshotted and restored


def start_head(state: Path, store: str, backups: str, **extra) -> tuple[str, str, dict]:
    """`node.sh mlflow` on a state folder: (the server's URI, what it printed, its environment)."""
    env = {
        **driver_env(),
        "RAYSTUDY_STATE": str(state),
        "HOME": str(state.parent / "home"),
        "RAYSTUDY_PG_PORT": str(free_port()),
        **extra,
    }
    p = node_sh(env, "mlflow", str(free_port()), store, str(state / "artifacts"), backups)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    uri = re.search(r"MLflow tracking server: (http://\S+)", p.stdout).group(1)
    return uri, p.stdout + p.stderr, env


def stop_head(env: dict) -> None:
    """The head's MLflow, its snapshot loop and its PostgreSQL, stopped (by their pid files)."""
    node_sh(env, "stop-mlflow", timeout=120)
    node_sh(env, "stop-postgres", timeout=60)
    stop_postgres(Path(env["RAYSTUDY_STATE"]))


def client_env(state: Path, uri: str) -> dict:
    """A shell on the head: the tracking server's address and the credentials it made."""
    # driver_env drops an inherited tracking URI: this one is set after it
    return {**driver_env(**exports(state / "mlflow-credentials")), "MLFLOW_TRACKING_URI": uri}


def read_runs(state: Path, uri: str) -> dict[str, tuple[str, str, list[float]]]:
    """Every run of the experiment "backups" in the head's server: id -> (name, status, loss curve)."""
    script = (
        "import json; from mlflow import MlflowClient\n"
        "c = MlflowClient(); e = c.get_experiment_by_name('backups')\n"
        "print(json.dumps({r.info.run_id: (r.info.run_name, r.info.status,"
        " [m.value for m in c.get_metric_history(r.info.run_id, 'loss')])"
        " for r in c.search_runs([e.experiment_id], max_results=10000)}))"
    )
    p = subprocess.run(
        [sys.executable, "-c", script],
        env=client_env(state, uri),
        cwd=state,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-3000:]

    return {k: tuple(v) for k, v in json.loads(p.stdout.strip().splitlines()[-1]).items()}


def kept(folder: Path, kind: str, state: Path | None = None) -> list[str]:
    """The snapshots in ``folder``; with the head's ``state``, read while no snapshot is being taken
    (node.sh's lock): between a new one's move and the prune, the folder holds one more."""
    if state is None:
        return sorted(f.name for f in folder.glob(f"mlflow-*.{kind}"))
    import fcntl

    with open(state / "snapshot.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return sorted(f.name for f in folder.glob(f"mlflow-*.{kind}"))


@pytest.fixture
def short_tmp():
    # Short (PostgreSQL's socket lives in its data folder) and open to the postgres user when we are root.
    d = Path(tempfile.mkdtemp(prefix="rsbk", dir="/tmp"))
    d.chmod(0o711)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.xdist_group("cluster_backups")
@pytest.mark.parametrize("store", ["sqlite", "postgres"])
def test_snapshots_taken_while_mlflow_writes_restore_into_a_new_heads_empty_store(store, short_tmp):
    if store == "postgres" and PG_CTL is None:
        pytest.skip("no PostgreSQL server programs (pg_ctl): apt-get install -y postgresql (.ci/run installs it)")
    kind = {"sqlite": "sqlite.gz", "postgres": "pgdump"}[store]
    bucket, old, new = short_tmp / "bucket", short_tmp / "old", short_tmp / "new"
    # the schedule in seconds, so the loop's snapshots show within the test
    settings = {"RAYSTUDY_BACKUP_MINUTES": "0.05", "RAYSTUDY_BACKUP_KEEP": "3"}
    envs = []
    writer = None
    try:
        uri, out, env = start_head(old, store, str(bucket), **settings)
        envs.append(env)
        assert f"no snapshot (*.{kind}) in {bucket} to restore" in out  # a first head: nothing to restore
        assert f"Snapshots of the store: every 0.05 minutes to {bucket}, the newest 3 kept" in out
        done, stop = short_tmp / "done", short_tmp / "stop"
        writer = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(done), str(stop)],
            env=client_env(old, uri),
            cwd=short_tmp,
            stderr=subprocess.PIPE,
            text=True,
        )
        finished = lambda: done.read_text().split() if done.exists() else []  # noqa: E731
        wait_for(lambda: len(finished()) >= 3 or writer.poll() is not None, timeout=300, what="the writer's first runs")
        # on the schedule, while the writer writes: more than three taken, the newest three kept
        log = old / "backups.log"
        wait_for(
            lambda: log.exists() and len(log.read_text().splitlines()) >= 4,
            timeout=120,
            what="four scheduled snapshots",
        )
        assert len(kept(bucket, kind, old)) == 3  # the loop snapshots on: read between two
        # and by hand (what the docs say to run when a grid ends), still while the writer writes
        before = finished()
        p = node_sh(env, "snapshot")
        assert p.returncode == 0 and p.stdout.startswith("snapshot of MLflow's store: "), p.stdout + p.stderr
        assert "(3 kept, the newest 3)" in p.stdout
        stop.touch()
        assert writer.wait(timeout=120) == 0, writer.stderr.read()[-3000:]
        assert "failed" not in log.read_text() and log.read_text().count("snapshot of MLflow's store") >= 4
        everything = read_runs(old, uri)
        assert set(finished()) == set(everything)
        stop_head(env)  # the loop too
        assert not (old / "backups.pid").exists()
        snapshots = kept(bucket, kind)
        assert len(snapshots) == 3

        # A new head, its store empty: the newest snapshot, restored before MLflow starts, in one line.
        uri, out, env = start_head(new, store, str(bucket))
        envs.append(env)
        assert RESTORED.findall(out) == [str(bucket / snapshots[-1])], out
        restored = read_runs(new, uri)
        assert set(before) <= set(restored) <= set(everything)  # every run finished before the snapshot
        for rid in before:
            assert restored[rid] == everything[rid]  # its name, status and whole curve
            assert restored[rid][1] == "FINISHED" and len(restored[rid][2]) == 50
        # and MLflow on the restored store takes new runs
        p = subprocess.run(
            [
                sys.executable,
                "-c",
                "import mlflow; mlflow.set_experiment('backups'); mlflow.start_run().info; mlflow.end_run()",
            ],
            env=client_env(new, uri),
            cwd=short_tmp,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert p.returncode == 0, p.stderr[-3000:]
        assert len(read_runs(new, uri)) == len(restored) + 1
        # a restart of the same head restores nothing: its store is no longer empty
        uri, out, env = start_head(new, store, str(bucket), RAYSTUDY_PG_PORT=env["RAYSTUDY_PG_PORT"])
        assert not RESTORED.search(out) and "to restore" not in out, out
        assert not list(short_tmp.glob("mlflow.db")) and not list(old.glob("**/mlruns"))  # all through the servers
    finally:
        if writer is not None and writer.poll() is None:
            writer.kill()
        for env in envs:
            stop_head(env)


@pytest.fixture
def s3():
    """S3's API on 127.0.0.1 (moto's server) and a new bucket in it: (the environment that points the
    real ``aws`` CLI at it, ``s3://BUCKET``)."""
    pytest.importorskip("moto.server", reason="moto's S3 server (pip install 'moto[server]')")
    if shutil.which("aws") is None:
        pytest.skip("no aws CLI (pip install awscli)")
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        aws = {
            "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-west-2",
        }
        # moto's servers in one process share their buckets: each test makes its own
        bucket = f"s3://raystudy-test-{uuid.uuid4().hex[:12]}"
        subprocess.run(["aws", "s3", "mb", bucket], env=driver_env(**aws), check=True, capture_output=True)
        yield aws, bucket
    finally:
        server.stop()


@pytest.mark.slow
def test_snapshots_go_to_s3_through_the_aws_cli_and_come_back(tmp_path, s3):
    aws, bucket = s3
    env = driver_env(**aws, RAYSTUDY_BACKUP_KEEP="2")
    dest = f"{bucket}/raystudy/mlflow-backups"
    old, new = tmp_path / "old", tmp_path / "new"
    for state in (old, new):  # what `node.sh mlflow` records: the store and where its snapshots go
        state.mkdir()
        (state / "mlflow-store").write_text(f"sqlite:///{state / 'mlflow.db'}\n")
        (state / "mlflow-backups").write_text(dest + "\n")
    conn = sqlite3.connect(old / "mlflow.db")
    conn.execute("create table runs (id)")
    for i in range(3):
        conn.execute("insert into runs values (?)", (i,))
        conn.commit()
        p = node_sh({**env, "RAYSTUDY_STATE": str(old)}, "snapshot")
        assert p.returncode == 0 and f"snapshot of MLflow's store: {dest}/mlflow-" in p.stdout, p.stderr
    conn.close()
    listing = subprocess.run(["aws", "s3", "ls", dest + "/"], env=env, capture_output=True, text=True).stdout
    assert len(re.findall(r"mlflow-\S+Z\.sqlite\.gz", listing)) == 2, listing  # the newest two
    p = node_sh({**env, "RAYSTUDY_STATE": str(new)}, "restore")
    assert p.returncode == 0 and RESTORED.search(p.stdout), p.stdout + p.stderr
    assert sqlite3.connect(new / "mlflow.db").execute("select count(*) from runs").fetchone() == (3,)
    # a bucket the head cannot read is one line, not an empty store taken for a new study
    (new / "mlflow.db").unlink()
    (new / "mlflow-backups").write_text("s3://no-such-bucket-raystudy/x\n")
    one_line_error(node_sh({**env, "RAYSTUDY_STATE": str(new)}, "restore"), "cannot list the snapshots in")
    assert not (new / "mlflow.db").exists()


@pytest.mark.slow
def test_a_grid_that_ends_on_the_head_takes_one_snapshot_of_the_store_to_the_bucket(
    short_tmp, s3, demo_weights, shared_ray
):
    """On a head (``node.sh env`` without HEAD_IP, ``node.sh mlflow`` backing up to s3://), the grid's
    driver runs the RAYSTUDY_SNAPSHOT_CMD the head's environment gives it once, as the grid ends: one
    line, and the snapshot holds every trial the grid recorded, finished."""
    aws, bucket = s3
    dest = f"{bucket}/raystudy/mlflow-backups"
    state, work, new = short_tmp / "head", short_tmp / "work", short_tmp / "new"
    # the head's loop keeps 3 (its schedule far off): the driver's snapshot keeps as many
    uri, out, env = start_head(state, "sqlite", dest, **aws, RAYSTUDY_BACKUP_KEEP="3")
    try:
        assert "no snapshot (*.sqlite.gz)" in out
        Path(env["HOME"]).mkdir(exist_ok=True)
        p = node_sh(env, "env", "6379", uri.rsplit(":", 1)[1])  # the head's own: no HEAD_IP
        assert p.returncode == 0, p.stderr
        shell = 'source ~/raystudy.env; printf %s "$RAYSTUDY_SNAPSHOT_CMD"'
        cmd = subprocess.run(["bash", "-c", shell], env=env, capture_output=True, text=True).stdout
        assert cmd.endswith("cluster/node.sh snapshot"), cmd
        work.mkdir()
        space = {**SPACE, "grid": {**SPACE["grid"], "lr": 0.1}}  # MHA and LN2: two trials
        grid = grid_cmd(write_space(work, space), shared_ray, "--tracking-uri", uri, "--storage", str(work / "ray"))
        driver = {**client_env(state, uri), **aws, "RAYSTUDY_SNAPSHOT_CMD": cmd}  # a shell on the head
        p = subprocess.run(grid, cwd=work, env=driver, capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
        said = [ln for ln in p.stdout.splitlines() if "snapshot" in ln]
        assert len(said) == 1 and p.stdout.strip().splitlines()[-1] == said[0], p.stdout[-3000:]
        m = re.fullmatch(
            rf"snapshot of MLflow's store: ({re.escape(dest)}/mlflow-\S+Z\.sqlite\.gz) \(1 kept, the newest 3\)",
            said[0],
        )
        assert m, said

        # the snapshot, restored into a new head's empty store: the grid's runs, all ended
        new.mkdir()
        (new / "mlflow-store").write_text(f"sqlite:///{new / 'mlflow.db'}\n")
        (new / "mlflow-backups").write_text(dest + "\n")
        p = node_sh({**driver_env(**aws), "RAYSTUDY_STATE": str(new)}, "restore")
        assert RESTORED.findall(p.stdout) == [m.group(1)], p.stdout + p.stderr
        db = sqlite3.connect(new / "mlflow.db")
        try:
            rows = db.execute(
                "select r.name, r.status from runs r join tags t on t.run_uuid = r.run_uuid "
                "where t.key = 'raystudy.role' and t.value = 'trial' order by r.name"
            ).fetchall()
            running = db.execute("select count(*) from runs where status = 'RUNNING'").fetchone()[0]
        finally:
            db.close()
        assert rows == [("LN2·digits_c·lr0.1·s0", "FINISHED"), ("MHA·digits_c·lr0.1·s0", "FINISHED")]
        assert running == 0  # the grid's parent run had ended too
    finally:
        stop_head(env)
