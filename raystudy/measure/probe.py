"""The probe's library side: x and y loaded and checked against each other and the model, the
measurement of a built model, and the tables it prints and writes.

The command line (``raystudy.commands.probe``) parses and checks the flags and builds the model; the rest
is here. A component's plasticity over the model is the mean over its layers
(``summary.layer_means``), ranked per mode. torch is imported where a function needs it, so that
the command line's ``--help`` needs none.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from raystudy.errors import ConfigError
from raystudy.measure import summary

INTERVAL = ("ci_low", "ci_high")  # the 95% t interval of each mean, which the table and figure show


def aggregate(df):
    """Model-level plasticity per (model, dataset, mode, component) and its rank.

    The aggregate is the mean over layers of the per-layer means (``summary.layer_means``: every
    layer weighs the same, whatever its n); rank 1 is the most plastic component.
    """
    from raystudy.measure import plasticity

    keys = [k for k in ("model", "dataset", "mode") if k in df]
    extra = [c for c in df.columns if c not in (*plasticity.COLUMNS, *INTERVAL) and df[c].nunique(dropna=False) > 1]
    keys += extra
    by = keys + ["component"]
    agg = (
        df.groupby(by, sort=False)
        .agg(layer_min=("mean", "min"), layer_max=("mean", "max"), layers=("layer", "nunique"))
        .reset_index()
    )
    # Both group by the same keys in the table's order: row for row the same groups.
    agg.insert(len(by), "plasticity", summary.layer_means(df, by).to_numpy())
    groups = agg.groupby(keys, sort=False)
    agg["rank"] = groups["plasticity"].rank(ascending=False, method="min").astype(int)
    order = groups.ngroup()  # keep the table's own order of modes, not the alphabet's
    return agg.assign(_g=order).sort_values(["_g", "rank"], kind="stable").drop(columns="_g").reset_index(drop=True)


def format_tables(df) -> list[str]:
    """Lines of the per-layer tables (mean P, bound) and the ranking of each mode."""
    from raystudy.measure import plasticity

    lines = []
    agg = aggregate(df)
    comps = [c for c in plasticity.PROBE_COMPONENTS if c in set(df["component"])]
    for mode in [m for m in plasticity.MODES if m in set(df["mode"])]:
        sub = df[df["mode"] == mode]
        n = int(sub["n"].min())
        lines.append(f"\n{mode}: plasticity P per layer (mean over {n} pairs, [bound])")
        lines.append(f"{'layer':<7}" + "".join(f"{c:>9}{'[bound]':>11}" for c in comps))
        for layer, rows in sub.groupby("layer"):
            cells = rows.set_index("component")
            lines.append(
                f"{layer:<7}" + "".join(f"{cells.at[c, 'mean']:>9.4g} [{cells.at[c, 'bound']:>8.3g}]" for c in comps)
            )
        a = agg[agg["mode"] == mode]
        lines.append(
            f"{'model':<7}" + "".join(f"{a.set_index('component').at[c, 'plasticity']:>9.4g}{'':11}" for c in comps)
        )
        over = sub[(sub["mean"] > sub["bound"] * (1 + 1e-6))]
        if len(over):
            lines.append(
                f"warning: measured above the bound at {len(over)} (layer, component): "
                + ", ".join(f"{r.layer}/{r.component}" for r in over.itertuples())
            )
        lines.append(f"ranking ({mode}): " + " > ".join(f"{r.component} {r.plasticity:.3g}" for r in a.itertuples()))
    return lines


def save_table(df, path_stem: str | Path) -> list[Path]:
    """Write ``df`` as ``<stem>.csv`` and ``<stem>.parquet``; returns the paths."""
    stem = Path(path_stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    csv, parquet = stem.with_name(stem.name + ".csv"), stem.with_name(stem.name + ".parquet")
    df.to_csv(csv, index=False)
    df.to_parquet(parquet, index=False)
    return [csv, parquet]


def check_images(model: str, ic: dict[str, Any], splits) -> None:
    """Both test splits (``(name, dataset)`` pairs) give images of the input shape of ``model``
    (its input config ``ic``); ProbeError naming the one that does not."""
    from raystudy.measure import plasticity

    want = (ic["in_chans"], ic["img_size"], ic["img_size"])
    for name, ds in splits:
        try:
            shape = tuple(plasticity.image_of(ds, 0).shape) if len(ds) else None
        except RuntimeError as e:  # e.g. grey images normalised with an RGB model's mean
            raise plasticity.ProbeError(
                f"dataset {name!r} does not fit model {model!r}, which expects images of "
                f"shape {want}: {str(e).splitlines()[0]}"
            ) from None
        if shape != want:
            raise plasticity.ProbeError(
                f"dataset {name!r} gives images of shape {shape}, model {model!r} expects "
                f"{want}; pick a source and dataset at the model's input size"
            )


def load_data(
    model: str,
    dataset: str,
    source: str,
    ic: dict[str, Any],
    *,
    tokens: bool,
    x_tokens=None,
    y_tokens=None,
    x_file: str | None = None,
    y_file: str | None = None,
    seed: int = 0,
    root: str | None = None,
    download: bool = False,
    data: str = "",
) -> dict[str, Any]:
    """x and y (test splits of ``source`` and ``dataset`` at the input size of ``model``, its
    input config ``ic``, or the token ids given, read from ``x_file`` and ``y_file``), their names
    and the downstream class count, their shapes checked against each other and the model.
    ``data``: your own images for ``dataset``."""
    from raystudy.data.splits import build_splits
    from raystudy.models import gpt2

    split = dict(seed=seed, img_size=ic["img_size"], mean=ic["mean"], std=ic["std"], root=root, download=download)
    src = build_splits(source, **split)
    # your own images read with the model's channels, as a finetuning run reads them
    tgt = build_splits(dataset, **split, data=data or "", channels=ic["in_chans"] or 3)
    out = dict(
        x=gpt2.TokenRows(x_tokens) if x_tokens is not None else src.test,
        y=gpt2.TokenRows(y_tokens) if y_tokens is not None else tgt.test,
        x_name=x_file or f"{source} test",
        y_name=y_file or f"{dataset} test",
        num_classes=tgt.num_classes,
    )
    if tokens:  # x and y pair position by position: equal lengths
        lx, ly = len(out["x"][0][0]), len(out["y"][0][0])
        if lx != ly:
            raise ConfigError(
                f"x ({out['x_name']}) has sequences of {lx} tokens, y ({out['y_name']}) "
                f"of {ly}; give token files of equal sequence length"
            )
    else:
        check_images(model, ic, ((source, src.test), (dataset, tgt.test)))
    return out


def run(
    model,
    data: dict[str, Any],
    *,
    model_name: str,
    dataset_name: str,
    n_pairs: int,
    batch_size: int,
    modes: Sequence[str],
    components: Sequence[str],
    seed: int,
    num_workers: int,
    pairing: str,
) -> tuple[Any, list[str]]:
    """Probe the built ``model`` on ``data``'s pairs (``load_data``): the tidy table and the lines
    to print (the tables per mode, the ranking, what a reader of this model should know)."""
    from raystudy.measure import plasticity
    from raystudy.models import registry

    df = plasticity.probe_model(
        model,
        data["x"],
        data["y"],
        n_pairs=n_pairs,
        batch_size=batch_size,
        modes=modes,
        seed=seed,
        model_name=model_name,
        dataset_name=dataset_name,
        components=components,
        num_workers=num_workers,
        pairing=pairing,
    )
    lines = format_tables(df)
    if registry.plasticity_note(model_name):
        lines.append("note: " + registry.plasticity_note(model_name))
    return df, lines
