"""Models: timm ViTs with the paper's checkpoints, plus the offline demo's tiny ViT.

``create_model`` takes a short name (``vit_base``), any timm ViT name, or ``vit_demo``; weights
come from timm's hub cache, a local file, or (for the demo) raystudy's own cache. With no network
and no cached weights it raises ``WeightsUnavailable`` with the command that prefetches them,
instead of a stack trace from deep inside a download.
"""

from __future__ import annotations

import socket
from pathlib import Path

import torch
import torch.nn as nn

from raystudy.config import ConfigError

# The paper's ImageNet-21k checkpoints (STUDY.md).
ALIASES = {
    "vit_base": "vit_base_patch16_224.orig_in21k",
    "vit_large": "vit_large_patch16_224.orig_in21k",
    "vit_huge": "vit_huge_patch14_224.orig_in21k",
}

# raystudy's own architectures: a name and a small dict of timm VisionTransformer arguments.
LOCAL_MODELS = {
    # The offline demo (STUDY.md): 16x16 grey digits, 4x4 patches, 4 blocks of width 64.
    "vit_demo": dict(img_size=16, patch_size=4, in_chans=1, embed_dim=64, depth=4, num_heads=4),
}

# Normalisation of the demo's grey images (pixels in [0, 1]).
DEMO_MEAN, DEMO_STD = (0.5,), (0.5,)


class WeightsUnavailable(RuntimeError):
    """Pretrained weights are neither cached nor downloadable."""


def resolve_name(name: str) -> str:
    return ALIASES.get(name, name)


def check_model(name: str) -> str:
    """Raise ConfigError unless ``name`` is an alias, a local model or a timm ViT."""
    full = resolve_name(name)
    if full in LOCAL_MODELS:
        return full
    import timm

    arch = full.split(".")[0]
    if not timm.is_model(arch):
        raise ConfigError(f"unknown model {name!r}; valid: {', '.join(ALIASES)}, "
                          f"{', '.join(LOCAL_MODELS)} or any timm ViT name (timm.list_models('vit_*'))")
    if not timm.models.is_model_in_modules(arch, ["vision_transformer", "deit"]):
        raise ConfigError(f"model {name!r} is not a timm VisionTransformer; the study's components "
                          "(norm1, attn, norm2, mlp) are defined on timm's vision_transformer models")
    return full


def create_model(name: str, num_classes: int, *, pretrained: bool = True,
                 weights: str | Path | None = None, img_size: int | None = None) -> nn.Module:
    """Build ``name`` with a fresh ``num_classes`` head, loading pretrained weights if asked.

    ``weights`` is a local checkpoint file (timm or raystudy state dict); else timm's hub cache.
    """
    full = check_model(name)
    if full in LOCAL_MODELS:
        from timm.models.vision_transformer import VisionTransformer

        kw = dict(LOCAL_MODELS[full])
        if img_size:
            kw["img_size"] = img_size
        model = VisionTransformer(num_classes=num_classes, **kw)
        if weights is not None:
            load_backbone(model, weights)
        elif pretrained:
            raise WeightsUnavailable(f"{full} has no hub weights; pass weights=FILE "
                                     "(raystudy.engine.demo_weights() builds the demo's)")
        return model

    import timm

    extra = {"img_size": img_size} if img_size else {}
    if weights is not None:
        return timm.create_model(full, pretrained=True, num_classes=num_classes,
                                 pretrained_cfg_overlay=dict(file=str(weights)), **extra)
    if not pretrained:
        return timm.create_model(full, pretrained=False, num_classes=num_classes, **extra)
    cached = cached_weights(full)
    if cached is not None:  # load from the cache without touching the network
        return timm.create_model(full, pretrained=True, num_classes=num_classes,
                                 pretrained_cfg_overlay=dict(file=cached), **extra)
    if not hub_reachable():
        raise WeightsUnavailable(
            f"no cached weights for {full} and the Hugging Face hub is unreachable; prefetch them "
            f"on a machine with network: `python -m raystudy.prefetch --model {name}` (fills "
            f"{hub_cache_dir()}), or pass --weights FILE")
    try:
        return timm.create_model(full, pretrained=True, num_classes=num_classes, **extra)
    except Exception as e:  # noqa: BLE001 - any download failure gets the same advice
        raise WeightsUnavailable(f"could not download weights for {full}: {type(e).__name__}: "
                                 f"{str(e).splitlines()[0] if str(e) else ''}; prefetch with "
                                 f"`python -m raystudy.prefetch --model {name}` or pass --weights FILE") from None


def hf_hub_id(full: str) -> str | None:
    """The Hugging Face repo timm downloads ``full`` from, if any."""
    import timm

    cfg = timm.models.get_pretrained_cfg(full, allow_unregistered=False)
    return getattr(cfg, "hf_hub_id", None) if cfg is not None else None


def cached_weights(full: str) -> str | None:
    """Path of ``full``'s weights in the Hugging Face cache, or None (no network used)."""
    from huggingface_hub import try_to_load_from_cache

    repo = hf_hub_id(full)
    if not repo:
        return None
    for fname in ("model.safetensors", "pytorch_model.bin", "open_clip_pytorch_model.bin"):
        hit = try_to_load_from_cache(repo, fname)
        if isinstance(hit, str):
            return hit
    return None


def hub_cache_dir() -> str:
    from huggingface_hub import constants

    return constants.HF_HUB_CACHE


def hub_reachable(host: str = "huggingface.co", timeout: float = 3.0) -> bool:
    """A fast check, so an offline machine fails in seconds, not after a minute of retries."""
    try:
        with socket.create_connection((host, 443), timeout=timeout):
            return True
    except OSError:
        return False


def load_backbone(model: nn.Module, path: str | Path) -> None:
    """Load a state dict from ``path`` into ``model``, skipping the head (a fresh one is wanted)."""
    state = torch.load(path, map_location="cpu", weights_only=True)
    state = state.get("model", state)
    state = {k: v for k, v in state.items() if not k.startswith("head.")}
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.startswith("head.")]
    if missing or unexpected:
        raise WeightsUnavailable(f"weights file {path} does not fit the model: missing {missing[:4]}, "
                                 f"unexpected {unexpected[:4]}")


def input_config(name: str) -> dict:
    """Input size, channels and normalisation ``name`` was pretrained with, without building it."""
    full = check_model(name)
    if full in LOCAL_MODELS:
        c = LOCAL_MODELS[full]["in_chans"]
        return dict(img_size=LOCAL_MODELS[full]["img_size"], in_chans=c,
                    mean=DEMO_MEAN * c, std=DEMO_STD * c)
    import timm

    cfg = timm.models.get_pretrained_cfg(full)
    return dict(img_size=cfg.input_size[-1], in_chans=cfg.input_size[0],
                mean=tuple(cfg.mean), std=tuple(cfg.std))
