"""A recorded grid as one compact file: what the replay reads, so it runs from a clone without MLflow.

One gzipped CSV, a row per trial: the runs table's columns the replay and the report's lr choice
read (``RUNS``), the policy's view of the trial (``adaptive.trial_of``'s fields; the validation
curve as ``step:value`` pairs, whether it ended, its best validation accuracy) and its cost
(``steps_done``, ``wall_s``). Floats are written in full (17 significant digits), so a replay from the file
decides and concludes exactly what the replay from the store does. The file is byte-for-byte
reproducible (no timestamp in the gzip header).
"""

from __future__ import annotations

import gzip
import io
import math
from pathlib import Path
from typing import Any

import pandas as pd

from analysis import AnalysisError
from raystudy.spaces import adaptive

RUNS = ["key", "model", "optimizer", "low_data", "dataset", "condition", "lr", "seed", "status", "val_acc", "test_acc"]
VIEW = ["steps", "eval_every", "ended", "best", "curve", "steps_done", "wall_s"]


def save(grid: dict[str, Any], path: Path) -> Path:
    """Write ``grid`` (``analysis.replaying.recorded``) to ``path`` (``.csv.gz``); returns the path."""
    runs = grid["runs"]
    by_key = {t["key"]: t for t in grid["trials"]}
    rows = []
    for r in runs.itertuples(index=False):
        t, s = by_key[r.key], grid["seen"].get(r.key, adaptive.Seen())
        row = {c: getattr(r, c) for c in RUNS if c in runs.columns}
        row.update(
            steps=t["steps"],
            eval_every=t["eval_every"],
            ended=int(s.ended),
            best=s.best,
            curve=" ".join(f"{int(st)}:{float(v)!r}" for st, v in s.points),
            steps_done=r.steps_done,
            wall_s=r.wall_s,
        )
        rows.append(row)
    text = pd.DataFrame(rows, columns=RUNS + VIEW).to_csv(index=False, float_format="%.17g")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f, gzip.GzipFile(fileobj=f, mode="wb", mtime=0, filename="") as z:
        z.write(text.encode())
    return path


def load(path: Path) -> dict[str, Any]:
    """The grid ``save`` wrote to ``path``: ``runs``, ``trials``, ``seen`` as ``analysis.replaying.recorded``
    gives them. AnalysisError when the file is missing or lacks a column."""
    path = Path(path)
    if not path.is_file():
        raise AnalysisError(f"recording {str(path)!r}: no such file")
    df = pd.read_csv(io.BytesIO(gzip.decompress(path.read_bytes())), keep_default_na=True)
    missing = [c for c in RUNS + VIEW if c not in df.columns]
    if missing:
        raise AnalysisError(
            f"recording {str(path)!r}: missing columns {', '.join(missing)}; written by analysis.recordings.save?"
        )
    trials, seen = [], {}
    for r in df.itertuples(index=False):
        trials.append(
            {
                "key": r.key,
                "dataset": r.dataset,
                "condition": r.condition,
                "optimizer": r.optimizer,
                "lr": float(r.lr),
                "seed": int(r.seed),
                "steps": int(r.steps),
                "eval_every": int(r.eval_every),
            }
        )
        pts = (
            tuple((int(a), float(b)) for a, b in (p.split(":") for p in str(r.curve).split()))
            if isinstance(r.curve, str)
            else ()
        )
        seen[r.key] = adaptive.Seen(pts, bool(r.ended), float(r.best) if not math.isnan(r.best) else math.nan)
    runs = df[RUNS + ["steps_done", "wall_s"]].copy()
    runs.attrs.update(source=f"recording {path.name}", experiment=path.name.split(".")[0])
    return {"runs": runs, "trials": trials, "seen": seen}


__all__ = ["RUNS", "VIEW", "save", "load"]
