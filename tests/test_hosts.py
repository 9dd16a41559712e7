"""cluster/hosts.py: test hosts on one machine, each with its own address, host name and /tmp, one
shared folder, a link that can be cut and healed, and a teardown that leaves nothing behind.

As root (CI) a missing tool fails these tests rather than skipping them: the many-host tests
depend on the harness."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
HOSTS_PY = REPO / "cluster" / "hosts.py"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")


def load_hosts():
    """cluster/hosts.py as a module (cluster/ is a folder of scripts, not a package)."""
    spec = importlib.util.spec_from_file_location("hosts", HOSTS_PY)
    module = importlib.util.module_from_spec(spec)
    sys.modules["hosts"] = module
    spec.loader.exec_module(module)
    return module


hosts_mod = load_hosts()
# the checkout and its Python, when they live under /tmp (a clone there): each host has a /tmp of its own
KEEP = [REPO, Path(sys.prefix)]

SERVE = (
    "import socket,sys;s=socket.socket();s.bind(('0.0.0.0',7000));s.listen();print('up',flush=True);"
    "c,_=s.accept();c.send(socket.gethostname().encode());c.close()"
)
CONNECT = "import socket;s=socket.create_connection(('{addr}',7000),timeout={t});print(s.recv(16).decode())"


def netns_names() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def alive(pid) -> bool:
    """Whether ``pid`` runs (a zombie, ended and waiting for its reaper, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def serve(hosts, k):
    """A one-shot TCP server on host ``k``, port 7000, answering its host name; ready on return."""
    proc = hosts.popen(k, [sys.executable, "-c", SERVE], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "up"
    return proc


def test_the_tools_are_here_as_root():
    assert hosts_mod.missing_tools() == []


def test_hosts_have_their_own_address_name_and_tmp_and_share_one_folder(tmp_path):
    with hosts_mod.Hosts(3, tmp_path / "hosts", keep=KEEP) as hosts:
        for k in (1, 2, 3):
            out = hosts.sh(k, f"hostname; hostname -I; echo {k} > /tmp/mine; echo {k} > {hosts.shared}/from{k}")
            assert out.returncode == 0, out.stderr
            assert out.stdout.split() == [f"h{k}", f"10.77.0.{k}"]
        # /tmp is each host's own (and not the machine's); the shared folder is one
        for k in (1, 2, 3):
            assert hosts.sh(k, "cat /tmp/mine").stdout.strip() == str(k)
        assert not Path("/tmp/mine").exists()
        assert sorted(p.name for p in hosts.shared.iterdir()) == ["from1", "from2", "from3"]
        assert hosts.sh(2, f"ls {hosts.shared}").stdout.split() == ["from1", "from2", "from3"]
        # a command runs in the folder it is given (or this process's), as on a shared filesystem
        assert hosts.sh(3, "pwd", cwd=hosts.shared).stdout.strip() == str(hosts.shared)
        assert hosts.sh(3, "pwd").stdout.strip() == os.getcwd()
        # a host's own name resolves to the loopback, as on a fresh Debian node; the others' to them
        assert hosts.sh(2, "getent hosts h2").stdout.split()[0] == "127.0.1.1"
        assert hosts.sh(2, "getent hosts h3").stdout.split()[0] == "10.77.0.3"
        server = serve(hosts, 1)
        got = hosts.sh(3, f'{sys.executable} -c "{CONNECT.format(addr="10.77.0.1", t=5)}"')
        assert got.stdout.strip() == "h1", got.stderr
        server.wait(timeout=10)


def test_a_cut_host_reaches_nothing_until_healed(tmp_path):
    with hosts_mod.Hosts(2, tmp_path / "hosts", keep=KEEP) as hosts:
        server = serve(hosts, 1)
        hosts.cut(2)
        t0 = time.monotonic()
        cut = hosts.sh(2, f'{sys.executable} -c "{CONNECT.format(addr="10.77.0.1", t=1)}"')
        assert cut.returncode != 0 and time.monotonic() - t0 < 30
        hosts.heal(2)
        healed = hosts.sh(2, f'{sys.executable} -c "{CONNECT.format(addr="10.77.0.1", t=5)}"')
        assert healed.stdout.strip() == "h1", healed.stderr
        server.wait(timeout=10)


def test_killing_a_host_ends_every_process_there_and_nothing_elsewhere(tmp_path):
    with hosts_mod.Hosts(2, tmp_path / "hosts", keep=KEEP) as hosts:
        # a daemon that detaches from the command that started it, as `ray start` leaves a raylet
        hosts.sh(2, "setsid sleep 300 > /dev/null 2>&1 < /dev/null & echo $! > /tmp/daemon")
        on1 = hosts.popen(1, ["sleep", "300"])
        on2 = hosts.popen(2, ["sleep", "300"])
        daemon = int(hosts.sh(2, "cat /tmp/daemon").stdout)
        assert {on2.pid, daemon} <= set(hosts.pids(2)) and on1.pid in hosts.pids(1)
        killed = hosts.kill(2)
        assert {on2.pid, daemon} <= set(killed)
        assert on2.wait(timeout=5) == -9 and not alive(daemon)
        assert hosts.pids(2) == [] and on1.poll() is None
        # the machine is lost, not gone: a command runs there again, as on a rebooted node
        assert hosts.sh(2, "hostname").stdout.strip() == "h2"
        on1.kill()
        on1.wait()


def test_a_test_that_fails_midway_leaves_no_namespace_and_no_process(tmp_path):
    script = textwrap.dedent(
        f"""
        import importlib.util, subprocess, sys
        spec = importlib.util.spec_from_file_location("hosts", {str(HOSTS_PY)!r})
        hosts_mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(hosts_mod)
        with hosts_mod.Hosts(3, {str(tmp_path / "h")!r}) as hosts:
            hosts.sh(3, "setsid sleep 300 > /dev/null 2>&1 < /dev/null &")
            print(hosts.tag, *hosts.pids(3), *[p for k in (1, 2, 3) for p in hosts.init_pids[k]], flush=True)
            raise RuntimeError("a test failing midway")
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "a test failing midway" in proc.stderr
    tag, *pids = proc.stdout.split()
    assert len(pids) >= 7  # the daemon on h3, and each host's two processes
    assert not {n for n in netns_names() if n.startswith(tag + "-")}
    assert not [p for p in pids if alive(p)]


def test_a_missing_tool_is_named_with_its_package(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("ip", "mount", "unshare"):  # nsenter missing
        (bin_dir / tool).symlink_to(subprocess.run(["which", tool], capture_output=True, text=True).stdout.strip())
    monkeypatch.setenv("PATH", str(bin_dir))
    with pytest.raises(hosts_mod.HostsError, match="need nsenter on PATH: apt-get install"):
        hosts_mod.check_can_make_hosts()


def test_the_command_line_brings_hosts_up_runs_on_one_and_tears_down(tmp_path):
    cli = [sys.executable, str(HOSTS_PY)]
    up = subprocess.run([*cli, "up", "2", "--dir", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert up.returncode == 0 and up.stdout.split() == ["h1=10.77.0.1", "h2=10.77.0.2"], up.stderr
    tag = json.loads((tmp_path / "hosts.json").read_text())["tag"]
    try:
        ran = subprocess.run(
            [*cli, "run", "2", "--dir", str(tmp_path), "--", "hostname"], capture_output=True, text=True
        )
        assert ran.stdout.strip() == "h2"
    finally:
        down = subprocess.run([*cli, "down", "--dir", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert down.returncode == 0, down.stderr
    assert not (tmp_path / "hosts.json").exists()
    assert not [n for n in netns_names() if n.startswith(tag + "-")]
    bad = subprocess.run([*cli, "cut", "1", "--dir", str(tmp_path / "none")], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.startswith("error: ") and len(bad.stderr.splitlines()) == 1
