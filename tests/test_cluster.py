"""The cluster files: Ray's own autoscaler schema, the security promises, and `ray up` for real.

The end-to-end tests bring cluster.local.yaml up over three test hosts (cluster/hosts.py: each its
own network, address, host name and /tmp, one shared folder), an SSH server on each that they
start (Debian's openssh-server): `ray up` on the head, the demo grid run there with `ray exec`, its
trials on the two worker hosts, the runs read back from the head's MLflow store, and `ray down`.
The hosts share this machine's processes, and `ray down` runs a bare `ray stop` on each host: so
each host's SSH user gets a HOME of its own and, first on its PATH, cluster/shared-host/ray, whose
`stop` stops only that host's Ray.
"""

import ast
import getpass
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.helpers import free_port, hosts_module, search_runs, wait_for

# One xdist worker runs this file: its tests share one `ray up` cluster and sshd.
pytestmark = pytest.mark.xdist_group("cluster")

REPO = Path(__file__).resolve().parent.parent
CLUSTER_FILES = ("cluster.yaml", "cluster.local.yaml")
WRAPPER = REPO / "cluster" / "shared-host" / "ray"


def load(name: str) -> dict:
    return yaml.safe_load((REPO / name).read_text())


def commands(cfg: dict) -> list[str]:
    keys = (
        "initialization_commands",
        "setup_commands",
        "head_setup_commands",
        "worker_setup_commands",
        "head_start_ray_commands",
        "worker_start_ray_commands",
    )
    return [c for k in keys for c in cfg.get(k, [])]


# ---------------------------------------------------------------- the files, offline


@pytest.mark.parametrize("name", CLUSTER_FILES)
def test_cluster_file_passes_rays_autoscaler_schema(name):
    from ray.autoscaler._private.util import prepare_config, validate_config

    validate_config(prepare_config(load(name)))


def test_the_schema_check_catches_mistakes():
    import jsonschema
    from ray.autoscaler._private.util import prepare_config, validate_config

    typo = {**load("cluster.yaml"), "idle_timeout_minute": 5}
    with pytest.raises(jsonschema.ValidationError, match="idle_timeout_minute"):
        validate_config(prepare_config(typo))
    no_resources = load("cluster.yaml")
    del no_resources["available_node_types"]["gpu_1x"]["resources"]
    with pytest.raises(jsonschema.ValidationError, match="resources"):
        validate_config(prepare_config(no_resources))


def test_aws_cluster_uses_the_installed_rays_gpu_image():
    import ray

    assert load("cluster.yaml")["docker"]["image"] == f"rayproject/ray:{ray.__version__}-py311-gpu"


def test_placeholders_are_named_once_at_the_top_and_nothing_secret_is_committed():
    text = (REPO / "cluster.yaml").read_text()
    fill_in = load("cluster.yaml")["metadata"]["fill_in"]
    assert set(fill_in) == {"region", "storage", "key_name", "key_file", "security_group", "mlflow_store"}
    body = text.split("# -----", 2)[2]  # after the fill-in block: only aliases
    for key, value in fill_in.items():
        assert value not in body, key
        assert f"*{key}" in body, f"{key} is never used"
    for name in CLUSTER_FILES:
        t = (REPO / name).read_text()
        for secret in ("PRIVATE KEY", "aws_secret_access_key", "AKIA", "password"):
            assert secret not in t, (name, secret)


def test_services_are_never_open_to_the_internet():
    for name in CLUSTER_FILES:
        cfg = load(name)
        assert "0.0.0.0" not in (REPO / name).read_text(), name
        head = " ".join(cfg["head_start_ray_commands"])
        assert "--dashboard-host=127.0.0.1" in head, name
        assert "cluster/node.sh mlflow" in head, name  # binds the head's private address only
    node_sh = (REPO / "cluster" / "node.sh").read_text()
    assert '--host "$ip"' in node_sh and "--allowed-hosts" in node_sh
    # Every AWS node type names the security group (SSH from your address only): Ray then creates
    # none of its own, whose default rules let SSH in from anywhere.
    aws = load("cluster.yaml")
    for t, node in aws["available_node_types"].items():
        assert node["node_config"]["SecurityGroupIds"] == [aws["metadata"]["fill_in"]["security_group"]], t


