"""Which network interface a trial's collectives use on a node of several hosts.

gloo and NCCL pick their own address by resolving the host name, which a fresh Debian node maps
to 127.0.1.1: rank 0 then tells the other hosts to reach it at the loopback, and the process
group never forms across hosts. Ray already knows the address other nodes reach this node at;
its interface is the one to use.
"""

from __future__ import annotations

import fcntl
import os
import socket
import struct

_SIOCGIFADDR = 0x8915  # Linux: an interface's IPv4 address


def _ipv4_of(name: str) -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name[:15].encode()))
        except OSError:  # no IPv4 address on it
            return None
    return socket.inet_ntoa(packed[20:24])


def interface_of(address: str) -> str | None:
    """The name of the interface holding IPv4 ``address`` on this machine, or None."""
    for _, name in socket.if_nameindex():
        if _ipv4_of(name) == address:
            return name
    return None


def pin_collectives_to_node_address() -> str | None:
    """Point gloo and NCCL at the interface of this node's Ray address (where the user has not set
    them); the interface, or None where it is not found. Runs in each DDP worker before its
    process group forms (``torch_config``)."""
    import ray

    name = interface_of(ray.util.get_node_ip_address())
    if name is not None and name != "lo":
        os.environ.setdefault("GLOO_SOCKET_IFNAME", name)
        os.environ.setdefault("NCCL_SOCKET_IFNAME", name)
    return name


def torch_config():
    """Ray Train's ``TorchConfig`` whose backend pins each worker's collectives to its node's Ray
    address (``pin_collectives_to_node_address``) before the process group forms, and releases the
    workers' placement group when the process group fails to form."""
    from ray.train.torch import TorchConfig
    from ray.train.torch.config import _TorchBackend  # the backend TorchConfig names; no public hook

    class _PinnedBackend(_TorchBackend):
        def on_start(self, worker_group, backend_config):
            try:
                worker_group.execute(pin_collectives_to_node_address)
                super().on_start(worker_group, backend_config)
            except BaseException:
                # Ray Train registers the group for cleanup only after this step, so a failure here
                # left it reserved: the trial's retry then waited for those resources forever.
                worker_group.get_worker_group_state().placement_group_handle.shutdown()
                raise

    class _PinnedTorchConfig(TorchConfig):
        @property
        def backend_cls(self):
            return _PinnedBackend

    return _PinnedTorchConfig()
