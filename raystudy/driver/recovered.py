"""Trials that finished on storage but not in MLflow: recorded from Tune's result files, never trained again.

A store restored to a snapshot older than the grid's storage (a lost head, its store rebuilt from
the bucket) lacks the trials that finished after the snapshot, though Tune's folder under the
grid's ``--storage`` still has them: each trial's ``params.json`` (its config) and ``result.json``
(every result it reported, the last one ``final``). ``record`` writes such a trial's MLflow run
from those files, once, so that the grid counts it done instead of training it again.
"""

from __future__ import annotations

import json
from typing import Any

from raystudy import tracking

PARAMS, RESULTS = "params.json", "result.json"


def record(cl, exp_id: str, parent_id: str, path, keys: set[str]) -> int:
    """Record in MLflow each trial of ``keys`` whose final result is in the Tune folder ``path``
    (a local path or a storage URI); returns how many. A folder that cannot be read records none."""
    found = 0
    for t, results in finished(path, keys):
        _write(cl, exp_id, parent_id, t, results)
        found += 1
    return found


def finished(path, keys: set[str]) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """(``trial`` config, results in order) of each trial under ``path`` whose key is in ``keys``
    and whose results end with a final one; one per key."""
    fs, root = _filesystem(path)
    if fs is None:
        return []
    out: dict[str, tuple[dict[str, Any], list[dict[str, Any]]]] = {}
    for folder in _folders(fs, root):
        try:
            t = json.loads(_read(fs, f"{folder}/{PARAMS}") or "null")["trial"]
            if t.get("key") not in keys or t["key"] in out:  # its results (long for a long trial) are not read
                continue
            lines = (_read(fs, f"{folder}/{RESULTS}") or "").splitlines()
            results = [json.loads(line) for line in lines if line.strip()]
        except (ValueError, KeyError, TypeError, AttributeError):  # cut short: not known to be done
            continue
        if results and results[-1].get("final"):
            out[t["key"]] = (t, results)
    return list(out.values())


def _write(cl, exp_id: str, parent_id: str, t: dict[str, Any], results: list[dict[str, Any]]) -> None:
    """The trial's run (the existing one of its key, else a new one): its curves, its final results, ended."""
    _, run = tracking.trial_status(cl, exp_id, t["key"])
    if run is None:
        run_id = tracking.open_trial(
            cl, exp_id, parent_id, t["key"], t["finetune"], {"raystudy.recovered": "1"}, name=t.get("name")
        )
    else:
        run_id = run.info.run_id
        cl.set_tag(run_id, "raystudy.recovered", "1")
    steps = []
    for r in results:
        steps += list(r.get("history") or [])
        if not r.get("final"):
            steps.append(r)
    tracking.log_steps(cl, run_id, steps, tracking.logged_upto(cl, run_id))
    last = results[-1]
    tracking.finish_trial(cl, run_id, last)
    if last.get("resumed_from"):
        tracking.note_resumed(cl, run_id, last["resumed_from"])


def _filesystem(path):
    """(a pyarrow filesystem, the path on it) of ``path``, or (None, "") if it cannot be reached."""
    import pyarrow.fs

    try:
        if "://" in str(path):
            return pyarrow.fs.FileSystem.from_uri(str(path))
        return pyarrow.fs.LocalFileSystem(), str(path)
    except Exception:  # noqa: BLE001 - storage that cannot be reached holds nothing to record
        return None, ""


def _folders(fs, root: str) -> list[str]:
    """The folders directly under ``root`` (Tune's trial folders among them); none if it is missing."""
    import pyarrow.fs

    try:
        infos = fs.get_file_info(pyarrow.fs.FileSelector(root, allow_not_found=True))
    except OSError:
        return []
    return sorted(i.path for i in infos if i.type == pyarrow.fs.FileType.Directory)


def _read(fs, path: str) -> str | None:
    """The text of ``path``, or None if it is missing or unreadable."""
    try:
        with fs.open_input_stream(path) as f:
            return f.read().decode()
    except (OSError, UnicodeDecodeError):
        return None
