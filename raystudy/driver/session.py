"""A driver's session: what a grid or a search holds while it runs, and its parent run.

``Session`` makes sure of the weights its trials load, takes the grid's lock (one driver per
grid or search), starts or joins Ray, and on leaving shuts Ray down and releases the lock,
Ctrl-C ignored. ``parent_run`` drives the MLflow parent run of a grid or search: running while
driven, its status at the end, ``interrupted`` if the driver goes down, never left RUNNING.
Importing this module imports neither Ray nor MLflow.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Self

from raystudy.driver import full_disk, local_ray, lock
from raystudy.driver.interrupt import uninterrupted
from raystudy.errors import disk_full
from raystudy.tracking import connect, record


class Session:
    """``with Session(...)``: weights, then the lock named ``name`` under ``storage``, then Ray.

    ``banner`` is printed once the lock is held, before Ray starts; ``started`` is the time then.
    Raises ``ConfigError`` (another driver holds the lock, Ray cannot be joined) or
    ``models.WeightsUnavailable`` before anything runs; ``KeyboardInterrupt`` passes through.
    """

    def __init__(
        self,
        storage: Path | str,
        name: str,
        model: str,
        *,
        address: str | None,
        num_cpus: int | None,
        temp_dir: str | None,
        dashboard: bool = False,
        banner: str | None = None,
        weights_log: Callable[[str], None] | None = print,
        weights: bool = True,
    ):
        self.storage, self.name, self.model = storage, name, model
        self.ray_args = (address, num_cpus, temp_dir, dashboard)
        self.banner, self.weights_log, self.weights = banner, weights_log, weights
        self.started: float | None = None
        self._held = contextlib.ExitStack()

    def __enter__(self) -> Self:
        from raystudy.train import pretrain

        if self.weights:  # trials load finished files, never build them; a rehearsal's load none
            pretrain.ensure_weights(self.model, log=self.weights_log)
        with contextlib.ExitStack() as held:
            held.enter_context(lock.grid_lock(self.storage, self.name))
            if self.banner:
                print(self.banner, flush=True)
            self.started = time.time()
            local_ray.start_ray(*self.ray_args)
            full_disk.hush()  # from the first write: the handlers Ray has just set
            self._held = held.pop_all()
        return self

    def __exit__(self, *exc) -> None:
        import ray

        with uninterrupted():
            ray.shutdown()
            self._held.close()


def experiment(uri: str, name: str) -> tuple[Any, str]:
    """(an MLflow client of ``uri``, the id of experiment ``name``, created if missing)."""
    cl = connect.client(uri)
    return cl, connect.experiment_id(cl, name, connect.default_artifact_location(uri))


class Parent:
    """A parent run being driven: its ``run_id``, and the ``status`` it is tagged with at the end."""

    def __init__(self, run_id: str):
        self.run_id, self.status = run_id, "finished"


@contextlib.contextmanager
def parent_run(cl, exp_id: str, key: str, name: str, params: dict[str, Any], role: str):
    """Yields the ``Parent`` of a grid or search (``record.parent_run``: found by ``key``, created
    once), tagged ``running`` while driven; at the end tagged with its ``status``, or
    ``interrupted`` if the driver goes down, and ended FINISHED either way; left as it is when
    the store cannot be reached (``connect.TrackingUnavailable``)."""
    parent = Parent(record.parent_run(cl, exp_id, key, name, params, role=role))
    record.tag_parent(cl, parent.run_id, "running")
    reachable = True
    try:
        yield parent
    except connect.TrackingUnavailable:  # nothing can be written: the same command, rerun, closes it
        reachable = False
        raise
    except BaseException:  # a crash or an interrupt of the driver: the parent says so
        with uninterrupted():
            # and no trial run stays RUNNING: a Ctrl-C (a SLURM job's scancel) outside a Tune run,
            # as a run was being opened or recorded from Tune's files, had no Tune run to close it
            _unless_full(record.close_stale, cl, exp_id, mlflow__parentRunId=parent.run_id)
            _unless_full(record.tag_parent, cl, parent.run_id, "interrupted")
        raise
    else:
        _unless_full(record.tag_parent, cl, parent.run_id, parent.status)
    finally:
        if reachable:
            with uninterrupted():
                _unless_full(record.end_run, cl, parent.run_id)


def _unless_full(write: Callable[..., Any], *args, **kwargs) -> None:
    """``write(*args, **kwargs)``, left undone on a full disk (the driver has said so in one line;
    the same command, rerun, writes it)."""
    try:
        write(*args, **kwargs)
    except Exception as e:
        if not disk_full(e):
            raise
