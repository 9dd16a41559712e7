"""Ray for a driver: a local Ray on loopback with token authentication, or a cluster to join."""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
from pathlib import Path

from raystudy.errors import ConfigError


class RayUnavailable(ConfigError):
    """The driver's local Ray did not start: said in one line, as an unreachable store is."""


def check_address(address: str | None) -> None:
    """An explicit HOST:PORT must answer before Ray spends a minute retrying; raises ``ConfigError``."""
    if address in (None, "", "auto", "local") or address.startswith(("ray://", "anyscale://")):
        return
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"--address {address!r}: expected auto, local or HOST:PORT")
    try:
        with socket.create_connection((host, int(port)), timeout=5):
            pass
    except OSError as e:
        raise ConfigError(
            f"--address {address}: no Ray cluster answers there ({e.strerror or e}); "
            "start one with `ray up cluster.yaml`, or omit --address for a local Ray"
        ) from None


def start_ray(address: str | None, num_cpus: int | None, temp_dir: str | None, dashboard: bool) -> None:
    """Start a local Ray, or join ``address``.

    A local Ray is a laptop's: every one of its servers (GCS, raylets, workers, agents, dashboard)
    listens on 127.0.0.1 only, and Ray's token authentication stays on (its default for a new
    local cluster; RAY_AUTH_MODE, if set, is respected). A cluster's ports are guarded by its
    network (cluster.yaml's security group, a firewall on-prem).
    """
    import ray

    # Each evaluation checkpoints; Tune then snapshots often and warns about it at length.
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    with term_kept():
        _start_ray(ray, address, num_cpus, temp_dir, dashboard)


class term_kept:
    """SIGTERM as the driver was started with it, once Ray is up, where that was to ignore it.
    ``ray.init`` installs its own handlers (Python's exit, then Abseil's, which prints a stack and
    aborts the driver); a SLURM job's grid ignores TERM, as scancel sends it to every process of the
    job, and its job stops it with SIGINT instead, as a Ctrl-C does (cluster/slurm/job.sh)."""

    def __enter__(self):
        main = threading.current_thread() is threading.main_thread()
        self.ignored = main and signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
        return self

    def __exit__(self, *exc):
        if self.ignored:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _start_ray(ray, address: str | None, num_cpus: int | None, temp_dir: str | None, dashboard: bool) -> None:
    if address in (None, "", "local"):
        loopback_only()
        # Ray says on every start of a local Ray that token authentication is on: it is what
        # raystudy asks for, and the line tells a user nothing to do
        said = logging.getLogger("ray._private.authentication.authentication_token_setup")
        muted = _Unsaid("Token authentication is enabled for this Ray cluster")
        said.addFilter(muted)
        try:
            ray.init(
                num_cpus=num_cpus,
                include_dashboard=dashboard,
                dashboard_host="127.0.0.1",
                _temp_dir=temp_dir,
                log_to_driver=False,
                configure_logging=False,
            )
        except Exception as e:  # its GCS or raylet never came up: killed as it started, a port taken
            # (Ray raises RuntimeError for a GCS that exits, a bare Exception for a node that times out)
            ray.shutdown()  # what did start
            logs = Path(temp_dir or "/tmp/ray") / "session_latest" / "logs"
            raise RayUnavailable(
                f"the local Ray did not start ({str(e).splitlines()[0].strip()}); its logs: {logs}; "
                "run the same command again"
            ) from e
        finally:
            said.removeFilter(muted)
        token = Path.home() / ".ray" / "auth_token"  # Ray writes it world-readable
        if token.is_file() and token.stat().st_uid == os.getuid():
            token.chmod(0o600)
    else:
        check_node_answers(address)
        try:
            ray.init(address=address, log_to_driver=False)
        except ConnectionError as e:
            raise ConfigError(f"--address {address}: {str(e).splitlines()[0]}") from None


def check_node_answers(address: str) -> None:
    """The node of this host that ``ray.init`` will attach the driver to, as the cluster at
    ``address`` lists it, must answer on its raylet's socket; raises ``RayUnavailable`` in one line.
    A raylet that died is listed for seconds more, until the cluster notices, and where another
    node's raylet shows in this host's processes (nodes sharing a machine's process table), Ray
    picks that node and its driver aborts with a C++ stack on the dead socket. A GCS that stopped
    answering since ``check_address`` is refused too: ``ray.init`` retries it for about 40 s a try,
    twenty tries."""
    from ray._private import services
    from ray._private.authentication.authentication_token_setup import ensure_token_if_auth_enabled
    from ray._raylet import GcsClient
    from ray.exceptions import RpcError

    try:
        ensure_token_if_auth_enabled(None, create_token_if_missing=False)
        gcs = GcsClient(address=services.canonicalize_bootstrap_address(address))
        node = services.get_node_to_connect_for_driver(gcs, timeout_seconds=5)
    except RpcError as e:  # its GCS ended since check_address: ray.init would retry it for minutes
        raise RayUnavailable(
            f"--address {address}: the cluster's GCS does not answer ({str(e).splitlines()[0]}); start the "
            "cluster again (ray start --head, or ray up) and run the same command again"
        ) from None
    except (RuntimeError, ConnectionError, ValueError, OSError):
        return  # none listed (yet): ray.init waits for one, and fails in one line if none comes
    with socket.socket(socket.AF_UNIX) as raylet:
        try:
            raylet.connect(node.raylet_socket_name)
        except OSError as e:
            raise RayUnavailable(
                f"--address {address}: the Ray node Ray takes for this host's ({node.node_manager_address}) does "
                f"not answer ({e.strerror or e}): its raylet has ended; start this host's node again (ray start) "
                "and run the same command again"
            ) from None


class _Unsaid(logging.Filter):
    """Drops the log records whose message starts with ``words``."""

    def __init__(self, words: str):
        super().__init__()
        self.words = words

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.words)


def loopback_only() -> None:
    """Make Ray's node address 127.0.0.1, as on macOS and Windows: its servers then bind the
    loopback interface instead of every one. Ray 2.60 has no public option for this (it turns
    --node-ip-address 127.0.0.1 into the routable address); its "no cluster" switch does it, in
    this process (read at import) and in the processes Ray starts (from the environment)."""
    from ray._private import ray_constants

    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False


def worker_processes(temp_dir: str | Path) -> int:
    """How many worker processes the Ray sessions under ``temp_dir`` (a local Ray's ``_temp_dir``)
    have started: each leaves one ``worker-*.out`` in its session's logs, where Ray keeps it (or in
    ``old/`` once the process has ended)."""
    sessions = [d for d in Path(temp_dir).glob("session_*") if not d.is_symlink()]  # not session_latest
    return sum(len(list(d.glob("logs/worker-*.out"))) + len(list(d.glob("logs/old/worker-*.out"))) for d in sessions)
