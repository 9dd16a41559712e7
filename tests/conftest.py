import os
import subprocess
import sys

import pytest
import torch

# Tests share the machine's 2 cores with Ray workers and helpers: keep torch to one thread each.
torch.set_num_threads(1)

_PRETRAIN: dict = {}


def pytest_sessionstart(session):
    """Build the demo backbone in the background while the first tests (which do not need it)
    run: on a fresh machine it is about a minute of one core's time, now off the critical path."""
    from raystudy import models

    if not models.weights_file("vit_demo").is_file():
        code = "from raystudy import pretrain; pretrain.ensure_weights('vit_demo', log=None)"
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        _PRETRAIN["proc"] = subprocess.Popen([sys.executable, "-c", code], env=env)


@pytest.fixture(scope="session")
def demo_weights():
    """The demo backbone (pretrained once on clean digits, cached across runs)."""
    from raystudy import pretrain

    proc = _PRETRAIN.pop("proc", None)
    if proc is not None:
        proc.wait()  # its file lock would make us wait anyway; this also reaps it
    return pretrain.ensure_weights("vit_demo")


@pytest.fixture(scope="session")
def _empty_mlflow_db(tmp_path_factory):
    """An MLflow SQLite store with its schema made once (its migrations take seconds)."""
    from mlflow import MlflowClient

    path = tmp_path_factory.mktemp("mlflow-template") / "mlflow.db"
    MlflowClient(tracking_uri=f"sqlite:///{path}").search_experiments()
    return path


@pytest.fixture()
def mlflow_uri(tmp_path, _empty_mlflow_db):
    """A fresh, empty MLflow store of this test's own: a copy of the session's template."""
    import shutil

    shutil.copy(_empty_mlflow_db, tmp_path / "mlflow.db")
    return f"sqlite:///{tmp_path}/mlflow.db"
