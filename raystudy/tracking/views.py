"""What MLflow's UI shows of a study: the runs page's address, the lines that say where to
browse, the adaptive policy's view of a run."""

from __future__ import annotations

import math
from urllib.parse import urlparse

from raystudy.tracking.query import run_status_of, val_curve
from raystudy.tracking.tags import VIEW_KEY


def runs_url(uri: str, exp_id: str, server: str = "http://127.0.0.1:5000") -> str:
    """The UI page of experiment ``exp_id``'s runs in raystudy's view (``share_runs_view``). A
    tracking server serves its own UI; a database store is served by ``mlflow ui`` at ``server``."""
    base = uri.rstrip("/") if urlparse(uri).scheme in ("http", "https") else server
    return f"{base}/#/experiments/{exp_id}/runs?viewStateShareKey={VIEW_KEY}"


def browse_lines(uri: str, exp_id: str) -> list[str]:
    """Where to look at the runs: the command serving a database store, and the runs page."""
    if urlparse(uri).scheme in ("http", "https"):
        return [f"browse: {runs_url(uri, exp_id)}"]
    return [f"browse: mlflow ui --backend-store-uri {uri}", f"  then open {runs_url(uri, exp_id)}"]


def policy_view(cl, run):
    """What the adaptive policy has seen of one recorded trial run (``adaptive.Seen``): its
    validation curve, whether it ended, its best validation accuracy if it finished. A resumed
    driver and a replay of a finished grid both start from it."""
    from raystudy.spaces import adaptive

    status, _ = run_status_of(run.info.status, run.data.tags, run.data.metrics)
    return adaptive.seen_of(val_curve(cl, run.info.run_id), status, run.data.metrics.get("best_val_acc", math.nan))
