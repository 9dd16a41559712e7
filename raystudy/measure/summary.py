"""A probe's tidy table summarised over a model's layers, without torch.

The probe measures a mean plasticity per (mode, layer, component); what the study compares is a
component's plasticity over the whole model, the mean over its layers. Every reader of the table
(the probe's ranking, the run record's metrics, the analysis report's component table) takes it
from ``layer_means``. Apart from ``plasticity`` (which needs torch) so that the driver and the
analysis read it without loading torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def layer_means(table: Any, by: Sequence[str] = ("mode", "component")):
    """Mean plasticity over layers: per group of ``by`` columns, the mean of the groups' per-layer
    means (column ``mean``; every layer weighs the same, whatever its n). NaN means are left out
    (NaN where a group has none); rows whose ``by`` values are missing belong to no group.

    ``table``: a DataFrame or rows (dicts) of the probe's tidy table. Returns a Series named
    ``plasticity``, indexed by ``by``, the groups in the table's order.
    """
    import pandas as pd

    by = list(by)
    df = table if isinstance(table, pd.DataFrame) else pd.DataFrame(list(table))
    if df.empty:
        index = pd.MultiIndex.from_tuples([], names=by) if len(by) > 1 else pd.Index([], name=by[0])
        return pd.Series([], index=index, dtype=float, name="plasticity")
    values = pd.to_numeric(df["mean"], errors="coerce")  # a value read back from text is a number too
    return values.groupby([df[c] for c in by], sort=False).mean().rename("plasticity")
