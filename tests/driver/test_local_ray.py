"""driver.local_ray: a local Ray on loopback with token auth; an address that does not answer is refused."""

import json
import os
import subprocess
import sys
import tempfile

import pytest

from raystudy.driver import local_ray
from raystudy.errors import ConfigError

CODE = r"""
import json, sys
import psutil
from raystudy.driver import local_ray
local_ray.start_ray(None, 1, sys.argv[1], dashboard=True)
import ray
from ray._raylet import AuthenticationMode, get_authentication_mode
me = psutil.Process()
socks = []
for p in [me] + me.children(recursive=True):
    try:
        socks += [(p.name(), c.laddr.ip, c.laddr.port) for c in p.net_connections(kind="tcp")
                  if c.status == psutil.CONN_LISTEN]
    except psutil.Error:
        pass
raylet = [p for p in me.children(recursive=True) if p.name() == "raylet"]
print(json.dumps({"socks": socks, "token": get_authentication_mode() == AuthenticationMode.TOKEN,
                  "raylet_auth": raylet[0].environ().get("RAY_AUTH_MODE") if raylet else None}))
ray.shutdown()
"""


@pytest.mark.slow
def test_local_ray_listens_on_loopback_only_with_token_auth(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_AUTH_MODE", "RAY_ADDRESS")}
    env.update(HOME=str(home), OMP_NUM_THREADS="1")
    temp = tempfile.mkdtemp(prefix="rlb", dir="/tmp")  # Ray's socket paths must stay short
    p = subprocess.run([sys.executable, "-c", CODE, temp], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    # Ray's line that token authentication is on: raystudy turned it on, the user has nothing to do
    assert "Token authentication is enabled" not in p.stdout + p.stderr, p.stderr[-3000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    names = {name for name, _, _ in got["socks"]}
    assert {"gcs_server", "raylet"} <= names, got["socks"]
    exposed = [s for s in got["socks"] if s[1] not in ("127.0.0.1", "::1", "::ffff:127.0.0.1")]
    assert not exposed, exposed
    assert got["token"] and got["raylet_auth"] == "token"
    token = home / ".ray" / "auth_token"
    assert token.is_file() and token.stat().st_mode & 0o077 == 0  # the token: its owner's alone


@pytest.mark.parametrize(
    "address,needle", [("nohost", "expected auto, local or HOST:PORT"), ("127.0.0.1:9", "no Ray cluster answers there")]
)
def test_an_address_that_cannot_be_joined_is_refused_before_ray_starts(address, needle):
    with pytest.raises(ConfigError, match=needle):
        local_ray.check_address(address)
    local_ray.check_address("auto")  # Ray finds it itself


@pytest.mark.parametrize("before", ["ignored", "default"])
def test_sigterm_stays_ignored_across_ray_init_where_it_was(before):
    """A driver started with SIGTERM ignored (a SLURM job's grid: scancel's TERM reaches every
    process, and the job stops the grid itself) keeps ignoring it after ``ray.init``, which sets
    handlers of its own (Abseil's printed a stack and aborted the grid); any other is Ray's."""
    import signal

    saved = signal.getsignal(signal.SIGTERM)
    try:
        signal.signal(signal.SIGTERM, signal.SIG_IGN if before == "ignored" else signal.SIG_DFL)
        with local_ray.term_kept():
            signal.signal(signal.SIGTERM, lambda *_: None)  # as ray.init does
        after = signal.getsignal(signal.SIGTERM)
        assert (after == signal.SIG_IGN) == (before == "ignored"), after
    finally:
        signal.signal(signal.SIGTERM, saved)


@pytest.mark.slow
def test_a_local_ray_whose_gcs_does_not_start_stops_the_grid_in_one_line(tmp_path, ray_tmp):
    # Seen by the nemesis (seed 1, a grid on SQLite): the GCS killed as a rerun's local Ray was
    # starting ended the grid in Ray's traceback ("Failed to start GCS"). Held here by its port,
    # taken before it starts (about 40 s of Ray's retries).
    import socket

    from tests.helpers import driver_env

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        env = driver_env(RAY_GCS_SERVER_PORT=str(taken.getsockname()[1]))
        cmd = [sys.executable, "-m", "raystudy.grid", "--rehearse", "0.2", "--datasets", "digits_c", "--quiet"]
        cmd += ["--storage", str(tmp_path / "runs"), "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}"]
        cmd += ["--num-cpus", "1", "--ray-temp-dir", str(ray_tmp)]
        p = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    out = p.stdout + p.stderr
    assert p.returncode == 2 and "Traceback" not in out, out[-3000:]
    said = [line for line in out.splitlines() if line.startswith("error: ")]
    assert len(said) == 1 and said[0].startswith("error: the local Ray did not start (Failed to start GCS."), said
    assert said[0].endswith("; run the same command again") and str(ray_tmp) in said[0], said


@pytest.mark.slow
def test_a_grid_whose_local_raylet_dies_stops_in_one_line_and_the_same_command_resumes(tmp_path, ray_tmp):
    # Seen by the nemesis (seed 23): Ray ends a raylet whose dashboard agent was killed, and a
    # raylet killed as the trials start leaves the driver up; Tune then waited for ever on a
    # cluster of no CPUs ("trials waiting for resources ... on 0 nodes"). Held here by killing the
    # grid's raylet as it says it is running its trials, before any can end.
    import psutil

    from tests.helpers import driver_env

    cmd = [sys.executable, "-m", "raystudy.grid", "--rehearse", "0.2", "--datasets", "digits_c", "--quiet"]
    cmd += ["--storage", str(tmp_path / "runs"), "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}"]
    cmd += ["--num-cpus", "1", "--ray-temp-dir", str(ray_tmp)]
    p = subprocess.Popen(
        cmd, cwd=tmp_path, env=driver_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    ray_procs = []
    try:
        out = []
        for line in p.stdout:
            out.append(line)
            if line.startswith("running "):
                break
        ray_procs = psutil.Process(p.pid).children(recursive=True)
        raylets = [c for c in ray_procs if "raylet/raylet" in " ".join(c.cmdline())]
        assert len(raylets) == 1, "".join(out)
        raylets[0].kill()
        rest, _ = p.communicate(timeout=180)  # before: no end
    finally:
        for proc in [p, *ray_procs]:
            if proc.poll() is None if proc is p else proc.is_running():
                proc.kill()
    out = "".join(out) + rest
    said = [line for line in out.splitlines() if line.startswith("error: ")]
    assert p.returncode == 130 and "Traceback" not in out, out[-3000:]
    assert said == [
        "error: the Ray node this driver runs on has ended (its raylet was killed, or Ray ended it when an "
        "agent it needs died): stopping; run the same command to resume"
    ], out[-3000:]
    assert out.rstrip().splitlines()[-2].startswith("grid stopped: "), out[-3000:]
    again = subprocess.run(cmd, cwd=tmp_path, env=driver_env(), capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "\ndone in " in again.stdout, again.stdout[-3000:] + again.stderr[-3000:]
    assert "26 finished" in again.stdout, again.stdout[-2000:]


@pytest.mark.slow
def test_a_grid_whose_clusters_gcs_stops_answering_as_it_joins_is_refused_in_one_line(tmp_path):
    # Seen by the nemesis on two hosts (seed 8, a grid on SQLite): the GCS killed between the
    # address's first check and the grid's joining; Ray's GCS client raised its RpcError after 30 s
    # (a traceback), and ray.init retries such a GCS twenty times, about 40 s each. Held here by a
    # port that accepts and never answers as a GCS.
    import socket

    from tests.helpers import driver_env

    with socket.socket() as mute:
        mute.bind(("127.0.0.1", 0))
        mute.listen()
        address = f"127.0.0.1:{mute.getsockname()[1]}"
        cmd = [sys.executable, "-m", "raystudy.grid", "--rehearse", "0.2", "--datasets", "digits_c", "--quiet"]
        cmd += ["--storage", str(tmp_path / "runs"), "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}"]
        cmd += ["--address", address]
        p = subprocess.run(cmd, cwd=tmp_path, env=driver_env(), capture_output=True, text=True, timeout=240)
    out = p.stdout + p.stderr
    assert p.returncode == 2 and "Traceback" not in out, out[-3000:]
    said = [line for line in out.splitlines() if line.startswith("error: ")]
    assert len(said) == 1 and said[0].startswith(f"error: --address {address}: the cluster's GCS does not answer"), out