def test_aws_cluster_shape():
    cfg = load("cluster.yaml")
    types = cfg["available_node_types"]
    head = types[cfg["head_node_type"]]
    assert head["resources"].get("GPU", 0) == 0
    for t in ("gpu_1x", "gpu_8x"):
        assert types[t]["min_workers"] == 0 and types[t]["max_workers"] >= 1
    assert types["gpu_1x"]["node_config"]["InstanceMarketOptions"]["MarketType"] == "spot"
    assert "InstanceMarketOptions" not in types["gpu_8x"]["node_config"]  # DDP trials: on demand
    assert cfg["idle_timeout_minutes"] > 0
    assert cfg["file_mounts"] == {"~/raystudy-src": "."}
    assert "python -m pip install -q -e ~/raystudy-src" in cfg["setup_commands"]
    head_cmds = " ".join(cfg["head_start_ray_commands"])
    assert '"$RAYSTUDY_STORAGE/mlflow"' in head_cmds  # artifacts in the bucket
    assert any("node.sh env" in c and "$RAY_HEAD_IP" in c for c in cfg["worker_setup_commands"])


def test_aws_worker_types_fit_every_model_of_the_papers_grid():
    from raystudy.spaces import grids, schema

    cfg = load("cluster.yaml")
    workers = [t for name, t in cfg["available_node_types"].items() if name != cfg["head_node_type"]]
    space = grids.load_grid("paper")
    for model in space.models:
        o = schema.model_options(space.models, model)
        need = {"CPU": o["cpu"] * o["workers"], "GPU": o["gpu"] * o["workers"]}  # DDP workers packed on one node
        assert any(all(t["resources"].get(k, 0) >= v for k, v in need.items()) for t in workers), (model, need)


def test_aws_workers_get_a_profile_limited_to_the_bucket_prefix_and_only_the_head_launches():
    import json

    cfg = load("cluster.yaml")
    types = cfg["available_node_types"]
    iam = REPO / "cluster" / "iam"
    head = types[cfg["head_node_type"]]["node_config"]["IamInstanceProfile"]["Name"]
    assert head == "raystudy-head"
    for name, t in types.items():
        if name != cfg["head_node_type"]:
            assert t["node_config"]["IamInstanceProfile"] == {"Name": "raystudy-worker"}, name

    def actions(policy):
        return {
            a
            for st in policy["Statement"]
            if st["Effect"] == "Allow"
            for a in ([st["Action"]] if isinstance(st["Action"], str) else st["Action"])
        }

    worker = json.loads((iam / "worker-policy.json").read_text())
    assert all(a.startswith("s3:") for a in actions(worker)), actions(worker)
    for st in worker["Statement"]:  # objects under the prefix; listing only of the prefix
        if st["Effect"] == "Deny":  # what it takes away (the snapshots'): the test below
            continue
        res = [st["Resource"]] if isinstance(st["Resource"], str) else st["Resource"]
        assert all(r in ("arn:aws:s3:::YOUR-BUCKET/raystudy/*", "arn:aws:s3:::YOUR-BUCKET") for r in res), st
        if "arn:aws:s3:::YOUR-BUCKET" in res and actions({"Statement": [st]}) != {"s3:GetBucketLocation"}:
            assert actions({"Statement": [st]}) == {"s3:ListBucket"}
            assert st["Condition"]["StringLike"]["s3:prefix"] == ["raystudy/*"]
    launcher = json.loads((iam / "head-policy.json").read_text())
    assert {"ec2:RunInstances", "ec2:TerminateInstances", "iam:PassRole"} <= actions(launcher)
    passrole = [st for st in launcher["Statement"] if "iam:PassRole" in st["Action"]]
    assert [st["Resource"] for st in passrole] == ["arn:aws:iam::*:role/raystudy-worker"]
    assert not any("*" == a or a.endswith(":*") for a in actions(launcher) | actions(worker))
    runbook = (REPO / "docs" / "cluster.md").read_text()
    assert "cluster/iam/worker-policy.json" in runbook and "raystudy-worker" in runbook


