"""What the test files share, in one place: driving raystudy's command lines (a clean environment,
a process group of their own, polling a store until something has happened, killing what a driver
started, a Ray and an MLflow server to share), the MLflow runs of an experiment, free ports, and
test inputs (class folders of generated images, a tiny ViT, a disk filled to its last byte).
Fixtures are in conftest.py."""

import errno
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

# The checkout: what the tests run, read and start their commands in
REPO = Path(__file__).resolve().parents[1]


def class_folders(
    root: Path,
    classes=("cat", "dog", "eel"),
    n: int = 8,
    size: int | tuple[int, int] = 16,
    start: int = 0,
    spread: int = 60,
    step: int = 90,
) -> Path:
    """``n`` random RGB PNGs per class under ``root/<class>/``, numbered from ``start`` (also the seed).
    An int ``size``: ``size``x``size`` noise, class ``c``'s pixels in [c * step, c * step + spread), so
    the classes differ in brightness. A ``(low, high)`` size: photo-like images of assorted sides in
    [low, high), smooth (a 16 times smaller noise enlarged bicubically), as a dataset's files are.
    ``root``."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(start)
    for c, name in enumerate(classes):
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(start, start + n):
            if isinstance(size, int):
                img = Image.fromarray((rng.random((size, size, 3)) * spread + c * step).astype("uint8"))
            else:
                h, w = int(rng.integers(*size)), int(rng.integers(*size))
                small = rng.integers(0, 256, (h // 16, w // 16, 3), dtype=np.uint8)
                img = Image.fromarray(small).resize((w, h), Image.BICUBIC)
            img.save(root / name / f"{i}.png")
    return root


def domainnet_folder(root: Path, n: int = 10, max_side: int = 400) -> Path:
    """A DomainNet-like sketch domain under ``root``: two classes of ``n`` photo-like PNGs with sides
    in [150, ``max_side``). ``root``."""
    class_folders(root / "domainnet" / "sketch", ("apple", "bus"), n=n, size=(150, max_side))
    return root


def study_files(repo: Path, names=("mlflow.db", "mlruns", "mlartifacts")) -> dict:
    """What a user's study keeps in the checkout ``repo`` (its MLflow store and artifact folders), as
    file times and sizes: two readings differ when something wrote there."""
    seen = {}
    for name in names:
        p = repo / name
        if p.is_file():
            seen[name] = (p.stat().st_mtime_ns, p.stat().st_size)
        elif p.is_dir():
            seen[name] = sorted((str(q), q.stat().st_mtime_ns) for q in p.rglob("*"))
    return seen


def tiny_vit(**kw):
    """A random-init timm ViT small enough for any test: 16x16 grey images, 2 blocks of width 32, 10 classes."""
    from timm.models.vision_transformer import VisionTransformer

    return VisionTransformer(
        img_size=16, patch_size=4, in_chans=1, embed_dim=32, depth=2, num_heads=2, num_classes=10, **kw
    )


def fill(disk: Path) -> None:
    """Take every free byte of ``disk``: a file written until the filesystem refuses."""
    fd = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        for size in (1 << 20, 1 << 12, 1):
            try:
                while True:
                    os.write(fd, b"\0" * size)
            except OSError as e:
                assert e.errno == errno.ENOSPC, e
    finally:
        os.close(fd)


def driver_env(**extra) -> dict:
    """The test's environment for a driver: no tracking URI or Ray address inherited from the
    developer's shell, Ray's token auth off (tests start throwaway local clusters)."""
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONUNBUFFERED": "1", **extra}
    env.pop("MLFLOW_TRACKING_URI", None)
    env.pop("RAY_ADDRESS", None)
    return env


# A Ray for drivers to share: started as a user's notebook starts one, held until stdin closes.
# No prestarted workers: Ray prestarts them for the first driver's job (this holder's), which runs
# no task, and each idle one costs about 0.7 s of CPU a minute (4.0 vs 2.25 CPU-s a minute in all).
_HOLD_RAY = """
import sys, ray
ray.init(num_cpus=2, _temp_dir=sys.argv[1], include_dashboard=False, log_to_driver=False,
         configure_logging=False,
         _system_config={"prestart_worker_first_driver": False, "enable_worker_prestart": False})
