import os
import subprocess
import sys
from pathlib import Path

import pytest

_PRETRAIN: dict = {}
_SESSION: dict = {}


# What a user's study keeps in the checkout (the README's commands run there): no test may write
# into it, so the suite is safe to run next to a real study.
_REPO = Path(__file__).resolve().parents[1]
_STUDY_FILES = ("mlflow.db", "mlruns", "mlartifacts")


def _study_files() -> dict:
    seen = {}
    for name in _STUDY_FILES:
        p = _REPO / name
        if p.is_file():
            seen[name] = (p.stat().st_mtime_ns, p.stat().st_size)
        elif p.is_dir():
            seen[name] = sorted((str(q), q.stat().st_mtime_ns) for q in p.rglob("*"))
    return seen


def pytest_sessionfinish(session, exitstatus):
    """Fail the run if a test wrote into the checkout's MLflow store or artifact folders."""
    if hasattr(session.config, "workerinput") or "study_files" not in _SESSION:
        return
    before, after = _SESSION["study_files"], _study_files()
    changed = sorted(n for n in set(before) | set(after) if before.get(n) != after.get(n))
    if changed:
        _SESSION["stray"] = (
            f"the tests wrote into {', '.join(str(_REPO / n) for n in changed)}: a test used "
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
    _SESSION["study_files"] = _study_files()
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

    from drivers import hold_ray, release_ray

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


def _image_folder(root, n: int = 10, max_side: int = 400):
    """A DomainNet-like sketch domain under ``root``: two classes of ``n`` PNGs of assorted sizes."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for c in ("apple", "bus"):
        d = root / "domainnet" / "sketch" / c
        d.mkdir(parents=True)
        for i in range(n):
            h, w = int(rng.integers(150, max_side)), int(rng.integers(150, max_side))
            small = rng.integers(0, 256, (h // 16, w // 16, 3), dtype=np.uint8)
            Image.fromarray(small).resize((w, h), Image.BICUBIC).save(d / f"{i}.png")


@pytest.fixture()
def image_folder():
    """Writes a DomainNet-like image folder: ``image_folder(root, n=10, max_side=400)``."""
    return _image_folder


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
