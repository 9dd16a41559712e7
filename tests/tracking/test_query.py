"""tracking.query: what a resumed grid knows is done, read in one SQL query, as MLflow's search reads it."""

from raystudy.tracking import query
from raystudy.tracking.tags import KEY, ROLE, STATUS


def _store(uri):
    """Three experiments of trial runs, in the order they started; returns the client."""
    from mlflow import MlflowClient

    cl = MlflowClient(tracking_uri=uri)
    a, b, c = (cl.create_experiment(n) for n in ("a", "b", "c"))
    runs = [  # (experiment, role, key, status), oldest first
        (a, "trial", "k1", "finished"),
        (a, "trial", "k2", "running"),
        (a, "trial", "k2", "finished"),  # a rerun's record: the terminal one wins
        (a, "trial", "k3", "failed"),
        (a, "trial", "k3", "running"),  # neither terminal: the newest
        (a, "trial", "k4", "finished"),
        (a, "trial", "k4", "running"),
        (a, "grid", "k9", "finished"),  # a parent run is no trial
        (a, "trial", "k6", None),  # no status yet
        (b, "trial", "k7", "finished"),
        (c, "trial", "k8", "finished"),
    ]
    for t, (exp, role, key, status) in enumerate(runs):
        tags = {ROLE: role, KEY: key} | ({STATUS: status} if status else {})
        cl.create_run(exp, start_time=1_000 + t, tags=tags)
    gone = cl.create_run(a, start_time=2_000, tags={ROLE: "trial", KEY: "k5", STATUS: "finished"})
    cl.delete_run(gone.info.run_id)
    cl.delete_experiment(c)
    return cl, a


def test_the_sql_read_of_what_is_done_is_mlflows_search_of_it(tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cl, a = _store(uri)
    want = {"k1": "finished", "k2": "finished", "k3": "running", "k4": "finished", "k6": None}
    assert query.searched_statuses(cl, a) == want  # MLflow's search
    monkeypatch.setattr(query, "searched_statuses", None)  # from here on, SQL alone answers
    assert query.statuses(cl, a) == want
    assert query.known_statuses(uri, "a") == want
    assert query.known_statuses(uri, "b") == {"k7": "finished"}
    assert query.known_statuses(uri, "c") == {} and query.known_statuses(uri, "none") == {}  # deleted, missing


def test_a_store_not_made_yet_is_not_made_by_reading_it(tmp_path):
    db = tmp_path / "mlflow.db"
    assert query.known_statuses(f"sqlite:///{db}", "a") == {} and not db.exists()


def test_a_schema_the_sql_does_not_know_is_read_by_mlflows_search(tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cl, a = _store(uri)
    monkeypatch.setattr(query, "_STATUSES_SQL", "SELECT key, value FROM tags_of_another_mlflow")
    assert query._sql_statuses(uri, "1 = 1") is None
    assert query.known_statuses(uri, "b") == {"k7": "finished"}
    assert query.statuses(cl, a)["k3"] == "running"
