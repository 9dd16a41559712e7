"""The model checked before any trial: built on the meta device (no memory, no weights read
into it), every parameter placed in exactly one study component, and a given checkpoint's
backbone keys and shapes matching it as timm maps them.

Every command that starts trials (grid, search, finetune, probe, and ``raystudy init`` for the
space it writes) calls ``check`` before Ray or MLflow, so a model the study cannot partition, or
a checkpoint that does not fit, is one line and exit 2 instead of a grid of failed trials.
"""

from __future__ import annotations

import functools
from pathlib import Path

from raystudy.errors import ConfigError
from raystudy.models import checkpoints, components, registry, sources


def check(name: str, weights: str | Path | None = None, *, skip_registered: bool = False) -> None:
    """Build ``name`` on the meta device and check its partition and ``weights`` (or its source's); ConfigError.

    ``skip_registered``: no build for a model raystudy registers (its partition is under test) and
    no weights given, so a dry run of the paper's or the demo's grid stays free of torch.
    """
    full = registry.check_model(name)
    if skip_registered and weights is None and registry.registered(full):
        return
    ident = _identity(weights) if weights is not None else None
    _check(full, ident, str(weights) if weights is not None else None)


def _identity(weights: str | Path) -> tuple:
    """A file's identity (path, size, mtime), so a rewritten file is checked again."""
    p = Path(weights)
    st = p.stat()
    return (str(p.resolve()), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=16)
def _check(full: str, ident: tuple | None, weights: str | None) -> None:
    """The checks of ``check``, once per model and weights file version."""
    model = meta_model(full)
    try:
        components.partition(model)
    except components.PartitionError as e:
        raise ConfigError(f"model {full!r}: {e}") from None
    if registry.architecture(full).tokens:  # GPT-2's weights load through its own code
        return
    source, folder = sources.split(full)
    if weights is not None:
        _check_fit(full, model, weights, "file")
    elif source == "local-dir":
        _check_fit(full, model, folder, source)


def meta_model(full: str):
    """``full`` built on the meta device with a small head: parameters named and shaped, no storage."""
    import torch

    with torch.device("meta"):
        return registry.create_model(full, 2, pretrained=False)


def _check_fit(full: str, model, source: str, kind: str) -> None:
    """ConfigError unless ``source``'s backbone fits ``model`` (names and shapes, as timm maps them)."""
    try:
        state = checkpoints.mapped(checkpoints.read(source, kind), model)
    except Exception as e:  # noqa: BLE001 - whatever the reader trips on, the checkpoint is the problem
        detail = str(e).splitlines()[0][:160] if str(e) else ""
        raise ConfigError(f"{checkpoints.label(source, kind)} cannot be read: {type(e).__name__}: {detail}") from None
    problem = checkpoints.misfit(model, state)
    if problem:
        raise ConfigError(f"{checkpoints.label(source, kind)} does not fit model {full!r}: {problem}")
