"""The nemesis's world on two test hosts (``cluster/hosts.py``), as a cluster runs a study: a Ray head
on h1, where the command, its store and its tracking server run, and a Ray worker node on h2,
joined to it; the partition fault cuts h2 off from h1 for a while, then plugs it back in.

The harness starts that Ray (``ray start``, as a cluster's nodes are started) and keeps it up, as
an operator or the autoscaler would: a head whose GCS or raylet died is started again, every Ray
process on both hosts first ended, before the command runs again; a worker node that ended (its
raylet killed, or ended by Ray once the head had taken it for dead during a cut) joins again once
h2 is back on the network. Ray's processes are told from the command and the servers by their
program (Ray's own binaries and scripts, its workers' ``ray::`` titles) and from other Rays on the
machine by the host's network namespace, never by a pid seen earlier."""

from __future__ import annotations

import subprocess
from pathlib import Path

from host_faults import hosts_module

HEAD = "10.77.0.1"
PORT = 6379


def cmdline(pid: int) -> str:
    """The process's command line, its arguments joined by spaces ("" when it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def is_ray(cmd: str) -> bool:
    """A process of Ray's own: its binaries and scripts (GCS, raylet, agents, monitors, workers as
    they start) or a worker's title (``ray::IDLE``, ``ray::ImplicitFunc.train``)."""
    return cmd.startswith("ray::") or "site-packages/ray/" in cmd.split(" --", 1)[0]


class TwoHosts:
    """h1 (the head: Ray's head node, the command, the store) and h2 (a Ray worker node)."""

    def __init__(self, root: Path, env: dict, cpus: int):
        hosts_py = hosts_module()
        hosts_py.check_can_make_hosts()
        self.env, self.cpus = env, cpus
        self.hosts = hosts_py.Hosts(2, root).up()
        self.cut_now = False
        for k in (1, 2):
            self.hosts.as_node(k)  # a default route: Ray finds its node's address by one

    @property
    def address(self) -> str:
        """The Ray head's address, as the command is given it (``--address``)."""
        return f"{HEAD}:{PORT}"

    def popen(self, argv: list[str], **kw) -> subprocess.Popen:
        """``argv`` started on the head (nsenter execs it: its pid is the command's)."""
        return self.hosts.popen(1, argv, **kw)

    def run(self, argv: list[str], **kw) -> subprocess.CompletedProcess:
        """``argv`` run on the head to its end."""
        return self.hosts.run(1, argv, **kw)

    # -- Ray on the hosts
    def ray_pids(self, k: int) -> list[int]:
        """Ray's processes on host ``k``."""
        return [p for p in self.hosts.pids(k) if is_ray(cmdline(p))]

    def processes(self) -> dict:
        """Both hosts' Ray as the faults see it: the GCS, each raylet, the trial workers."""
        out: dict = {"raylets": [], "gcs": None, "workers": []}
        for k in (1, 2):
            for pid in self.ray_pids(k):
                cmd = cmdline(pid)
                program = cmd.split(" ")[0]
                if program.endswith("/raylet"):
                    out["raylets"].append(pid)
                elif program.endswith("gcs_server") and k == 1:
                    out["gcs"] = pid
                elif cmd.startswith("ray::ImplicitFunc"):
                    out["workers"].append(pid)
        return out

    def raylet(self, k: int) -> int | None:
        """Host ``k``'s raylet, None when it has none."""
        found = [p for p in self.ray_pids(k) if cmdline(p).split(" ")[0].endswith("/raylet")]
        return found[0] if found else None

    def _end_ray(self, k: int) -> None:
        for pid in self.ray_pids(k):
            subprocess.run(["kill", "-KILL", str(pid)], capture_output=True)

    def start_node(self, k: int) -> bool:
        """Ray's node on host ``k`` started afresh (what was left of the last one ended first): the
        head on h1 (a harness failure when it does not start), a worker joined to it on h2 (whether
        it joined: a cut as it joins leaves it to the next ``mend``)."""
        self._end_ray(k)
        common = f"--node-ip-address=10.77.0.{k} --num-cpus={self.cpus} --disable-usage-stats"
        if k == 1:
            cmd = f"ray start --head --port={PORT} --include-dashboard=false {common}"
        else:
            cmd = f"ray start --address={self.address} {common}"
        try:
            p = self.hosts.sh(k, cmd, env=self.env, timeout=180 if k == 1 else 60)
        except subprocess.TimeoutExpired:
            p = None
        if k == 1 and (p is None or p.returncode != 0):
            raise RuntimeError(f"ray start on h1 failed: {'' if p is None else (p.stdout + p.stderr)[-1500:]}")
        if p is None or p.returncode != 0:
            self._end_ray(k)
            return False
        return True

    def start_ray(self) -> None:
        """The cluster started afresh: the head, then the worker unless h2 is cut off (it joins
        once back, by ``mend``)."""
        self._end_ray(2)
        self.start_node(1)
        if not self.cut_now:
            self.start_node(2)

    def ensure(self) -> None:
        """Before the command runs again: a head whose GCS or raylet ended is started afresh (and
        the worker with it); else a worker node that ended joins again, unless h2 is cut off."""
        gcs = self.processes()["gcs"]
        if gcs is None or self.raylet(1) is None:
            self.start_ray()
        else:
            self.mend()

    def mend(self) -> bool:
        """h2's worker node joined again if it ended while h2 is on the network and the head is up;
        whether it did."""
        if self.cut_now or self.raylet(2) is not None or self.raylet(1) is None or self.processes()["gcs"] is None:
            return False
        return self.start_node(2)

    # -- the partition
    def cut(self) -> bool:
        """h2 off the network; whether its port on the switch is down."""
        self.hosts.cut(2)
        self.cut_now = True
        p = subprocess.run(["ip", "-n", self.hosts.switch, "-o", "link", "show", "v2"], capture_output=True, text=True)
        return "state DOWN" in p.stdout

    def heal(self) -> None:
        """h2 back on the network."""
        self.hosts.heal(2)
        self.cut_now = False

    def down(self) -> None:
        """Every process on both hosts ended and their namespaces gone."""
        self.hosts.down()
