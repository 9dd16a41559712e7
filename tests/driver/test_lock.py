"""driver.lock: one driver per grid; the lock names its holder, and a dead holder's lock is taken over."""

import socket
import subprocess
import sys

import pytest

from raystudy.driver import lock


def _hold(storage, name, then="time.sleep(120)"):
    code = (
        "import time; from raystudy.driver import lock\n"
        f"with lock.grid_lock({str(storage)!r}, {name!r}):\n    print('held', flush=True); {then}"
    )
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    return p


def test_a_grid_lock_names_its_holder_and_a_dead_holders_lock_is_taken_over(tmp_path):
    holder = _hold(tmp_path, "g")
    try:
        with pytest.raises(lock.GridBusy, match=f"pid {holder.pid} on host {socket.gethostname()}"):
            with lock.grid_lock(tmp_path, "g"):
                pass
    finally:
        holder.kill()  # dies holding it: no cleanup ran
        holder.wait()
    said = []
    with lock.grid_lock(tmp_path, "g", log=said.append):
        assert f"pid {holder.pid}" in said[0] and "gone" in said[0]
        with lock.grid_lock(tmp_path, "g"):  # reentrant in the holding process
            pass
    with lock.grid_lock(tmp_path, "g", log=said.append):  # released cleanly: nothing to take over
        assert len(said) == 1
