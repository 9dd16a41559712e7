"""Trials that finished on storage but not in MLflow: recorded from Tune's result files, never trained again.

A store restored to a snapshot older than the grid's storage (a lost head, its store rebuilt from
the bucket) lacks the trials that finished after the snapshot, though Tune's folder under the
grid's ``--storage`` still has them: each trial's ``params.json`` (its config) and ``result.json``
(every result it reported, the last one ``final``). ``record`` writes such a trial's MLflow run
from those files, once, so that the grid counts it done instead of training it again. Under an
adaptive policy, ``record_stopped`` records the trials the policy stopped (their results end
without a final one, or they never started) ``stopped``, deciding as the live scheduler does.
"""

from __future__ import annotations

import json
from typing import Any

from raystudy.tracking import query
from raystudy.tracking import record as tracking

PARAMS, RESULTS = "params.json", "result.json"


def record(cl, exp_id: str, parent_id: str, path, keys: set[str], tags: dict[str, str] | None = None) -> int:
    """Record in MLflow each trial of ``keys`` whose final result is in the Tune folder ``path``
    (a local path or a storage URI); returns how many; ``tags`` go on a run made anew. A folder
    that cannot be read records none."""
    found = 0
    for t, results in finished(path, keys):
        _write(cl, exp_id, parent_id, t, results, tags)
        found += 1
    return found


def record_ended(cl, exp_id: str, parent_id: str, paths, keys: set[str], tags: dict[str, str] | None = None) -> int:
    """Record in MLflow each trial of ``keys`` as its results in the Tune folders ``paths`` end:
    ``finished`` on a final result, else ``stopped`` at its last step. For trials Tune is known to
    have ended (a searcher holds them done: an early-stopping scheduler stopped those without a
    final result); ``tags`` go on a run made anew. Returns how many; a trial with no result, none."""
    found: dict[str, tuple[dict[str, Any], list[dict[str, Any]]]] = {}
    for path in paths:
        for key, got in reported(path, keys).items():
            if key not in found or (_final(got[1]) and not _final(found[key][1])):
                found[key] = got
    ended = [(t, results) for t, results in found.values() if results]
    for t, results in ended:
        _write(cl, exp_id, parent_id, t, results, tags)
    return len(ended)


def record_stopped(
    cl, exp_id: str, parent_id: str, paths, keys: set[str], policy, trials: list, tags: dict[str, str] | None = None
) -> int:
    """Record ``stopped`` each trial of ``keys`` (none done in MLflow) that the adaptive ``policy``
    stops, deciding on what MLflow holds of the grid's ``trials`` and what those of ``keys``
    reported to the Tune folders ``paths``, as the live scheduler did (or would, on the trial's next
    result). Its run gets the steps it reported and ends stopped at the last (0: it never
    started), as the live driver records it; returns how many; ``tags`` go on a run made anew."""
    from raystudy.driver import scheduler
    from raystudy.spaces import adaptive

    found: dict[str, tuple[dict[str, Any], list[dict[str, Any]]]] = {}
    for path in paths:
        found.update(reported(path, keys))  # a key is in one part's folder
    seen = scheduler.recorded_view(cl, exp_id, trials)
    for key, (_, results) in found.items():
        s = adaptive.Seen()
        for r in results:
            s = scheduler.observed(s, r)
        seen[key] = s
    decisions = adaptive.decide(policy, [adaptive.trial_of(t.key, t.config) for t in trials], seen)
    n = 0
    for t in trials:
        if t.key in keys and t.key in decisions:
            config, results = found.get(t.key, (t.as_dict(), []))
            _write(cl, exp_id, parent_id, config, results, tags)
            n += 1
    return n


def finished(path, keys: set[str]) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """(``trial`` config, results in order) of each trial under ``path`` whose key is in ``keys``
    and whose results end with a final one; one per key."""
    return [found for found in reported(path, keys).values() if _final(found[1])]


def reported(path, keys: set[str]) -> dict[str, tuple[dict[str, Any], list[dict[str, Any]]]]:
    """Key -> (``trial`` config, results in order) of each trial under ``path`` whose key is in
    ``keys``: of a key's folders, the first whose results end with a final one, else the longest."""
    fs, root = _filesystem(path)
    if fs is None:
        return {}
    out: dict[str, tuple[dict[str, Any], list[dict[str, Any]]]] = {}
    for folder in _folders(fs, root):
        try:
            t = json.loads(_read(fs, f"{folder}/{PARAMS}") or "null")["trial"]
            key = t.get("key")
            if key not in keys or (key in out and _final(out[key][1])):  # its results (long) are not read
                continue
            lines = (_read(fs, f"{folder}/{RESULTS}") or "").splitlines()
            results = [json.loads(line) for line in lines if line.strip()]
        except (ValueError, KeyError, TypeError, AttributeError):  # cut short: not known to be done
            continue
        if key not in out or _final(results) or len(results) > len(out[key][1]):
            out[key] = (t, results)
    return out


def _final(results: list[dict[str, Any]]) -> bool:
    """Whether ``results`` end with the trial's final one."""
    return bool(results) and bool(results[-1].get("final"))


def _write(
    cl, exp_id: str, parent_id: str, t: dict[str, Any], results: list[dict[str, Any]], tags: dict | None = None
) -> None:
    """The trial's run (the existing one of its key, else a new one, with ``tags``): its curves,
    its final results, ended; results that end without a final one (stopped by the policy or a
    scheduler) end it ``stopped``."""
    _, run = query.trial_status(cl, exp_id, t["key"])
    if run is None:
        extra = {"raystudy.recovered": "1", **(tags or {})}
        run_id = tracking.open_trial(cl, exp_id, parent_id, t["key"], t["finetune"], extra, name=t.get("name"))
    else:
        run_id = run.info.run_id
        cl.set_tag(run_id, "raystudy.recovered", "1")
    rec = tracking.TrialRecord(cl, run_id)  # as the live driver records it, a stopped trial included
    rec.log(results)
    rec.end(results[-1] if results else {})


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