def test_local_cluster_installs_the_tree_and_tells_every_node_the_head():
    cfg = load("cluster.local.yaml")
    assert cfg["provider"]["type"] == "local" and {"head_ip", "worker_ips"} <= set(cfg["provider"])
    assert cfg["file_mounts"] == {"~/raystudy-src": "."}
    assert "python -m pip install -q -e ~/raystudy-src" in cfg["setup_commands"]
    assert any("node.sh env" in c and "$RAY_HEAD_IP" in c for c in cfg["worker_setup_commands"])


# ---------------------------------------------------------------- the shared-host `ray`


@pytest.mark.slow
def test_shared_host_ray_stop_stops_only_its_own_cluster():
    import psutil

    mine = tempfile.mkdtemp(prefix="rsc", dir="/tmp")
    # A stand-in for someone else's Ray: a process named like a Ray one, under another temp dir.
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "--temp-dir=/tmp/someone-else"])
    env = {
        **os.environ,
        "RAYSTUDY_RAY_TEMP_DIR": mine,
        "RAY_AUTH_MODE": "disabled",
        "RAYSTUDY_RAY_START_ARGS": " ".join(
            f"--{k}={free_port()}"
            for k in ("dashboard-port", "ray-client-server-port", "dashboard-agent-listen-port", "metrics-export-port")
        ),
        "PATH": f"{WRAPPER.parent}:{Path(sys.executable).parent}:{os.environ['PATH']}",
    }
    try:
        p = subprocess.run(
            ["ray", "start", "--head", f"--port={free_port()}", "--num-cpus=1", "--dashboard-host=127.0.0.1"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
        procs = [q for q in psutil.process_iter(["cmdline"]) if mine in " ".join(q.info["cmdline"] or ())]
        assert {q.name() for q in procs} >= {"raylet", "gcs_server"}
        p = subprocess.run(["ray", "stop"], env=env, capture_output=True, text=True, timeout=60)
        assert p.returncode == 0 and "stopped" in p.stdout, p.stdout + p.stderr
        assert not [q for q in procs if q.is_running() and q.status() != psutil.STATUS_ZOMBIE]
        assert other.poll() is None  # untouched
        env.pop("RAYSTUDY_RAY_TEMP_DIR")
        p = subprocess.run(["ray", "stop"], env=env, capture_output=True, text=True, timeout=60)
        assert p.returncode == 2 and "refusing a machine-wide `ray stop`" in p.stderr
    finally:
        other.kill()
        subprocess.run(
            [sys.executable, str(WRAPPER), "stop"],
            env={**env, "RAYSTUDY_RAY_TEMP_DIR": mine},
            capture_output=True,
            timeout=60,
        )
        shutil.rmtree(mine, ignore_errors=True)


# ---------------------------------------------------------------- `ray up cluster.local.yaml`, for real


def answers(url: str, timeout: float = 2.0, host: str | None = None) -> int | None:
    """HTTP status of ``url``, or None when nothing listens there."""
    req = urllib.request.Request(url, headers={"Host": host} if host else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


def exports(path: Path) -> dict[str, str]:
    """The ``export NAME=VALUE`` lines of a shell file."""
    out = {}
    for line in path.read_text().splitlines():
        if line.startswith("export "):
            k, _, v = line[len("export ") :].partition("=")
            out[k] = v
    return out


MISSING = [t for t in ("/usr/sbin/sshd", "ssh", "ssh-keygen", "rsync", "nc") if shutil.which(t) is None]
HEAD, WORKERS = 1, (2, 3)

# What answers() does, run on a host: the status, or "None".
_ANSWERS = """
import sys, urllib.request, urllib.error
req = urllib.request.Request(sys.argv[1], headers={"Host": sys.argv[2]} if sys.argv[2] else {})
try:
    with urllib.request.urlopen(req, timeout=2) as r: print(r.status)
except urllib.error.HTTPError as e: print(e.code)
except OSError: print(None)
"""


class HostsCluster:
    """cluster.local.yaml brought up over three test hosts (cluster/hosts.py), as a user brings it up
    over three machines: an SSH server on each, the head at 10.77.0.1 with no CPUs for trials, two
    1-CPU workers at 10.77.0.2-3; `ray up` run on the head. Each host's user has a home of its own
    (``homes/hK``) and, first on its PATH, cluster/shared-host/ray: the hosts share this machine's
    processes, and Ray's own `ray stop` stops every Ray on it."""

    def __init__(self, work: Path, demo_weights: Path):
        self.name = f"raystudy-test-{os.getpid()}"
        self.hosts = hosts_module().Hosts(3, work / "hosts", keep=[REPO, Path(sys.prefix)])
        self.work = self.hosts.root  # every host sees it: the keys, the SSH servers' files, the HOMEs
        self.homes = self.hosts.root / "homes"
        self.home = self.homes / f"h{HEAD}"
        self.storage = self.hosts.shared / "storage"  # every host mounts it at the same path
        self.ports = {"ssh": 22, "ray": 6379, "dashboard": 8265, "mlflow": 5000}  # each host has its own
        self.ray_tmp = f"/tmp/rsc{os.getpid()}"  # + "-hK": the processes of each host's Ray name it
        self.user, self.key = getpass.getuser(), self.work / "id_ed25519"
        self.weights = demo_weights
        self.sshd: dict[int, subprocess.Popen] = {}
        self.downed = False

    def up_hosts(self):
        self.hosts.up()
        self.storage.mkdir()
        self.homes.mkdir()
        # Each host's user its own home, as on separate machines: its passwd entry names it (ssh
        # expands ~ from there, as in the head's `-i ~/ray_bootstrap_key.pem` to reach a worker).
        entries = Path("/etc/passwd").read_text().splitlines()
        for k in (HEAD, *WORKERS):
            home = self.homes / f"h{k}"
            home.mkdir()
            passwd = self.work / f"passwd.h{k}"
            fields = [line.split(":") for line in entries]
            for f in fields:
                if f[0] == self.user:
                    f[5] = str(home)
            passwd.write_text("".join(":".join(f) + "\n" for f in fields))
            p = self.hosts.sh(k, f"mount --bind {passwd} /etc/passwd")
            assert p.returncode == 0, p.stderr

    # -- an SSH server on each host, every session with its host's HOME
    def start_sshd(self):
        w = self.work
        for f in (self.key, w / "host_key"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(f)], check=True)
        (w / "authorized_keys").write_text((w / "id_ed25519.pub").read_text())
        session = w / "session.sh"  # ForceCommand: a command runs in bash, which reads ~/.bashrc
        session.write_text(
            '#!/bin/bash\ncd "$HOME"\n'
            'if [ -n "$SSH_ORIGINAL_COMMAND" ]; then exec /bin/bash -c "$SSH_ORIGINAL_COMMAND"; '
            "else exec /bin/bash -l; fi\n"
        )
        session.chmod(0o755)
        os.makedirs("/run/sshd", exist_ok=True)  # its privilege-separation directory
        for k in (HEAD, *WORKERS):
            config = w / f"sshd_config.h{k}"
            config.write_text(
                "\n".join(
                    [
                        f"ListenAddress {self.hosts.address(k)}",
                        f"HostKey {w / 'host_key'}",
                        f"PidFile {w / f'sshd.h{k}.pid'}",
                        f"AuthorizedKeysFile {w / 'authorized_keys'}",
                        "StrictModes no",  # the keys live under /tmp
                        "PubkeyAuthentication yes",
                        "PasswordAuthentication no",
                        "KbdInteractiveAuthentication no",
                        "PermitRootLogin prohibit-password",
                        "UsePAM no",
                        "AllowTcpForwarding yes",
                        "X11Forwarding no",
                        "PrintMotd no",
                        f"ForceCommand {session}",
                        "",
                    ]
                )
            )
            log = open(w / f"sshd.h{k}.log", "w")
            self.sshd[k] = self.hosts.popen(
                k, ["/usr/sbin/sshd", "-D", "-e", "-f", str(config)], stdout=log, stderr=subprocess.STDOUT
            )
        for k in self.sshd:
            probe = f"import socket; socket.create_connection(('{self.hosts.address(k)}', 22), timeout=1).close()"
            wait_for(
                lambda k=k, probe=probe: (
                    self.sshd[k].poll() is None
                    and self.hosts.run(HEAD, [sys.executable, "-c", probe], capture_output=True).returncode == 0
                ),
                timeout=30,
                what=f"sshd on h{k}",
            )

    # -- each host's user: a HOME, a Python environment, the demo's weights
    def write_user_env(self):
        import site

        for k in (HEAD, *WORKERS):
            home = self.homes / f"h{k}"  # made by up_hosts
            # The demo's weights, prefetched (a minute to build): the file and its manifest, without
            # which a host takes the file for a damaged one and builds it again.
            from raystudy.models import registry

            cache = home / ".cache" / "raystudy"
            cache.mkdir(parents=True)
            for f in (self.weights, registry.weights_manifest(self.weights)):
                shutil.copy(f, cache / f.name)
            # Its own Python environment (this one's packages, visible through --system-site-packages,
            # without a pip of its own), so that the setup command's `pip install -e` installs the
            # synced tree there and not over this checkout's install, which other tests use.
            venv = home / "venv"
            subprocess.run(
                [sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True
            )
            own = subprocess.run(
                [str(venv / "bin" / "python"), "-c", "import sys; print('\\n'.join(sys.path))"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.split()
            extra = [d for d in site.getsitepackages() if d not in own]
            if extra:  # this Python is a venv itself: the new one's "system" packages are the base's
                new_site = next(d for d in own if d.startswith(str(venv)) and d.endswith("site-packages"))
                (Path(new_site) / "zz_test_python.pth").write_text(
                    "".join(f"import site; site.addsitedir({d!r})\n" for d in extra)
                )
            cpus = 0 if k == HEAD else 1  # the head runs the driver and MLflow, the workers the trials
            (home / ".bashrc").write_text(
                "\n".join(
                    [
                        f"export PATH={WRAPPER.parent}:{venv / 'bin'}:$PATH",
                        f"export RAYSTUDY_RAY_TEMP_DIR={self.ray_tmp}-h{k}",
                        f'export RAYSTUDY_RAY_START_ARGS="--num-cpus={cpus}"',
                        "export RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0",
                        "",
                    ]
                )
            )

    def write_config(self) -> Path:
        """cluster.local.yaml with these hosts filled in; what the test adapts is listed here."""
        cfg = load("cluster.local.yaml")
        cfg["cluster_name"] = self.name
        cfg["provider"].update(head_ip=self.hosts.address(HEAD), worker_ips=[self.hosts.address(k) for k in WORKERS])
        cfg["auth"] = {"ssh_user": self.user, "ssh_private_key": str(self.key)}
        install = "pip install -q -e ~/raystudy-src"
        assert any(install in c for c in cfg["setup_commands"])
        cfg["setup_commands"] = [
            c.replace(install, "pip install -q --no-deps --no-build-isolation -e ~/raystudy-src")
            for c in cfg["setup_commands"]
        ]  # offline: the venv already has the dependencies
        path = self.work / "cluster.yaml"
        path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        self.config = path
        return path

    # -- Ray's CLI, run on the head from the repository root as the README says
    def ray(self, *args, timeout=300) -> subprocess.CompletedProcess:
        env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
        env.pop("RAY_ADDRESS", None)
        exe = shutil.which("ray", path=str(Path(sys.executable).parent)) or "ray"
        return self.hosts.run(HEAD, [exe, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)

    def answers(self, k: int, url: str, host: str = "") -> int | None:
        """``answers(url)`` asked from host ``k``."""
        p = self.hosts.run(k, [sys.executable, "-c", _ANSWERS, url, host], capture_output=True, text=True, timeout=60)
        out = p.stdout.strip()
        return int(out) if out.isdigit() else None

    def head_env(self) -> dict[str, str]:
        return exports(self.home / "raystudy.env")

    def credentials(self) -> dict[str, str]:
        """The tracking server's user and password, as the head made them (raystudy.env sources them)."""
        return exports(self.home / "raystudy-state" / "mlflow-credentials")

    def ray_processes(self, k: int) -> list[str]:
        """The names of the Ray processes running on host ``k``."""
        import psutil

        names = []
        for pid in self.hosts.pids(k):
            try:
                names.append(psutil.Process(pid).name())
            except psutil.Error:
                pass
        return [n for n in names if n in ("raylet", "gcs_server")]

    # -- teardown: everything this cluster started is on its hosts
    def cleanup(self):
        if self.sshd and hasattr(self, "config") and not self.downed:
            self.ray("down", "-y", str(self.config), timeout=120)
        self.hosts.down()


RAYLET_SLOW = "The current node timed out during startup"


@pytest.fixture(scope="module")
def cluster(demo_weights, tmp_path_factory):
    if MISSING:
        pytest.skip(
            f"`ray up` over test hosts needs {', '.join(MISSING)}: apt-get install -y "
            "openssh-server rsync netcat-openbsd (.ci/run installs them)"
        )
    if os.geteuid() != 0:
        pytest.skip("test hosts need root (network namespaces)")
    c = HostsCluster(tmp_path_factory.mktemp("cluster"), Path(demo_weights))
    try:
        c.up_hosts()
        c.start_sshd()
        c.write_user_env()
        c.write_config()
        t0 = time.time()
        p = c.ray("up", "-y", "--no-config-cache", str(c.config), timeout=600)
        if p.returncode != 0 and RAYLET_SLOW in p.stdout + p.stderr:
            # Ray gives a starting raylet a fixed 30 s to register (ray/_private/node.py), which a
            # loaded 2-core machine can miss; the head's start commands begin with `ray stop`.
            print(f"ray up: {RAYLET_SLOW!r}; once more", flush=True)
            p = c.ray("up", "-y", "--no-config-cache", str(c.config), timeout=600)
        assert p.returncode == 0, f"ray up failed:\n{p.stdout[-4000:]}\n{p.stderr[-4000:]}"
        c.up_output = p.stdout + p.stderr
        # `ray up` returns once the head is up; Ray's autoscaler then sets up and starts each worker
        wait_for(lambda: len(_alive_nodes(c)) == 3, timeout=300, what="both worker hosts to join the head's Ray")
        c.up_seconds = time.time() - t0
        yield c
    finally:
        c.cleanup()


def _alive_nodes(cluster) -> list[tuple[str, float]]:
    """(address, CPUs) of every node alive in the head's Ray, asked on the head."""
    code = (
        "import ray; ray.init(address='auto', logging_level='ERROR'); "
        "print(sorted((n['NodeManagerAddress'], n['Resources'].get('CPU', 0.0)) for n in ray.nodes() if n['Alive']))"
    )
    p = cluster.ray("exec", str(cluster.config), f'python -c "{code}"', timeout=120)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    return ast.literal_eval(p.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_ray_up_starts_ray_and_mlflow_on_the_head_and_tells_every_node(cluster):
    env = cluster.head_env()
    ip = env["RAYSTUDY_HEAD_IP"]
    assert ip == "10.77.0.1"
    assert env["RAY_ADDRESS"] == f"{ip}:{cluster.ports['ray']}"
    assert env["MLFLOW_TRACKING_URI"] == f"http://{ip}:{cluster.ports['mlflow']}"
    assert "MLflow tracking server: http://" in cluster.up_output
    # every worker host joined the head's Ray at its own address, with its own CPU for trials
    assert _alive_nodes(cluster) == [("10.77.0.1", 0.0), ("10.77.0.2", 1.0), ("10.77.0.3", 1.0)]
    # every host was told where the head and its tracking server are, and reaches the server
    for k in WORKERS:
        worker_env = exports(cluster.homes / f"h{k}" / "raystudy.env")
        assert {worker_env[n] for n in ("RAY_ADDRESS", "MLFLOW_TRACKING_URI")} == {
            env["RAY_ADDRESS"],
            env["MLFLOW_TRACKING_URI"],
        }
        assert cluster.answers(k, env["MLFLOW_TRACKING_URI"] + "/health") == 200
    # what the README's tunnel command reads: the head's address
    p = cluster.ray("get-head-ip", str(cluster.config))
    assert p.stdout.strip().splitlines()[-1] == ip, p.stdout + p.stderr
    # and on the head, the server's own database, where a driver reads what is done in one query
    p = cluster.ray("exec", str(cluster.config), "echo $MLFLOW_TRACKING_URI $RAYSTUDY_TRACKING_STORE")
    store = f"sqlite:///{cluster.home}/raystudy-state/mlflow.db"
    assert p.stdout.strip().splitlines()[-1] == f"{env['MLFLOW_TRACKING_URI']} {store}", p.stdout + p.stderr
    # the project was installed from the synced tree on every host
    for k in (HEAD, *WORKERS):
        assert (cluster.homes / f"h{k}" / "raystudy-src" / "raystudy" / "__init__.py").exists()
    p = cluster.ray("exec", str(cluster.config), "python -c 'import raystudy; print(raystudy.__file__)'")
    assert f"{cluster.home}/raystudy-src/raystudy/__init__.py" in p.stdout, p.stdout + p.stderr


@pytest.mark.slow
def test_mlflow_and_the_dashboard_are_reachable_only_as_the_config_promises(cluster):
    env = cluster.head_env()
    ip, mport, dport = env["RAYSTUDY_HEAD_IP"], cluster.ports["mlflow"], cluster.ports["dashboard"]
    assert cluster.answers(HEAD, f"http://127.0.0.1:{dport}/") == 200  # the dashboard: the head's loopback only
    assert cluster.answers(HEAD, f"http://{ip}:{dport}/") is None
    assert cluster.answers(2, f"http://{ip}:{dport}/") is None
    # MLflow: on the cluster's private address only, where the workers reach it
    assert cluster.answers(HEAD, f"http://127.0.0.1:{mport}/health") is None
    assert cluster.answers(2, f"http://{ip}:{mport}/health") == 200
    # a request naming another host is refused (DNS rebinding)
    search = f"{env['MLFLOW_TRACKING_URI']}/api/2.0/mlflow/experiments/search?max_results=1"
    assert cluster.answers(2, search, host="mlflow.example.com") == 403
    # from a machine that can only SSH to the head (the README's tunnel): a forward to the head's
    # private address, asked on that machine's loopback
    local = 15000
    tunnel = cluster.hosts.popen(
        3,
        [
            "ssh",
            "-N",
            "-i",
            str(cluster.key),
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "UserKnownHostsFile=/dev/null",
            "-o",
            "ExitOnForwardFailure=yes",
            "-L",
            f"{local}:{ip}:{mport}",
            f"{cluster.user}@{ip}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        wait_for(
            lambda: cluster.answers(3, f"http://localhost:{local}/health") == 200,
            timeout=30,
            what="MLflow through the SSH tunnel",
        )
    finally:
        tunnel.terminate()
        tunnel.wait(timeout=10)


@pytest.mark.slow
def test_the_demo_grid_runs_on_both_worker_hosts_and_lands_once_in_the_heads_mlflow(cluster):
    # As the README submits it: on the head, where RAY_ADDRESS and MLFLOW_TRACKING_URI are set;
    # checkpoints in the folder every host mounts.
    grid = (
        "python -m raystudy.grid --space demo --datasets digits_c --conditions MHA --set steps=40 "
        "--set warmup_steps=4 --set eval_every=20 --set log_every=10 --set batch_size=32 "
        f"--storage {cluster.storage}/ray --quiet"
    )
    t0 = time.time()
    p = cluster.ray("exec", str(cluster.config), grid, timeout=900)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-5000:]
    assert "4 finished, 0 diverged, 0 failed, 0 unfinished" in out, out[-3000:]
    assert "first use: pretraining" not in out  # the prefetched weights were used, not built again
    # the head's ~/raystudy.env gives the grid its snapshot command: one snapshot as it ends
    said = [ln for ln in out.splitlines() if "snapshot of MLflow's store: " in ln]
    assert len(said) == 1 and "/raystudy-backups/mlflow-" in said[0] and ".sqlite.gz (" in said[0], out[-3000:]
    cluster.grid_seconds = time.time() - t0

    uri = cluster.head_env()["MLFLOW_TRACKING_URI"]
    assert cluster.answers(2, f"{uri}/api/2.0/mlflow/experiments/search?max_results=1") == 401  # credentials
    # what the server stored, read from its database on the head
    df = search_runs(f"sqlite:///{cluster.home}/raystudy-state/mlflow.db", "raystudy-demo-vit_demo")
    df = df[df["tags.raystudy.role"] == "trial"]
    assert len(df) == 4 and set(df["tags.raystudy.status"]) == {"finished"}
    assert len(set(df["tags.raystudy.key"])) == 4  # each trial once
    assert set(df["params.condition"]) == {"MHA"}
    assert ((df["metrics.test_acc"] >= 0) & (df["metrics.test_acc"] <= 1)).all()
    # the trials ran on both worker hosts, and none on the head (it has no CPU for them)
    assert {w.split(":")[0] for w in df["tags.raystudy.worker"]} == {"10.77.0.2", "10.77.0.3"}
    assert not (cluster.home / "mlflow.db").exists()  # everything went to the server
    sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True)
    if sha.returncode == 0:  # the synced tree carries .git: runs are tagged with the commit being run
        assert set(df["tags.mlflow.source.git.commit"]) == {sha.stdout.strip()}
    assert list((cluster.storage / "ray").iterdir())  # Tune's experiment under the storage path given


@pytest.mark.slow
def test_ray_down_stops_this_cluster_on_every_host(cluster):
    assert all(cluster.ray_processes(k) for k in (HEAD, *WORKERS)), "the cluster is not running"
    p = cluster.ray(
        "exec", str(cluster.config), "bash ~/raystudy-src/cluster/node.sh stop-mlflow"
    )  # as the README says
    assert p.returncode == 0, p.stdout + p.stderr
    assert not (cluster.home / "raystudy-state" / "mlflow.pid").exists()
    p = cluster.ray("down", "-y", str(cluster.config), timeout=120)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    cluster.downed = True
    wait_for(lambda: not cluster.ray_processes(HEAD), timeout=30, what="the head's Ray processes to stop")
    # `ray down` of a local cluster runs `ray stop` on the head only; a worker's raylet ends itself
    # once its head has been gone for a minute (Ray's gcs_rpc_server_reconnect_timeout_s)
    wait_for(
        lambda: not any(cluster.ray_processes(k) for k in WORKERS),
        timeout=150,
        what="the worker hosts' Ray processes to stop",
    )


def _grants(policy: dict, action: str, arn: str) -> bool:
    """Whether ``policy`` lets ``action`` on ``arn`` through: an Allow matches it and no Deny does
    (IAM's wildcards in actions and resources)."""
    import fnmatch

    def matches(st):
        acts = [st["Action"]] if isinstance(st["Action"], str) else st["Action"]
        res = [st["Resource"]] if isinstance(st["Resource"], str) else st["Resource"]
        return any(fnmatch.fnmatchcase(action, a) for a in acts) and any(fnmatch.fnmatchcase(arn, r) for r in res)

    effects = {st["Effect"] for st in policy["Statement"] if matches(st)}
    return "Allow" in effects and "Deny" not in effects


def test_workers_can_neither_delete_nor_overwrite_the_stores_snapshots_and_the_head_still_writes_them():
    import json

    iam = REPO / "cluster" / "iam"
    worker = json.loads((iam / "worker-policy.json").read_text())
    head = json.loads((iam / "head-policy.json").read_text())
    snapshot = "arn:aws:s3:::YOUR-BUCKET/raystudy/mlflow-backups/mlflow-20260101T000000Z.sqlite.gz"
    for action in ("s3:DeleteObject", "s3:DeleteObjectVersion", "s3:PutObject"):
        assert not _grants(worker, action, snapshot), action
        assert _grants(worker, action, "arn:aws:s3:::YOUR-BUCKET/raystudy/runs/ray/t/checkpoint") or (
            action == "s3:DeleteObjectVersion"
        )
    for action in ("s3:PutObject", "s3:DeleteObject"):  # the head takes and prunes them
        assert _grants(head, action, snapshot), action
    runbook = (REPO / "docs" / "cluster.md").read_text()
    assert "put-bucket-versioning" in runbook and "Status=Enabled" in runbook
