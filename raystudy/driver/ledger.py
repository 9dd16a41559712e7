"""Every result a trial reported, on storage: written as Tune reports it, read back whole.

Two places hold a trial's results on storage, in the same layout (a folder a trial: ``params.json``,
its ``{"trial": ...}`` config, and ``result.json``, one JSON line a result, the last one ``final``):
Tune's own trial folders under a grid's storage, and a search's ledger (``ResultLedger``), written
before the searcher hears of a trial's end. ``reported`` reads either back, for what a kill or a
store restored to an older snapshot left (``driver.reconcile``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ray import tune

PARAMS, RESULTS = "params.json", "result.json"


def of_study(storage: Path, study_name: str) -> Path:
    """The ledger's folder of a search's study: every result its trials reported (``ResultLedger``)."""
    return storage / "results" / study_name


class ResultLedger(tune.Callback):
    """Every result of every trial, written to ``root`` as Tune reports it, before a searcher hears
    of the trial's end: ``root/KEY/params.json`` (``{"trial": ...}``) and ``root/KEY/result.json``
    (one JSON line per result), the layout ``reported`` reads. Tune's own result files are
    staged in Ray's session folder and reach the storage later; a driver killed as a trial ends
    would leave the storage without the results its searcher already counts."""

    def __init__(self, root: Path):
        self.root = Path(root)

    def on_trial_result(self, iteration, trials, trial, result, **info):
        """Appends ``result`` to the trial's file (the folder made with its config first)."""
        from ray.tune.utils.util import SafeFallbackEncoder

        t = trial.config["trial"]
        folder = self.root / t["key"]
        if not (folder / PARAMS).is_file():
            folder.mkdir(parents=True, exist_ok=True)
            (folder / PARAMS).write_text(json.dumps({"trial": t}, cls=SafeFallbackEncoder))
        line = json.dumps({k: v for k, v in result.items() if k != "config"}, cls=SafeFallbackEncoder)
        with open(folder / RESULTS, "a") as f:
            f.write(line + "\n")


def finished(path, keys: set[str]) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """(``trial`` config, results in order) of each trial under ``path`` whose key is in ``keys``
    and whose results end with a final one; one per key."""
    return [found for found in reported(path, keys).values() if final(found[1])]


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
            if key not in keys or (key in out and final(out[key][1])):  # its results (long) are not read
                continue
            lines = (_read(fs, f"{folder}/{RESULTS}") or "").splitlines()
            results = [json.loads(line) for line in lines if line.strip()]
        except (ValueError, KeyError, TypeError, AttributeError):  # cut short: not known to be done
            continue
        if key not in out or final(results) or len(results) > len(out[key][1]):
            out[key] = (t, results)
    return out


def final(results: list[dict[str, Any]]) -> bool:
    """Whether ``results`` end with the trial's final one."""
    return bool(results) and bool(results[-1].get("final"))


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
