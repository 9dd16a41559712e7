"""Pretrained weights into a timm ViT the way timm loads them, the head skipped, a misfit named.

A checkpoint is read by timm's own readers (``weights_only``; a torch.save'd state dict, possibly
wrapped under ``model``/``state_dict`` or prefixed by DDP, or safetensors), from a file, a local
folder as timm's ``save_for_hf``/``push_to_hub`` writes it (``config.json`` + weights), or a
Hugging Face hub repo. It then goes through the model's timm checkpoint filter, so a checkpoint
saved at another image size has its position embedding resampled and an original-format
checkpoint (DeiT, CLIP's ``visual.trunk``, ...) is renamed, exactly as ``timm.create_model``
would. Unlike timm's loader, which drops strictness with a new head, every backbone key must
fit: ``misfit`` names the first few missing, unexpected and misshapen keys.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING

from raystudy.models import sources

if TYPE_CHECKING:
    import torch.nn as nn

# Parameters of a classifier head: never loaded (every run gets a fresh head for its classes).
HEADS = ("head.", "head_dist.")
# Where a Hugging Face transformers ViT's parameters sit: names timm does not map.
TRANSFORMERS_PREFIXES = ("vit.", "embeddings.", "encoder.layer.")


class CheckpointMisfit(ValueError):
    """A checkpoint whose backbone keys or shapes do not match the model."""


def read(source: str | Path, kind: str = "file") -> dict:
    """The state dict of ``source``: a file, a ``local-dir`` folder or an ``hf-hub`` repo id (``kind``)."""
    from timm.models import load_state_dict

    if kind == "file":
        return load_state_dict(str(source), weights_only=True)
    from timm.models._hub import load_state_dict_from_hf, load_state_dict_from_path

    if kind == "local-dir":
        return load_state_dict_from_path(source, weights_only=True)
    return load_state_dict_from_hf(str(source), weights_only=True)


def timm_filter(model: nn.Module):
    """The checkpoint filter timm's factory applies for ``model``'s family (None: none)."""
    arch = (getattr(model, "pretrained_cfg", None) or {}).get("architecture")
    module = type(model).__module__
    if arch:
        import timm

        if timm.is_model(arch):
            module = timm.models.model_entrypoint(arch).__module__
    return getattr(importlib.import_module(module), "checkpoint_filter_fn", None)


def mapped(state: dict, model: nn.Module) -> dict:
    """``state`` mapped onto ``model`` by timm's filter (positions resampled, original names renamed), head dropped."""
    fn = timm_filter(model)
    if fn is not None:
        state = fn(state, model)
    return {k: v for k, v in state.items() if not k.startswith(HEADS)}


def misfit(model: nn.Module, state: dict, k: int = 4) -> str | None:
    """What keeps ``state`` (mapped, head dropped) from loading into ``model``'s backbone; None: it fits.

    Compares names and shapes only, so ``model`` may live on the meta device.
    """
    want = {n: tuple(t.shape) for n, t in model.state_dict().items() if not n.startswith(HEADS)}
    missing = [n for n in want if n not in state]
    unexpected = [n for n in state if n not in want]
    shapes = [
        f"{n} {tuple(state[n].shape)} vs {want[n]}" for n in want if n in state and tuple(state[n].shape) != want[n]
    ]
    parts = [
        f"{what} {len(items)}: {', '.join(items[:k])}{', ...' if len(items) > k else ''}"
        for what, items in (("missing", missing), ("unexpected", unexpected), ("misshapen", shapes))
        if items
    ]
    if any(n.startswith(TRANSFORMERS_PREFIXES) for n in unexpected):
        parts.append(sources.NOT_MAPPED)
    return "; ".join(parts) or None


def label(source: str | Path, kind: str = "file") -> str:
    """How a message names ``source``: the weights file, checkpoint folder or hub repo."""
    return {"file": "weights file", "local-dir": "checkpoint folder"}.get(kind, "hub checkpoint") + f" {str(source)!r}"


def load(model: nn.Module, source: str | Path, kind: str = "file") -> None:
    """Load ``source``'s backbone into ``model`` (timm's reader and filter, head skipped);
    CheckpointMisfit if it does not fit."""
    state = mapped(read(source, kind), model)
    problem = misfit(model, state)
    if problem:
        raise CheckpointMisfit(f"{label(source, kind)} does not fit the model: {problem}")
    model.load_state_dict(state, strict=False)
