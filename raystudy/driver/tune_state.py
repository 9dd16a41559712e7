"""Tune's saved state of an interrupted run: restored where it is whole and a grid's, else set aside
(kept for a post-mortem) for a fresh run."""

from __future__ import annotations

import json
import os
import pickle
import time
from pathlib import Path


def folder(storage, name: str):
    """Tune's experiment folder ``name`` under the grid's storage (a local path, or a URI as a string)."""
    return f"{str(storage).rstrip('/')}/{name}" if "://" in str(storage) else storage / name


def restore(path, trainable):
    """(the Tuner of an interrupted run of this grid, "") or (None, why not): its state cannot
    be read (half written: a full disk), is not a grid's (no ``trial`` grid in its param space),
    or is not whole (``_unwhole``): Tune would start trials without their config."""
    from ray import tune

    try:
        if isinstance(path, Path):  # Tune keeps the param space's shape in tuner.pkl; it does not check it
            with open(path / "tuner.pkl", "rb") as f:
                shape = pickle.load(f).get("__flattened_param_space_keys")
            if shape is not None and "trial/grid_search" not in shape:
                return None, f"its param space ({', '.join(shape)}) has no trial grid"
            for state in path.glob("experiment_state-*.json"):  # cut short by a full disk: unusable
                json.loads(state.read_text())
            why = _unwhole(path)
            if why:
                return None, why
        return tune.Tuner.restore(str(path), trainable, resume_unfinished=True, resume_errored=True), ""
    except Exception as e:  # noqa: BLE001 - any unreadable state is handled the same way
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
        return None, f"{type(e).__name__}: {first}"


def _unwhole(path: Path) -> str:
    """Why the Tune state at ``path`` is not whole, or "". A session saves the trials' state, then
    the search's (which trials of the grid it has made), each a file named by the session; Tune's
    restore takes the newest of each. A driver killed before the first or between the two (as a
    Tune run begins) leaves a state whose search Tune rebuilds from the param space, which a
    restore does not have: it makes trials with no config. Tune writes its state in the driver's
    staging folder and copies it to the storage: a disk that fills during the copy leaves the
    search's file cut short, with the same result."""
    import ray.cloudpickle

    states = sorted(path.glob("experiment_state-*.json"))
    if not states:
        return "it has no experiment state: the driver stopped before Tune's first save"
    session = states[-1].name.removeprefix("experiment_state-").removesuffix(".json")
    search = path / f"basic-variant-state-{session}.json"
    if not search.is_file():
        return "its search state of the last session is missing: the driver stopped while Tune saved"
    try:
        with search.open("rb") as f:
            ray.cloudpickle.load(f)
    except (pickle.UnpicklingError, EOFError):
        size = search.stat().st_size
        return f"its search state of the last session is cut short ({size} bytes): the disk filled as Tune saved"
    return ""


def set_aside(path, storage, name: str):
    """A folder for a fresh run, returned: the unusable one is renamed (kept for a post-mortem),
    or on object storage a new name is used."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    if isinstance(path, Path):
        os.replace(path, path.with_name(f"{name}.unrestorable-{stamp}"))
        return path
    return f"{str(storage).rstrip('/')}/{name}-{stamp}"
