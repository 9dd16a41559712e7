"""Whether the grid's checkpoint storage, a local path, is the same folder on every node that runs
its trials: Tune and Ray Train write a trial's checkpoints on the node it runs on and read them back
on the node of its retry, and Tune's state on the driver's. On several nodes a folder only one of
them has (a node's /tmp) loses them, or fails later. The driver writes a file there and looks for
it from a task on each other node that may run a trial; a node that does not see it refuses the
grid in one line, before anything runs.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterable
from pathlib import Path

from raystudy.driver import placement

ANSWER_S = 120.0  # how long a node's look may take (a task on a busy node waits for a worker)


def _sees(path: str) -> bool:
    return os.path.exists(path)


def missing(path: Path, c: placement.Cluster, shapes: Iterable[placement.Shape]) -> list[str]:
    """The addresses of ``c``'s nodes, other than the driver's, that may run a trial and do not see
    a file the driver writes in ``path`` (nor answer within ``ANSWER_S``)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = ray.get_runtime_context().get_node_id()
    others = [i for i in placement.hosts(c, shapes) if i < len(c.ids) and c.ids[i] != here]
    if not others:
        return []
    path.mkdir(parents=True, exist_ok=True)
    marker = path / f".raystudy-shared-{uuid.uuid4().hex}"
    marker.write_text("written by the grid's driver to see which nodes share this folder\n")
    try:
        look = ray.remote(num_cpus=0, max_retries=0)(_sees)
        refs = {
            look.options(scheduling_strategy=NodeAffinitySchedulingStrategy(c.ids[i], soft=False)).remote(
                str(marker)
            ): i
            for i in others
        }
        ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=ANSWER_S)
        seen = set()
        for ref in ready:
            try:
                if ray.get(ref):
                    seen.add(refs[ref])
            except Exception:  # noqa: BLE001 - a node that cannot answer does not see it either
                pass
        return sorted((c.nodes[i][0] for i in others if i not in seen), key=placement.in_order)
    finally:
        marker.unlink(missing_ok=True)


def preflight(storage, shapes: Iterable[placement.Shape]) -> None:
    """Before anything runs or is recorded: raise ``placement.Refused`` (one line) where a trial of
    ``shapes`` cannot be placed on the connected Ray's nodes, or where ``storage`` is not the same
    folder on every node that may run one (``check``)."""
    shapes = list(shapes)
    c = placement.cluster()
    placement.check(shapes, c)
    check(storage, c, shapes)


def check(storage, c: placement.Cluster, shapes: Iterable[placement.Shape]) -> None:
    """Raise ``placement.Refused`` (one line) where ``storage``, a local path, is not seen by every node
    of ``c`` that may run a trial; a URI (``s3://...``) is every node's."""
    if "://" in str(storage):
        return
    path = Path(storage)
    lost = missing(path, c, list(shapes))
    if lost:
        import ray

        here = ray.util.get_node_ip_address()
        raise placement.Refused(
            f"the checkpoint storage {path} is not shared by every node that runs trials: "
            f"{', '.join(lost)} do not see a file the driver wrote there on {here}; "
            "give --storage a folder every node mounts at the same path, or s3://BUCKET/PATH"
        )
