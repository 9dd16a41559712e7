"""Test hosts on one machine: each with its own network, address, hostname and /tmp, joined by a
switch, with one shared folder at the same path on all of them, as a small cluster has.

    python cluster/hosts.py up 3 --dir /srv/hosts          # hosts h1..h3 at 10.77.0.1..3
    python cluster/hosts.py run --dir /srv/hosts 2 -- hostname -I
    python cluster/hosts.py cut --dir /srv/hosts 2          # h2 drops off the network (heal: back)
    python cluster/hosts.py kill --dir /srv/hosts 2         # every process on h2, as a lost machine
    python cluster/hosts.py down --dir /srv/hosts           # every process and namespace it made

Root only: Linux namespaces from iproute2 (``ip netns``, veth, a bridge) and util-linux
(``unshare``, ``nsenter``). A host is a long-lived process in a network, UTS and mount namespace
of its own; a command runs on it by entering those namespaces, so whatever it starts (a raylet,
sshd, slurmd) lives there too. The switch is a bridge in a namespace of its own: the hosts reach
each other and nothing else, and the machine's own network is left as it was. Each host's
/etc/hosts is Debian's (its name on 127.0.1.1) plus the other hosts' names, so a program that
resolves its own host name gets the loopback, as on a freshly installed node.

Tests use :class:`Hosts` as a context manager; its teardown finds what it made by the namespaces,
not by names, so a test that fails midway leaves no namespace and no process behind.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

TOOLS = ("ip", "unshare", "nsenter", "mount")
SUBNET = "10.77.0"


class HostsError(RuntimeError):
    """What the machine lacks to make hosts, in one line."""


def missing_tools() -> list[str]:
    """The tools that making hosts needs and PATH lacks (empty when root has them all)."""
    return [t for t in TOOLS if shutil.which(t) is None]


def check_can_make_hosts() -> None:
    """Raise :class:`HostsError` naming what is missing: root, or a tool (and its Debian package)."""
    if os.geteuid() != 0:
        raise HostsError("test hosts need root (network namespaces)")
    missing = missing_tools()
    if missing:
        raise HostsError(f"test hosts need {', '.join(missing)} on PATH: apt-get install iproute2 util-linux mount")


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def _netns_inode(ns: str) -> int:
    return os.stat(f"/run/netns/{ns}").st_ino


def _pids_in_netns(inode: int) -> list[int]:
    """Every process whose network namespace is ``inode``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}/ns/net").st_ino == inode:
                    found.append(int(entry))
            except OSError:  # ended while we looked, or a kernel thread
                continue
    return found


# Run inside the host's fresh namespaces before it sleeps: its name, a /tmp of its own (the paths
# under /tmp that must stay shared are bound back into it), its /etc/hosts, then a pid file.
_INIT = r"""
set -e
hostname "$HOST_NAME"
mount --make-rprivate /
mkdir -p "$STAGE"
mount --bind /tmp "$STAGE"
mount -t tmpfs -o size=2g tmpfs /tmp
for p in $KEEP; do mkdir -p "$p"; mount --bind "$STAGE${p#/tmp}" "$p"; done
umount -l "$STAGE"
mount --bind "$HOSTS_FILE" /etc/hosts
echo $$ > "$PID_FILE"
exec sleep infinity
"""


# The machine's cgroup hierarchies mounted again in a host's own /sys: cgroup v2's one, or v1's each.
_CGROUPS = """
if grep -q ' /sys/fs/cgroup cgroup2 ' /proc/1/mounts; then mount -t cgroup2 none /sys/fs/cgroup; else
    mount -t tmpfs -o mode=755 tmpfs /sys/fs/cgroup
    awk '$2 ~ "^/sys/fs/cgroup/" && $3 == "cgroup" { print $2, $4 }' /proc/1/mounts | while read -r dir opts; do
        case "$opts" in *name=*) opts="none,$opts" ;; esac
        mkdir -p "$dir" && mount -t cgroup -o "$opts" cgroup "$dir"
    done
fi
"""


