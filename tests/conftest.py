import os
import subprocess
import sys

import pytest

from tests.helpers import REPO, domainnet_folder, study_files

_PRETRAIN: dict = {}
_SESSION: dict = {}


# What a user's study keeps in the checkout (the README's commands run there): no test may write
# into it, so the suite is safe to run next to a real study.
def pytest_sessionfinish(session, exitstatus):
    """Fail the run if a test wrote into the checkout's MLflow store or artifact folders."""
    if hasattr(session.config, "workerinput") or "study_files" not in _SESSION:
        return
    before, after = _SESSION["study_files"], study_files(REPO)
    changed = sorted(n for n in set(before) | set(after) if before.get(n) != after.get(n))
    if changed:
        _SESSION["stray"] = (
            f"the tests wrote into {', '.join(str(REPO / n) for n in changed)}: a test used "
            "the working directory's MLflow store; give it its own (tmp_path)"
        )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter):
    if "stray" in _SESSION:
        terminalreporter.write_line(_SESSION["stray"], red=True, bold=True)


def pytest_configure(config):
    """Tests share the machine's 2 cores with Ray workers and helpers: torch gets one thread in
    each process that runs tests. xdist's controller runs none: it never imports torch (seconds)."""
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        return
    import torch

    torch.set_num_threads(1)


def pytest_sessionstart(session):
    """In the controller: note the checkout's study files, and build the demo backbone in the
    background while the first tests (which do not need it) run: on a fresh machine it is about a
    minute of one core's time, now off the critical path."""
    from raystudy.models import registry

    if hasattr(session.config, "workerinput"):  # an xdist worker: the controller does both
        return
    _SESSION["study_files"] = study_files(REPO)
    if session.config.getoption("markexpr", "") == "gpu":  # the GPU machine's run needs no demo
        return
    if not registry.weights_file("vit_demo").is_file():
        code = "from raystudy.train import pretrain; pretrain.ensure_weights('vit_demo', log=None)"
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        _PRETRAIN["proc"] = subprocess.Popen([sys.executable, "-c", code], env=env)


@pytest.fixture(scope="session")
def demo_weights():
    """The demo backbone (pretrained once on clean digits, cached across runs)."""
    from raystudy.train import pretrain

    proc = _PRETRAIN.pop("proc", None)
    if proc is not None:
        proc.wait()  # its file lock would make us wait anyway; this also reaps it
    return pretrain.ensure_weights("vit_demo")


@pytest.fixture(scope="session")
def shared_ray():
    """``--address`` of a local Ray that this test process's drivers share, for tests about what a
    driver does rather than the Ray it starts: a Ray start is about 10 s of the machine's two cores
    per driver. Tests of a driver's own Ray (its ports, its temp dir, its dashboard) start their own."""
    import shutil
    import tempfile

    from tests.helpers import hold_ray, release_ray

    ray_tmp = tempfile.mkdtemp(prefix="rs", dir="/tmp")  # Ray's sockets need a short path
    proc, address = hold_ray(ray_tmp)
    yield ["--address", address]
    release_ray(proc)
    shutil.rmtree(ray_tmp, ignore_errors=True)


@pytest.fixture()
def ctrl_c():
    """Ctrl-C raising KeyboardInterrupt in this process for the test (Python's default handler),
    the handler before restored after: a suite started with SIGINT ignored (a background job of a
    shell without job control) has none, and a test of what Ctrl-C does needs it."""
    import signal

    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


@pytest.fixture()
def ray_tmp():
    """A temp dir for a Ray of the test's own (short: Ray's sockets live there)."""
    import shutil
    import tempfile

    path = tempfile.mkdtemp(prefix="rs", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)


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


@pytest.fixture()
def image_folder():
    """Writes a DomainNet-like image folder: ``image_folder(root, n=10, max_side=400)``."""
    return domainnet_folder


# The training tests' trial: the demo ViT from random init, 12 steps of 32 images on digits_c,
# evaluated at steps 6 and 12: seconds on one core.
FAST = dict(
    model="vit_demo",
    pretrained=False,
    dataset="digits_c",
    steps=12,
    warmup_steps=2,
    batch_size=32,
    eval_every=6,
    log_every=3,
    eval_batch_size=512,
)


@pytest.fixture()
def fast_config():
    """Builds the ``FinetuneConfig`` of a trial that trains in seconds: ``fast_config(**changes)``, ``FAST``
    with ``changes``. A test module whose trials differ overrides this fixture with its own settings
    (``functools.partial(fast_config, ...)``)."""
    from raystudy.train.config import FinetuneConfig

    def make(**changes):
        return FinetuneConfig(**{**FAST, **changes})

    return make


@pytest.fixture()
def small_disk(tmp_path):
    """A 48 MiB tmpfs at ``tmp_path/disk``, unmounted after the test; skipped where mount is not permitted."""
    import shutil
    import subprocess

    disk = tmp_path / "disk"
    disk.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount command here")
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(disk)], capture_output=True, text=True)
    if p.returncode != 0:
        pytest.skip(f"cannot mount a small filesystem here: {p.stderr.strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)
