"""Whether a grid's trials can be placed on the connected Ray at all, said in one line before Tune
waits for them; what a waiting trial needs, in the console's words.

Ray waits for a placement group no node can hold, silently and forever. A trial is a placement
group of its own process's bundle and, for a multi-worker trial, its TorchTrainer's group of
``workers`` bundles (``trial.worker_bundle``, placed ``trial.WORKER_PLACEMENT``). PACK and SPREAD
are both soft: each bundle must fit on one node, the bundles of a group may go to any nodes.

The rule on an autoscaling cluster: the nodes counted are those up now and, where the cluster's
autoscaling config is on the driver's machine (``ray up`` writes it on the head as
``~/ray_bootstrap_config.yaml``, where the grid runs), as many of each worker node type as it may
add (its ``max_workers``, and the cluster's). A trial none of these can hold is refused. Where a
node type the autoscaler may add does not list its resources, or the driver runs off the head of
a cluster whose autoscaler reports node types of its config, what they hold is not known: the
driver then says in one line that the trials may wait for the autoscaler, and refuses nothing.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from raystudy.errors import ConfigError

TRIAL_DRIVER_MEMORY = 256 * 1024**2  # bytes Ray sets aside for a multi-worker trial's own process
BOOTSTRAP = Path.home() / "ray_bootstrap_config.yaml"  # what ``ray up`` leaves on the head
SHOWN = ("CPU", "GPU", "memory")  # resources a trial asks for, in the order they are shown


class Refused(ConfigError):
    """A grid refused before it starts: a trial the cluster cannot hold, storage not every node sees."""


@dataclass(frozen=True)
class Shape:
    """What one trial asks of Ray: its own process's bundle, and ``workers`` bundles ``worker``
    placed ``strategy`` (none for a single-process trial)."""

    own: dict[str, float]
    worker: dict[str, float] | None = None
    workers: int = 0
    strategy: str = "PACK"

    def describe(self) -> str:
        """``{CPU: 1}``; ``2 x {CPU: 1}`` for a multi-worker trial (its own process's memory aside)."""
        return f"{self.workers} x {resources_text(self.worker)}" if self.worker else resources_text(self.own)


def shape(workers: int, cpu: float, gpu: float, rehearse: bool = False) -> Shape:
    """The shape of a trial of ``workers`` processes of ``cpu`` CPUs and ``gpu`` GPUs (a rehearsal's:
    one CPU, whatever the trial would ask)."""
    from raystudy.train import trial

    if rehearse:
        return Shape({"CPU": 1.0})
    if workers > 1:
        bundle = trial.worker_bundle({"cpu": cpu, "gpu": gpu})
        return Shape({"CPU": 0.0, "memory": float(TRIAL_DRIVER_MEMORY)}, bundle, workers, trial.WORKER_PLACEMENT)
    return Shape({"CPU": float(cpu), "GPU": float(gpu)})


def of_trial(t: dict[str, Any], rehearse: bool = False) -> Shape:
    """The shape of a trial as Tune carries it (``Trial.as_dict``)."""
    return shape(int(t["workers"]), float(t["cpu"]), float(t["gpu"]), rehearse)


def _number(v: float) -> str:
    return f"{v:g}"


def resources_text(res: dict[str, float] | None, keys: Iterable[str] | None = None) -> str:
    """``{CPU: 2, GPU: 1, memory: 256 MiB}``: ``keys`` (default: those asked, above 0) of ``res``."""
    res = res or {}
    keys = [k for k in SHOWN if res.get(k, 0) > 0] if keys is None else list(keys)
    parts = []
    for k in keys:
        v = float(res.get(k, 0))
        parts.append(f"{k}: {_bytes(v) if k == 'memory' else _number(v)}")
    return "{" + ", ".join(parts) + "}"


def _bytes(n: float) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def count(bundle: dict[str, float], node: dict[str, float]) -> int:
    """How many ``bundle``s ``node``'s resources hold (a bundle asking nothing: any number)."""
    asked = [(k, v) for k, v in bundle.items() if v > 0]
    if not asked:
        return 1 << 30
    return min(math.floor(node.get(k, 0.0) / v + 1e-9) for k, v in asked)


def fits(s: Shape, nodes: list[dict[str, float]]) -> bool:
    """Whether ``nodes`` (each its resources) hold a trial of shape ``s``."""
    if not any(count(s.own, n) for n in nodes):
        return False
    if not s.worker:
        return True
    held = [count(s.worker, n) for n in nodes]
    if s.strategy == "STRICT_PACK":
        return max(held, default=0) >= s.workers
    if s.strategy == "STRICT_SPREAD":
        return sum(h > 0 for h in held) >= s.workers
    return sum(held) >= s.workers  # PACK, SPREAD: soft, bundles on any nodes


@dataclass
class Cluster:
    """The nodes a trial may be placed on: ``nodes`` (address, resources) up now, ``addable``
    (node type, resources, how many) the autoscaler may add, and ``unknown``: node types it may
    add whose resources its config does not say."""

    nodes: list[tuple[str, dict[str, float]]]
    addable: list[tuple[str, dict[str, float], int]]
    unknown: list[str]
    ids: list[str] = field(default_factory=list)  # Ray's id of each of ``nodes``, where known

    def capacity(self) -> list[dict[str, float]]:
        """Every node's resources, those the autoscaler may add included (up to 64 of a type:
        a trial needs no more)."""
        return [r for _, r in self.nodes] + [r for _, r, n in self.addable for _ in range(min(n, 64))]


def at_once(s: Shape, c: Cluster) -> int:
    """How many trials of shape ``s`` the nodes of ``c`` hold at once, those its autoscaler may add
    included (``Cluster.capacity``): 0 where none known holds one."""
    nodes = c.capacity()
    if not s.worker:
        return sum(min(count(s.own, n), 1 << 20) for n in nodes)
    held = [count(s.worker, n) for n in nodes]
    if s.strategy == "STRICT_PACK":
        return sum(h // s.workers for h in held)
    return sum(held) // s.workers


def autoscaling(config: dict[str, Any] | None) -> tuple[list[tuple[str, dict[str, float], int]], list[str]]:
    """From a cluster's autoscaling config: (the worker node types it may add, with their resources
    and how many; the names of those whose resources it does not list)."""
    if not config:
        return [], []
    types = config.get("available_node_types") or {}
    head = config.get("head_node_type")
    limit = int(config.get("max_workers", 1 << 30) or 0)
    addable, unknown = [], []
    for name, t in types.items():
        n = min(int((t or {}).get("max_workers", limit) or 0), limit)
        if name == head or n <= 0:
            continue
        res = (t or {}).get("resources")
        if res:  # memory, not listed, is the machine's: a trial's own process asks little of it
            addable.append((name, {"memory": math.inf, **{k: float(v) for k, v in res.items()}}, n))
        else:
            unknown.append(name)
    return addable, unknown


def autoscaler_types(status: str | bytes | None) -> list[str]:
    """The node types an autoscaler reports in Ray's ``__autoscaling_status`` (``status``, its JSON):
    those of a cluster config; none where the cluster has no autoscaler of its own (Ray's read-only
    stand-in names each node ``node_<id>``)."""
    try:
        report = json.loads(status)["autoscaler_report"]
    except (TypeError, ValueError, KeyError):
        return []
    names = {*(report.get("active_nodes") or {}), *(report.get("idle_nodes") or {})}
    names |= {*(report.get("pending_launches") or {}), *(p[1] for p in report.get("pending_nodes") or [])}
    return sorted(n for n in names if not str(n).startswith("node_"))


def _autoscaling_status() -> bytes | None:
    try:
        from ray._private import ray_constants
        from ray.experimental.internal_kv import _internal_kv_get

        return _internal_kv_get(ray_constants.DEBUG_AUTOSCALING_STATUS)
    except Exception:  # noqa: BLE001 - no status: no autoscaler known
        return None


def _bootstrap() -> dict[str, Any] | None:
    try:
        return yaml.safe_load(BOOTSTRAP.read_text())
    except (OSError, yaml.YAMLError):
        return None


def cluster() -> Cluster:
    """The connected Ray's alive nodes, and what its autoscaler may add (``autoscaling``)."""
    import ray

    alive = sorted((n for n in ray.nodes() if n.get("Alive")), key=lambda n: in_order(n["NodeManagerAddress"]))
    config = _bootstrap()
    addable, unknown = autoscaling(config)
    if config is None:  # not on the head: an autoscaler there may add nodes of types unknown here
        unknown = autoscaler_types(_autoscaling_status())
    nodes = [(n["NodeManagerAddress"], dict(n["Resources"])) for n in alive]
    return Cluster(nodes, addable, unknown, [n["NodeID"] for n in alive])


def in_order(address: str) -> tuple:
    """IPv4 addresses in their numeric order (10.0.0.2 before 10.0.0.10), others after, by name."""
    parts = address.split(".")
    return (0, *map(int, parts)) if all(p.isdigit() for p in parts) else (1, address)


def hosts(c: Cluster, shapes: Iterable[Shape]) -> list[int]:
    """The indices of ``c``'s nodes up now that can run a trial's process: a single-process trial,
    or a worker of a multi-worker one (its own process asks only memory; a node of no CPU runs it)."""
    bundles = list({tuple(sorted(b.items())): b for b in (s.worker or s.own for s in shapes)}.values())
    return [i for i, (_, res) in enumerate(c.nodes) if any(count(b, res) > 0 for b in bundles)]


def nodes_text(c: Cluster, s: Shape) -> str:
    """What the nodes have of what ``s`` asks, identical nodes together: ``{CPU: 1} on 10.0.0.2, 10.0.0.3``."""
    asked = dict(s.worker or s.own)
    if not any(count(s.own, r) for r in c.capacity()):  # a multi-worker trial's own process: memory
        asked.update(s.own)
    keys = [k for k in SHOWN if asked.get(k, 0) > 0] or ["CPU"]
    groups: dict[str, list[str]] = {}
    for addr, res in c.nodes:
        groups.setdefault(resources_text(res, keys), []).append(addr)
    parts = []
    for text, addrs in groups.items():
        shown = ", ".join(addrs[:3]) + (f" and {len(addrs) - 3} more" if len(addrs) > 3 else "")
        parts.append(f"{text} on {shown}")
    parts += [f"up to {n} x {resources_text(res, keys)} to add ({name})" for name, res, n in c.addable]
    return "; ".join(parts) or "no nodes"


def problem(s: Shape, c: Cluster, where: str = "") -> str | None:
    """The one line refusing a trial of shape ``s`` that no node of ``c`` can hold, or None."""
    if fits(s, c.capacity()):
        return None
    if s.worker:
        need = (
            f"{s.workers} workers of {resources_text(s.worker)} each (placed {s.strategy}: "
            "each worker on one node, the workers on any)"
        )
    else:
        need = f"{resources_text(s.own)} on one node"
    return (
        f"a trial{where} cannot be placed on this Ray cluster: it needs {need}, and the nodes have "
        f"{nodes_text(c, s)}; ask for less (the space's models: workers, cpu, gpu) or add nodes that hold it"
    )


def check(shapes: Iterable[Shape], c: Cluster | None = None, log=print) -> None:
    """Raise ``Refused`` (one line) for the first of ``shapes`` that the cluster ``c`` (default:
    the connected Ray's, ``cluster``) cannot hold. Where the autoscaler may add nodes of unknown
    resources, one line says the trials may wait for them instead."""
    c = cluster() if c is None else c
    seen: list[Shape] = []
    for s in shapes:
        if s in seen:
            continue
        seen.append(s)
        why = problem(s, c)
        if why is None:
            continue
        if c.unknown:
            log(
                f"note: no node up now holds a trial ({s.describe()}); the trials wait for the autoscaler to add "
                f"one (node types {', '.join(c.unknown)}, whose resources the driver cannot read here)"
            )
            return
        raise Refused(why)
