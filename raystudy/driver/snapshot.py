"""A snapshot of MLflow's store when a grid ends, on a cluster.

On a cluster's head, ``cluster/node.sh env`` exports ``RAYSTUDY_SNAPSHOT_CMD`` (``bash
.../node.sh snapshot``) in the environment every shell there sources. A grid driver runs it once
as the grid ends, finished or stopped, and prints one line: where the snapshot went, or a warning.
Unset (a laptop), nothing happens. A failed snapshot changes neither the grid's exit status nor
what MLflow holds; the head's loop takes the next one on its schedule.
"""

from __future__ import annotations

import os
import signal
import subprocess

ENV = "RAYSTUDY_SNAPSHOT_CMD"
# A dump of a paper-sized store and its upload take minutes; a hung upload must not hold the driver.
TIMEOUT_S = 1800.0


def take(timeout_s: float = TIMEOUT_S, what: str = "grid") -> str | None:
    """Run ``$RAYSTUDY_SNAPSHOT_CMD`` once and print one line: the command's last line of output
    (where the snapshot went), or ``warning: ...`` when it failed, timed out or was interrupted;
    returns that line, None when the variable is unset or empty. Never raises for the command.
    ``what`` names the command that ends (a grid, a search) in the warning."""
    cmd = os.environ.get(ENV, "").strip()
    if not cmd:
        return None
    why = None
    try:
        rc, out, err = run(cmd, timeout_s)
    except subprocess.TimeoutExpired:
        why = f"it took longer than {timeout_s:g} s"
    except KeyboardInterrupt:
        why = "it was interrupted"
    except OSError as e:
        why = f"it could not start ({e})"
    else:
        said = _last_line(out)
        if rc == 0:
            line = said or f"snapshot of MLflow's store taken ({ENV}={cmd})"
            print(line, flush=True)
            return line
        why = f"it exited {rc}" + (f": {_last_line(err) or said}" if _last_line(err) or said else "")
    line = (
        f"warning: no snapshot of MLflow's store as the {what} ended ({ENV}={cmd}: {why}); "
        "the store keeps every record, and the head's loop takes the next snapshot on its schedule"
    )
    print(line, flush=True)
    return line


def run(cmd: str, timeout_s: float) -> tuple[int, str, str]:
    """``cmd`` through the shell, in a session of its own: (exit status, stdout, stderr). On a
    timeout or a Ctrl-C the command and what it started are killed, and the exception passes on."""
    proc = subprocess.Popen(
        cmd,
        shell=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # a Ctrl-C at the terminal is the driver's to handle, not the command's
    )
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except BaseException:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        raise
    return proc.returncode, out, err


def _last_line(text: str) -> str:
    """The last non-blank line of ``text``, stripped; empty if none."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else ""