print(ray.get_runtime_context().gcs_address, flush=True)
sys.stdin.read()
"""


def hold_ray(temp_dir: str) -> tuple[subprocess.Popen, str]:
    """A local two-CPU Ray in a session of its own, for drivers to join with ``--address``; the
    process that holds it, and its address. It ends when that process's stdin is closed."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLD_RAY, temp_dir],
        env=driver_env(),
        text=True,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    address = proc.stdout.readline().strip()
    if not address:
        kill_group(proc)
        raise RuntimeError(f"the shared Ray did not start (exit {proc.wait()})")
    return proc, address


def release_ray(proc: subprocess.Popen) -> None:
    """End a ``hold_ray`` Ray: its holder shuts it down, or its whole session is killed."""
    proc.stdin.close()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        pass
    kill_group(proc)


def ctrl_c_default() -> None:
    """Ctrl-C (SIGINT) back to its default, in a child about to start (``preexec_fn``): a suite
    started with it ignored (a background job of a shell without job control) hands the ignore
    down, and Python then installs no KeyboardInterrupt, so a driver would not hear the test's
    Ctrl-C. A user's ignore is the driver's to honour; a test's Ctrl-C is the test's to make."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(cmd, cwd, stdout=subprocess.PIPE, env=None) -> subprocess.Popen:
    """``cmd`` in a session of its own, so that ``kill_group`` also ends the Ray it started, with
    Ctrl-C at its default (``ctrl_c_default``) whatever the suite inherited."""
    return subprocess.Popen(
        cmd,
        cwd=cwd,
        env=env or driver_env(),
        stdout=stdout,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=ctrl_c_default,
    )


def wait_for(ready, proc=None, timeout=300, every=0.5, what: str | None = None):
    """Call ``ready()`` every ``every`` s until it returns something true, ``proc`` ends or
    ``timeout`` passes; its last value. An exception counts as not ready (the store may not
    exist yet). With ``what``, not ready in time raises AssertionError naming it (and the last
    exception) instead."""
    deadline, value, error = time.time() + timeout, None, None
    while time.time() < deadline and (proc is None or proc.poll() is None):
        time.sleep(every)
        try:
            value, error = ready(), None
        except Exception as e:  # noqa: BLE001 - not there yet
            value, error = None, e
        if value:
            return value
    if what is not None:
        raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}") from error
    return value


def kill_group(proc, grace=0.0, sig=signal.SIGKILL) -> None:
    """After ``grace`` seconds (Ray's processes notice their driver's end), end ``proc``'s group."""
    time.sleep(grace)
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def output_of(proc, tail=4000) -> str:
    """The end of what ``proc`` printed, ending its group first if it still runs: a test that gave
    up waiting shows what the driver was doing."""
    if proc.poll() is None:
        kill_group(proc)
    try:
        return proc.communicate(timeout=30)[0][-tail:]
    except (subprocess.TimeoutExpired, ValueError):  # a grandchild holds the pipe; stdout consumed
        return ""


def checkpoint_steps(files) -> dict[int, float]:
    """Step -> file time of each whole checkpoint among ``files`` (``state.pt`` paths); one still
    being written, or pruned as it is read, does not load and is no checkpoint yet."""
    import torch

    steps = {}
    for f in files:
        try:
            steps[int(torch.load(f, map_location="cpu", weights_only=True)["step"])] = f.stat().st_mtime
        except Exception:  # noqa: BLE001 - partly written, or gone
            continue
    return steps


