"""driver.snapshot: the cluster's snapshot command, run once as a grid ends; one line whatever happens.

Real shell commands stand in for ``node.sh snapshot`` here (its own tests take real snapshots; a real
grid takes one in tests/test_cluster_backups.py)."""

import os
import signal
import subprocess
import sys
import time

from raystudy.driver import snapshot
from tests.helpers import ctrl_c_default


def test_unset_or_empty_nothing_happens(monkeypatch, capsys):
    monkeypatch.delenv(snapshot.ENV, raising=False)
    assert snapshot.take() is None
    monkeypatch.setenv(snapshot.ENV, "  ")
    assert snapshot.take() is None
    assert capsys.readouterr() == ("", "")


def test_the_commands_last_line_says_where_the_snapshot_went(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv(
        snapshot.ENV, f"echo taking; echo 'snapshot of MLflow'\"'\"'s store: {tmp_path}/mlflow-1.pgdump'"
    )
    line = snapshot.take()
    assert line == f"snapshot of MLflow's store: {tmp_path}/mlflow-1.pgdump"
    assert capsys.readouterr().out == line + "\n"
    monkeypatch.setenv(snapshot.ENV, "true")  # a command that says nothing: the line names it
    assert snapshot.take() == f"snapshot of MLflow's store taken ({snapshot.ENV}=true)"


def test_a_failed_command_is_one_warning_line_and_never_raises(monkeypatch, capsys, tmp_path):
    cmd = "echo partial; echo 'error: no mlflow-store in /state' >&2; exit 2"
    monkeypatch.setenv(snapshot.ENV, cmd)
    line = snapshot.take()
    out = capsys.readouterr().out
    assert out == line + "\n" and out.count("\n") == 1
    assert line.startswith("warning: no snapshot of MLflow's store as the grid ended")
    assert "it exited 2: error: no mlflow-store in /state" in line and "head's loop takes the next" in line
    monkeypatch.setenv(snapshot.ENV, str(tmp_path / "no-such-command"))
    assert "it exited 127" in snapshot.take()


def test_a_command_past_its_time_is_killed_with_what_it_started(monkeypatch, tmp_path):
    pidfile = tmp_path / "pid"
    monkeypatch.setenv(snapshot.ENV, f"sleep 60 & echo $! > {pidfile}; wait")
    t0 = time.time()
    line = snapshot.take(timeout_s=1.5)
    assert "it took longer than 1.5 s" in line and time.time() - t0 < 30
    pid = int(pidfile.read_text())
    assert _ended(pid)


def test_a_ctrl_c_during_the_snapshot_is_one_warning_line_and_the_command_is_killed(tmp_path):
    pidfile = tmp_path / "pid"
    code = "from raystudy.driver import snapshot; snapshot.take(); print('after', flush=True)"
    env = {**os.environ, snapshot.ENV: f"sleep 60 & echo $! > {pidfile}; wait"}
    proc = subprocess.Popen(
        [sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True, preexec_fn=ctrl_c_default
    )
    try:
        deadline = time.time() + 60
        while not (pidfile.exists() and pidfile.read_text().strip()) and time.time() < deadline:
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        out = proc.communicate(timeout=60)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    lines = out.splitlines()
    assert len(lines) == 2 and "it was interrupted" in lines[0] and lines[1] == "after", out
    assert _ended(int(pidfile.read_text()))


def _ended(pid: int, within_s: float = 10.0) -> bool:
    """Whether ``pid`` has ended (a zombie counts as ended) within ``within_s`` s: a kill is delivered
    asynchronously."""
    deadline = time.time() + within_s
    while time.time() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.1)
    return False