class Hosts:
    """N hosts ``h1..hN`` at ``10.77.0.1..N`` on one switch, with ``shared`` the same folder on each.

    ``keep`` lists further paths under /tmp that every host must see (the checkout and its venv when
    they live there); paths outside /tmp are the machine's own and seen by every host anyway.
    """

    def __init__(self, n: int, root: Path, keep: list[Path] | None = None, tag: str | None = None):
        if not 1 <= n <= 20:
            raise HostsError(f"hosts: n must be 1..20, got {n}")
        self.n, self.root = n, Path(root).resolve()
        # several sets at once in one process (a module's hosts and a test's own): a suffix apart
        self.tag = tag or f"rsh{os.getpid()}-{os.urandom(3).hex()}"
        self.shared = self.root / "shared"
        self.keep = [Path(p).resolve() for p in (keep or [])]
        self.init_pids: dict[int, list[int]] = {}
        self._launchers: list[subprocess.Popen] = []

    # -- names -----------------------------------------------------------------------------------
    def ns(self, k: int) -> str:
        """The network namespace of host ``k`` (``ip netns exec`` takes it too)."""
        return f"{self.tag}-h{k}"

    @property
    def switch(self) -> str:
        """The namespace holding the bridge every host is plugged into."""
        return f"{self.tag}-sw"

    def address(self, k: int) -> str:
        """Host ``k``'s address on the switch."""
        return f"{SUBNET}.{k}"

    def name(self, k: int) -> str:
        """Host ``k``'s host name."""
        return f"h{k}"

    # -- bring up and tear down ------------------------------------------------------------------
    def up(self) -> Hosts:
        """Make the switch and every host; returns self. On any failure, tears down what it made."""
        check_can_make_hosts()
        self.root.mkdir(parents=True, exist_ok=True)
        self.shared.mkdir(exist_ok=True)
        try:
            _ip("netns", "add", self.switch)
            _ip("-n", self.switch, "link", "set", "lo", "up")
            _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
            _ip("-n", self.switch, "link", "set", "br0", "up")
            for k in range(1, self.n + 1):
                self._add_host(k)
            self._save()
        except BaseException:
            self.down()
            raise
        return self

    def _add_host(self, k: int) -> None:
        ns, sw = self.ns(k), self.switch
        _ip("netns", "add", ns)
        _ip("-n", sw, "link", "add", f"v{k}", "type", "veth", "peer", "name", "eth0", "netns", ns)
        _ip("-n", sw, "link", "set", f"v{k}", "master", "br0", "up")
        _ip("-n", ns, "addr", "add", f"{self.address(k)}/24", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        folder = self.root / self.name(k)
        folder.mkdir(exist_ok=True)
        others = "".join(f"{self.address(j)}\t{self.name(j)}\n" for j in range(1, self.n + 1) if j != k)
        (folder / "hosts").write_text(f"127.0.0.1\tlocalhost\n127.0.1.1\t{self.name(k)}\n{others}")
        pid_file = folder / "init.pid"
        pid_file.unlink(missing_ok=True)
        keep = [p for p in [self.shared, self.root, *self.keep] if p.is_relative_to("/tmp")]
        env = {
            **os.environ,
            "HOST_NAME": self.name(k),
            "STAGE": f"/run/{self.tag}-stage",
            "KEEP": " ".join(map(str, keep)),
            "HOSTS_FILE": str(folder / "hosts"),
            "PID_FILE": str(pid_file),
        }
        cmd = ["ip", "netns", "exec", ns, "unshare", "--uts", "--mount", "--fork", "sh", "-c", _INIT]
        with open(folder / "init.log", "w") as log:  # not the caller's stdout: a pipe would never close
            proc = subprocess.Popen(
                cmd, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True
            )
        self._launchers.append(proc)
        deadline = time.monotonic() + 10
        while not pid_file.exists() or not pid_file.read_text().strip():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise HostsError(f"host {self.name(k)} did not start (exit {proc.poll()})")
            time.sleep(0.02)
        # the host is two processes: unshare's parent (waiting on its child) and the init
        self.init_pids[k] = [proc.pid, int(pid_file.read_text())]

    def down(self) -> None:
        """Kill every process on every host, then delete the namespaces; safe to call twice."""
        for k in range(1, self.n + 1):
            if os.path.exists(f"/run/netns/{self.ns(k)}"):
                self.kill(k, init_too=True)
                subprocess.run(["ip", "netns", "del", self.ns(k)], capture_output=True)
        if os.path.exists(f"/run/netns/{self.switch}"):
            subprocess.run(["ip", "netns", "del", self.switch], capture_output=True)
        for proc in self._launchers:  # reaped, so no zombie outlives the hosts
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        self._launchers.clear()
        self.init_pids.clear()
        (self.root / "hosts.json").unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            os.rmdir(f"/run/{self.tag}-stage")

    def __enter__(self) -> Hosts:
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()

    def _save(self) -> None:
        state = {"n": self.n, "tag": self.tag, "keep": list(map(str, self.keep)), "init_pids": self.init_pids}
        (self.root / "hosts.json").write_text(json.dumps(state))

    @classmethod
    def load(cls, root: Path) -> Hosts:
        """The hosts that ``up`` made under ``root`` (from its state file)."""
        state = json.loads((Path(root) / "hosts.json").read_text())
        hosts = cls(state["n"], root, keep=state["keep"], tag=state["tag"])
        hosts.init_pids = {int(k): v for k, v in state["init_pids"].items()}
        return hosts

    # -- use ---------------------------------------------------------------------------------------
    def command(self, k: int, argv: list[str], cwd: str | Path | None = None) -> list[str]:
        """``argv`` as run on host ``k`` in ``cwd`` (default: this process's): inside its network, UTS
        and mount namespaces (nsenter would otherwise start it in the host's root folder)."""
        pid = str(self.init_pids[k][-1])
        wd = Path(cwd or os.getcwd()).resolve()
        return ["nsenter", "-t", pid, "--net", "--uts", "--mount", f"--wd={wd}", "--", *argv]

    def popen(self, k: int, argv: list[str], cwd: str | Path | None = None, **kw) -> subprocess.Popen:
        """Start ``argv`` on host ``k`` (``subprocess.Popen``'s keywords pass through)."""
        return subprocess.Popen(self.command(k, argv, cwd), **kw)

    def run(self, k: int, argv: list[str], cwd: str | Path | None = None, **kw) -> subprocess.CompletedProcess:
        """Run ``argv`` on host ``k`` to its end (``subprocess.run``'s keywords pass through)."""
        return subprocess.run(self.command(k, argv, cwd), **kw)

    def sh(self, k: int, script: str, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
        """Run a shell script on host ``k``; its output as text."""
        kw.setdefault("capture_output", True)
        return self.run(k, ["sh", "-c", script], text=True, timeout=timeout, **kw)

    def as_node(self, k: int) -> None:
        """What a real node has and host ``k`` lacks, for daemons that need it: a default route (Ray
        finds its own address by one) and the machine's cgroup hierarchies (slurmd will not start
        without them; ``ip netns exec`` gives the host a /sys of its own, which has none)."""
        p = self.sh(k, "ip route add default dev eth0 && " + _CGROUPS)
        if p.returncode != 0:
            raise HostsError(f"host {self.name(k)}: {p.stderr.strip()}")

    def cut(self, k: int) -> None:
        """Take host ``k`` off the network: its port on the switch goes down, both ways."""
        _ip("-n", self.switch, "link", "set", f"v{k}", "down")

    def heal(self, k: int) -> None:
        """Plug host ``k`` back in."""
        _ip("-n", self.switch, "link", "set", f"v{k}", "up")

    def pids(self, k: int) -> list[int]:
        """The processes running on host ``k``, its own init apart."""
        return [p for p in _pids_in_netns(_netns_inode(self.ns(k))) if p not in self.init_pids.get(k, [])]

    def kill(self, k: int, init_too: bool = False, timeout: float = 10) -> list[int]:
        """SIGKILL every process on host ``k`` (as a machine lost), until none is left; the pids killed.

        The host itself stays up (a command can run on it again) unless ``init_too``."""
        inode = _netns_inode(self.ns(k))
        killed: list[int] = []
        deadline = time.monotonic() + timeout
        while True:
            left = [p for p in _pids_in_netns(inode) if init_too or p not in self.init_pids.get(k, [])]
            if not left:
                return killed
            if time.monotonic() > deadline:
                raise HostsError(f"host {self.name(k)}: processes {left} outlived SIGKILL")
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                except ProcessLookupError:
                    pass
            time.sleep(0.05)


def stale_namespaces(prefix: str = "rsh") -> list[str]:
    """Namespaces named like a harness's (``rsh<pid>-...``) whose making process has ended."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    names = [line.split()[0] for line in out.splitlines() if line.startswith(prefix)]
    stale = []
    for name in names:
        pid = name[len(prefix) :].split("-")[0]
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            stale.append(name)
    return stale


def build_parser() -> argparse.ArgumentParser:
    """The command line: up, run, cut, heal, kill, down."""
    p = argparse.ArgumentParser(prog="python cluster/hosts.py", description=__doc__.split("\n\n")[0])
    p.add_argument("action", choices=["up", "run", "cut", "heal", "kill", "down"], help="with run: ... -- COMMAND")
    p.add_argument("k", nargs="?", type=int, help="the host (for up: how many hosts)")
    p.add_argument("--dir", type=Path, required=True, help="the hosts' folder (its shared/ is on every host)")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run one action; the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    rest = argv[argv.index("--") + 1 :] if "--" in argv else []
    args = build_parser().parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    try:
        if args.action == "up":
            # the hosts outlive this command: the harness's tag is this (ending) process's pid,
            # so name them after the folder's state instead
            hosts = Hosts(args.k or 2, args.dir, tag=f"rshcli{os.getpid()}").up()
            print(" ".join(f"{hosts.name(k)}={hosts.address(k)}" for k in range(1, hosts.n + 1)))
            return 0
        hosts = Hosts.load(args.dir)
        if args.action == "down":
            hosts.down()
        elif args.action == "run":
            return hosts.run(args.k, rest).returncode
        else:
            getattr(hosts, args.action)(args.k)
        return 0
    except (HostsError, FileNotFoundError, subprocess.CalledProcessError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