def ctrl_c_twice(proc, timeout=120) -> str:
    """What a user's Ctrl+C twice does (the second skips Tune's graceful stop); the output. The
    second comes once the driver has said that the first is being handled: sooner, two signals
    that arrive before Python runs its handler count as one; later, a quick graceful stop may
    already be over (seen on a loaded machine, with the 0.5 s wait this had before)."""
    import threading

    lines: list[str] = []
    handled = threading.Event()

    def read():
        for line in proc.stdout:
            lines.append(line)
            if "Ctrl-C again" in line:  # the driver's line for Tune's first-Ctrl-C warning
                handled.set()
        handled.set()  # the output ended

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    proc.send_signal(signal.SIGINT)
    handled.wait(timeout)
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=timeout)
    finally:
        reader.join(timeout=30)
    return "".join(lines)


def running_workers(uri: str, experiment: str) -> list[int]:
    """The worker processes of the trial runs still RUNNING that have reported (their
    ``raystudy.worker`` tags)."""
    df = search_runs(uri, experiment)
    if "tags.raystudy.worker" not in df:
        return []
    running = df[(df["status"] == "RUNNING") & df["tags.raystudy.worker"].notna()]
    return [int(w.rsplit(":", 1)[1]) for w in running["tags.raystudy.worker"]]


def freeze_running_trials(uri: str, experiment: str) -> list[int]:
    """Pause (SIGSTOP) the ``running_workers``; their pids. Tune's graceful stop then waits for
    them (5 s, then it kills them): a second Ctrl-C sent once the first is handled surely comes
    while Tune's run is still stopping, as it does when a real trial takes seconds to end.
    ``thaw`` them afterwards."""
    pids = running_workers(uri, experiment)
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    return pids


def thaw(pids) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:  # ended with its driver
            pass


def count_status(db, *statuses: str) -> int:
    """Trial runs in the SQLite store ``db`` whose raystudy status is one of ``statuses``; read
    only, so that polling never creates or locks a store a driver is creating (0 until it exists)."""
    import sqlite3

    if not Path(db).exists():
        return 0
    marks = ", ".join("?" * len(statuses))
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1) as c:
            return c.execute(
                f"select count(*) from tags where key='raystudy.status' and value in ({marks})", statuses
            ).fetchone()[0]
    except sqlite3.Error:
        return 0


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def search_runs(uri: str, experiment: str):
    """Every run of ``experiment`` in the store at ``uri`` (MLflow's global URI left as it was).

    Never creates a SQLite store (FileNotFoundError until the driver has), and opens one under
    raystudy's lock: a store being created by the driver at that moment is left to it."""
    import mlflow

    from raystudy.tracking import connect

    db = connect.sqlite_path(uri)
    if db is not None and not db.is_file():
        raise FileNotFoundError(uri)
    connect.client(uri)
    mlflow.set_tracking_uri(uri)
    try:
        return mlflow.search_runs(experiment_names=[experiment])
    finally:
        mlflow.set_tracking_uri(None)


def experiment_runs(client, experiment: str, filter_string: str = "") -> list:
    """The runs (MLflow ``Run`` objects, at most 1000) of ``experiment`` that match ``filter_string``,
    read through ``client``; ``search_runs`` gives them as a DataFrame."""
    exp = client.get_experiment_by_name(experiment)
    return client.search_runs([exp.experiment_id], filter_string, max_results=1000)


def mlflow_server(tmp: Path, port: int) -> subprocess.Popen:
    """A real ``mlflow server`` on 127.0.0.1:``port`` over the SQLite store ``tmp/server.db``, started
    in a session of its own (``kill_group`` ends it); the caller waits for its /health."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
            "--backend-store-uri",
            f"sqlite:///{tmp}/server.db",
            "--artifacts-destination",
            str(tmp / "artifacts"),
        ],
        cwd=tmp,
        env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def hosts_module():
    """cluster/hosts.py, the test-hosts harness (a script, not a package module), loaded by path."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("hosts", REPO / "cluster" / "hosts.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
