"""Ray for a driver: a local Ray on loopback with token authentication, or a cluster to join."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from raystudy.errors import ConfigError


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
    if address in (None, "", "local"):
        loopback_only()
        ray.init(
            num_cpus=num_cpus,
            include_dashboard=dashboard,
            dashboard_host="127.0.0.1",
            _temp_dir=temp_dir,
            log_to_driver=False,
            configure_logging=False,
        )
        token = Path.home() / ".ray" / "auth_token"  # Ray writes it world-readable
        if token.is_file() and token.stat().st_uid == os.getuid():
            token.chmod(0o600)
    else:
        try:
            ray.init(address=address, log_to_driver=False)
        except ConnectionError as e:
            raise ConfigError(f"--address {address}: {str(e).splitlines()[0]}") from None


def loopback_only() -> None:
    """Make Ray's node address 127.0.0.1, as on macOS and Windows: its servers then bind the
    loopback interface instead of every one. Ray 2.60 has no public option for this (it turns
    --node-ip-address 127.0.0.1 into the routable address); its "no cluster" switch does it, in
    this process (read at import) and in the processes Ray starts (from the environment)."""
    from ray._private import ray_constants

    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False
