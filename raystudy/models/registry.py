"""Models: a registry of timm ViTs (the paper's checkpoints), raystudy's own small ViTs, and
Hugging Face GPT-2 (``GPT2_SIZES``: ``gpt2`` and the random-init ``gpt2_tiny``; the model code
is ``raystudy.models.gpt2``).

``create_model`` takes a short name (``vit_base``), any timm ViT name, a name in ``LOCAL_MODELS``,
or a timm model saved for the hub, by source (``local-dir:FOLDER``, ``hf-hub:ORG/NAME``;
``raystudy.models.sources``). Weights come from timm's hub cache, a local file (read and mapped
as timm maps it, ``raystudy.models.checkpoints``), the source's own, or, for a local model, the file its
pretraining recipe builds once (``python -m raystudy prefetch --models NAME``). With no
network and no weights it raises ``WeightsUnavailable`` naming the command that gets them,
instead of a stack trace from deep inside a download. Everything downstream asks this module
about a model (input size, normalisation, the dataset its probes draw x from, its family's
record in ``raystudy.models.architectures``); none of it knows a model by name.
"""

from __future__ import annotations

import functools
import hashlib
import json
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from raystudy import paths
from raystudy.errors import ConfigError, check_input_file
from raystudy.models import architectures, checkpoints, sources

if TYPE_CHECKING:  # torch is imported when a model is built, not with the registry
    import torch.nn as nn

# The paper's ImageNet-21k checkpoints.
ALIASES = {
    "vit_base": "vit_base_patch16_224.orig_in21k",
    "vit_large": "vit_large_patch16_224.orig_in21k",
    "vit_huge": "vit_huge_patch14_224.orig_in21k",
}
# Their input settings, as timm's pretrained configs give them. tests/models/test_registry.py checks both
# against the installed timm, so a driver of the paper's grid validates it without importing timm
# (and with it torch: seconds of CPU per driver start).
ALIAS_INPUTS = {
    full: dict(img_size=224, in_chans=3, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5)) for full in ALIASES.values()
}

# ImageNet's channel statistics: what the paper normalises every model's input with.
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)

# What plasticity probes draw x from for a hub checkpoint: its pretraining distribution.
HUB_SOURCE = "imagenet_val"
# Hugging Face GPT-2 (raystudy.models.gpt2), GPT2Config arguments per name. ``gpt2`` is the hub's 124M
# model (weights from ``from_pretrained`` when cached or downloadable); ``gpt2_tiny`` has no
# weights anywhere: random init, for tests and a laptop.
GPT2_SIZES: dict[str, dict] = {
    "gpt2": dict(n_layer=12, n_embd=768, n_head=12, n_positions=1024, vocab_size=50257),
    "gpt2_tiny": dict(
        n_layer=2, n_embd=32, n_head=2, n_positions=64, vocab_size=256, bos_token_id=255, eos_token_id=255
    ),
}
GPT2_HUB_IDS = {"gpt2": "gpt2"}  # the hub id most caches already hold it under
GPT2_NOTES = {
    "gpt2_tiny": "gpt2_tiny is a random-init GPT-2 (no pretrained weights exist for it); it shows "
    "the machinery, not the study's claims.",
}


@dataclass(frozen=True)
class LocalModel:
    """A ViT raystudy defines and pretrains itself, as data (timm registers models the same way).

    ``arch``: timm ``VisionTransformer`` arguments; ``pretrain``: the finetuning config that
    builds its weights from scratch (``raystudy.train.pretrain``); ``source``: the dataset it is
    pretrained on, which plasticity probes draw x from; ``note``: what users should know when
    reading its results.
    """

    arch: dict
    mean: tuple[float, ...]
    std: tuple[float, ...]
    source: str
    pretrain: dict = field(default_factory=dict)
    note: str = ""
    plasticity_note: str = ""


LOCAL_MODELS = {
    # The offline demo: 16x16 grey digits, 4x4 patches, 4 blocks of width 64, pretrained on
    # clean digits with all components trained (AdamW), finetuned on shifted digits.
    "vit_demo": LocalModel(
        arch=dict(img_size=16, patch_size=4, in_chans=1, embed_dim=64, depth=4, num_heads=4),
        mean=(0.5,),
        std=(0.5,),
        source="digits",
        pretrain=dict(
            pretrained=False,
            dataset="digits",
            condition="full",
            optimizer="adamw",
            lr=1e-3,
            weight_decay=0.05,
            steps=1500,
            warmup_steps=100,
            batch_size=64,
            eval_every=500,
            log_every=100,
            seed=0,
            device="cpu",
        ),
        note="this is the tiny offline demo; the paper's claims are about large pretrained ViTs.",
        plasticity_note=(
            "the paper's plasticity claim (MHA > FC1 ~ FC2 > LN2 > LN1) is about large pretrained "
            "ViTs; this tiny demo's ranking is expected to differ: its embedding tokens are small "
            "next to sqrt(d), so LayerNorm amplifies differences, and its linear weights stay near "
            "their small initialisation. It is reported as measured."
        ),
    ),
}


class WeightsUnavailable(RuntimeError):
    """Pretrained weights are neither cached nor downloadable."""


def resolve_name(name: str) -> str:
    """The full model name of ``name``: an alias's timm name, any other name unchanged."""
    return ALIASES.get(name, name)


def check_model(name: str) -> str:
    """``name`` resolved; ConfigError unless it is an alias, a local model, a timm ViT, or a
    ``local-dir:``/``hf-hub:`` timm model whose config.json names a timm ViT."""
    full = resolve_name(name)
    family(full).check(name, full)
    return full


def registered(name: str) -> bool:
    """Whether ``name`` is one raystudy registers: an alias, a local model or a GPT-2 size."""
    full = resolve_name(name)
    return family(full).registered(full)


def check_timm_vit(name: str) -> str:
    """``name`` resolved if timm has it as a VisionTransformer, else ConfigError."""
    import timm

    full = resolve_name(name)
    arch = full.split(".")[0]
    if not timm.is_model(arch):
        raise ConfigError(
            f"unknown model {name!r}; valid: {', '.join(ALIASES)}, "
            f"{', '.join(LOCAL_MODELS)}, {', '.join(GPT2_SIZES)} or any timm ViT name "
            "(timm.list_models('vit_*'))"
        )
    if not timm.models.is_model_in_modules(arch, ["vision_transformer", "deit"]):
        raise ConfigError(
            f"model {name!r} is not a timm VisionTransformer; the study's components "
            "(norm1, attn, norm2, mlp) are defined on timm's vision_transformer models"
        )
    return full


def create_model(
    name: str,
    num_classes: int,
    *,
    pretrained: bool = True,
    weights: str | Path | None = None,
    img_size: int | None = None,
    full: str | None = None,
) -> nn.Module:
    """Build ``name`` with a fresh ``num_classes`` head, loading pretrained weights if asked.
    ``full``: the name ``check_model`` already gave for ``name`` (a trial's plan), not checked again.

    ``weights`` is a local checkpoint file (a timm or raystudy state dict, safetensors too, read
    and mapped as timm maps it: ``raystudy.models.checkpoints``); else the source's own weights
    (``local-dir:``/``hf-hub:``), a local model's built file, or timm's hub cache. A
    ``transformers`` ViT checkpoint is not mapped (``raystudy.models.sources``).
    """
    full = full or check_model(name)
    return family(full).create(name, full, num_classes, pretrained, weights, img_size)


def _create_local(
    name: str, full: str, num_classes: int, pretrained: bool, weights: str | Path | None, img_size: int | None
) -> nn.Module:
    """A raystudy ViT from ``LOCAL_MODELS``, with ``weights`` or (pretrained) its built weights file loaded."""
    from timm.models.vision_transformer import VisionTransformer

    kw = dict(LOCAL_MODELS[full].arch)
    if img_size:
        kw["img_size"] = img_size
    model = VisionTransformer(num_classes=num_classes, **kw)
    if weights is None and pretrained:
        weights = _built_weights(name, full)
    if weights is not None:
        load_backbone(model, weights)
    return model


def _built_weights(name: str, full: str) -> Path:
    """The built pretrained weights file of local model ``full``; WeightsUnavailable if missing or corrupt."""
    weights = weights_file(full)
    if not weights.is_file():
        raise WeightsUnavailable(
            f"{full}'s pretrained weights are not built yet ({weights}); build them once "
            f"with `python -m raystudy prefetch --models {name}`, or pass --weights FILE"
        )
    problem = built_weights_problem(weights)
    if problem is not None:  # a trial never builds: it says which file to replace
        raise WeightsUnavailable(
            f"{full}'s weights file {weights} is corrupt ({problem}); delete it and rebuild "
            f"with `python -m raystudy prefetch --models {name}`"
        )
    return weights


def _create_timm(
    name: str, full: str, num_classes: int, pretrained: bool, weights: str | Path | None, img_size: int | None
) -> nn.Module:
    """A timm ViT: weights from a file, its source, the hub cache, or a download; WeightsUnavailable
    with advice offline."""
    import timm

    extra = {"img_size": img_size} if img_size else {}
    source, ident = sources.split(full)
    if weights is not None or not pretrained or source is not None:
        model = timm.create_model(full, pretrained=False, num_classes=num_classes, **extra)
        if weights is not None:
            load_backbone(model, weights)
        elif pretrained:
            _load_source(model, source, ident)
        return model
    cached = cached_weights(full)
    if cached is not None:  # load from the cache without touching the network
        return timm.create_model(
            full, pretrained=True, num_classes=num_classes, pretrained_cfg_overlay=dict(file=cached), **extra
        )
    if not hub_reachable():
        raise WeightsUnavailable(
            f"no cached weights for {full} and the Hugging Face hub is unreachable; prefetch them "
            f"on a machine with network: `python -m raystudy prefetch --models {name}` (fills "
            f"{hub_cache_dir()}), or pass --weights FILE"
        )
    try:
        return timm.create_model(full, pretrained=True, num_classes=num_classes, **extra)
    except Exception as e:  # noqa: BLE001 - any download failure gets the same advice
        raise WeightsUnavailable(
            f"could not download weights for {full}: {type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else ''}; prefetch with "
            f"`python -m raystudy prefetch --models {name}` or pass --weights FILE"
        ) from None


def _load_source(model: nn.Module, source: str, ident: str) -> None:
    """``model``'s backbone from its ``local-dir`` folder or ``hf-hub`` repo; WeightsUnavailable if it cannot."""
    try:
        checkpoints.load(model, ident, source)
    except checkpoints.CheckpointMisfit as e:
        raise WeightsUnavailable(str(e)) from None
    except Exception as e:  # noqa: BLE001 - no weights file, a download refused offline: the same advice
        raise WeightsUnavailable(
            f"cannot read the weights of {source}:{ident}: {type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else ''}; pass --weights FILE, or a folder holding "
            "model.safetensors (local-dir:FOLDER)"
        ) from None


def _create_gpt2(
    name: str, full: str, num_classes: int, pretrained: bool, weights: str | Path | None, img_size: int | None
) -> nn.Module:
    """A GPT-2 classifier: a weights file, the hub's weights (cache first, then a download), or
    random init (``pretrained=False``, or a size with no weights anywhere such as gpt2_tiny)."""
    from raystudy.models import gpt2

    arch, repo = GPT2_SIZES[full], GPT2_HUB_IDS.get(full)
    if weights is not None or not pretrained or repo is None:
        try:
            return gpt2.create(arch, num_classes, weights=weights)
        except ConfigError as e:
            raise WeightsUnavailable(str(e)) from None
    from transformers import GPT2Model

    try:  # the cache alone: no network touched
        body = GPT2Model.from_pretrained(repo, local_files_only=True, attn_implementation="sdpa")
    except OSError:
        if not hub_reachable():
            raise WeightsUnavailable(
                f"no cached weights for {full} ({repo}) and the Hugging Face hub is unreachable; "
                f"prefetch them on a machine with network: `python -m raystudy prefetch --model {name}` "
                f"(fills {hub_cache_dir()}), or pass --weights FILE"
            ) from None
        try:
            body = GPT2Model.from_pretrained(repo, attn_implementation="sdpa")
        except Exception as e:  # noqa: BLE001 - any download failure gets the same advice
            raise WeightsUnavailable(
                f"could not download weights for {full} ({repo}): {type(e).__name__}; pass --weights FILE"
            ) from None
    return gpt2.create(arch, num_classes, body=body)


def architecture(name: str) -> architectures.Architecture:
    """The family record of model ``name`` (``raystudy.models.architectures``): GPT-2 for the names in
    ``GPT2_SIZES``, a timm ViT for every other (aliases, local models, timm names)."""
    return family(resolve_name(name)).architecture


def takes_tokens(name: str) -> bool:
    """Whether ``name`` reads token ids (GPT-2) rather than images."""
    return architecture(name).tokens


def hf_hub_id(full: str) -> str | None:
    """The Hugging Face repo timm (or, for GPT-2, transformers) downloads ``full`` from, if any."""
    return family(full).hub_id(full)


def _timm_hub_id(full: str) -> str | None:
    """The Hugging Face repo of a timm model's pretrained config, if it has one."""
    import timm

    cfg = timm.models.get_pretrained_cfg(full, allow_unregistered=False)
    return getattr(cfg, "hf_hub_id", None) if cfg is not None else None


def _source_hub_id(full: str) -> str | None:
    """The repo of an ``hf-hub:`` model (a ``local-dir:`` one has none)."""
    source, ident = sources.split(full)
    return ident if source == "hf-hub" else None


def cached_weights(full: str) -> str | None:
    """Path of ``full``'s weights in the Hugging Face cache, or None (no network used)."""
    from huggingface_hub import try_to_load_from_cache

    source, ident = sources.split(full)
    if source == "local-dir":  # the folder is its own cache
        found = [Path(ident) / f for f in ("model.safetensors", "pytorch_model.bin")]
        return next((str(p) for p in found if p.is_file()), None)
    repo = hf_hub_id(full)
    if not repo:
        return None
    if not all(isinstance(try_to_load_from_cache(repo, f), str) for f in architecture(full).hub_extra_files):
        return None  # the loader needs these beside the weights
    for fname in ("model.safetensors", "pytorch_model.bin", "open_clip_pytorch_model.bin"):
        hit = try_to_load_from_cache(repo, fname)
        if isinstance(hit, str):
            return hit
    return None


def hub_cache_dir() -> str:
    """The Hugging Face hub cache folder timm and transformers read ($HF_HUB_CACHE)."""
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
    """Load the checkpoint file ``path`` into ``model`` as timm maps it (``raystudy.models.checkpoints``),
    skipping the head (a fresh one is wanted); WeightsUnavailable naming the keys that do not fit."""
    try:
        checkpoints.load(model, path)
    except checkpoints.CheckpointMisfit as e:
        raise WeightsUnavailable(str(e)) from None


def check_weights_file(path: str | Path) -> Path:
    """A weights file that loads as tensors (torch.save'd state dict or safetensors), checked
    without reading it whole (memory-mapped), once per file version; ConfigError naming it."""
    p = Path(path)
    check_input_file("weights file", path)
    st = p.stat()
    _check_weights(str(p.resolve()), st.st_size, st.st_mtime_ns)
    return p


@functools.lru_cache(maxsize=64)
def _check_weights(path: str, size: int, mtime_ns: int) -> None:
    try:
        if path.endswith(".safetensors"):
            from safetensors import safe_open

            with safe_open(path, "pt") as f:
                f.keys()
        else:
            import torch

            state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            if not isinstance(state, dict):
                raise TypeError(f"holds a {type(state).__name__}, not a state dict")
    except Exception as e:  # noqa: BLE001 - whatever the loader trips on, the file is the problem
        detail = str(e).splitlines()[0][:160] if str(e) else ""
        raise ConfigError(
            f"weights file {path!r} is not a model checkpoint (a torch.save'd state "
            f"dict or safetensors): {type(e).__name__}: {detail}"
        ) from None


WEIGHTS_BUILDER = "raystudy-pretrain-2"  # 2: weights carry a manifest (size, SHA-256)


def weights_manifest(path: Path) -> Path:
    """The manifest file (size, SHA-256, builder) written beside a built weights file."""
    return path.with_name(path.name + ".manifest.json")


def built_weights_problem(path: Path) -> str | None:
    """What is wrong with a built weights file (None: it is as built)."""
    return paths.manifest_problem(weights_manifest(path), WEIGHTS_BUILDER)


def weights_file(name: str) -> Path:
    """Where a local model's pretrained weights live (built or not): the cache, named by a hash
    of its recipe and builder, so a changed recipe never loads stale weights."""
    full = resolve_name(name)
    spec = LOCAL_MODELS[full]
    recipe = {"model": full, **spec.pretrain, "builder": WEIGHTS_BUILDER}
    key = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:10]
    return paths.cache() / f"{full}_{spec.source}_{key}.pt"


def pretrain_recipe(name: str) -> dict | None:
    """The finetuning config that builds ``name``'s weights, or None (hub weights)."""
    spec = LOCAL_MODELS.get(resolve_name(name))
    return {"model": resolve_name(name), **spec.pretrain} if spec and spec.pretrain else None


def source_dataset(name: str) -> str:
    """The dataset ``name`` was pretrained on, where plasticity probes draw x from."""
    full = resolve_name(name)
    fam = family(full)
    return fam.architecture.probe_source or fam.source(full)


def note(name: str) -> str:
    """What a reader of ``name``'s results should know (empty for the paper's checkpoints)."""
    full = resolve_name(name)
    return family(full).note(full)


def normalization(name: str, kind: str = "checkpoint") -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(mean, std) of the input normalisation: the checkpoint's own, or ImageNet's (the paper's)."""
    return normalization_of(input_config(name), name, kind)


def normalization_of(ic: dict, name: str, kind: str = "checkpoint") -> tuple[tuple[float, ...], tuple[float, ...]]:
    """``normalization`` from ``name``'s input config ``ic`` already looked up (``input_config``):
    a trial derives its inputs once and its normalisation from them."""
    if kind == "checkpoint":
        return tuple(ic["mean"]), tuple(ic["std"])
    if ic.get("tokens"):
        raise ConfigError(
            f"normalization {kind!r} is for image models; {name} reads token ids: use normalization: checkpoint"
        )
    if ic["in_chans"] != 3:
        raise ConfigError(
            f"normalization {kind!r} is for RGB models; {name} takes {ic['in_chans']} "
            "channel(s): use normalization: checkpoint"
        )
    return IMAGENET_MEAN, IMAGENET_STD


def plasticity_note(name: str) -> str:
    """What a reader of ``name``'s plasticity measurements should know (empty for hub models)."""
    full = resolve_name(name)
    fam = family(full)
    return fam.architecture.plasticity_note or fam.plasticity_note(full)


def input_config(name: str) -> dict:
    """Input size, channels and normalisation ``name`` was pretrained with, without building it."""
    full = check_model(name)
    return family(full).input_config(full)


def _gpt2_inputs(full: str) -> dict:
    """Token ids: no image size, no normalisation."""
    size = GPT2_SIZES[full]
    return dict(
        img_size=None,
        in_chans=None,
        mean=(),
        std=(),
        tokens=True,
        vocab_size=size["vocab_size"],
        max_len=size["n_positions"],
    )


def _local_inputs(full: str) -> dict:
    """A local model's inputs, as its record states them."""
    spec = LOCAL_MODELS[full]
    return dict(img_size=spec.arch["img_size"], in_chans=spec.arch["in_chans"], mean=spec.mean, std=spec.std)


def _timm_inputs(full: str) -> dict:
    """A timm model's inputs: the paper's checkpoints' as stated (no timm import), else timm's config."""
    if full in ALIAS_INPUTS:
        return dict(ALIAS_INPUTS[full])
    import timm

    cfg = timm.models.get_pretrained_cfg(full)
    return dict(img_size=cfg.input_size[-1], in_chans=cfg.input_size[0], mean=tuple(cfg.mean), std=tuple(cfg.std))


def _source_inputs(full: str) -> dict:
    """A saved timm model's inputs, from its config.json."""
    return sources.input_config(sources.config_json(full, lambda: hub_reachable()))


def _check_gpt2(name: str, full: str) -> None:
    """GPT-2 needs transformers installed (the ``gpt2`` extra)."""
    import importlib.util

    if importlib.util.find_spec("transformers") is None:
        raise ConfigError(f"model {name!r} needs Hugging Face transformers: pip install 'raystudy[gpt2]'")


def _check_source(name: str, full: str) -> None:
    """A ``local-dir:``/``hf-hub:`` model's config.json must name a timm ViT."""
    arch = sources.config_json(full, lambda: hub_reachable())["architecture"]
    try:
        check_timm_vit(arch)
    except ConfigError as e:
        raise ConfigError(f"model {name!r} (architecture {arch!r}): {e}") from None


def _check_timm(name: str, full: str) -> None:
    """The paper's checkpoints are known (the tests check them against timm); any other a timm ViT."""
    if full not in ALIAS_INPUTS:
        check_timm_vit(name)


def _nothing(full: str) -> str:
    """No note."""
    return ""


@dataclass(frozen=True)
class Family:
    """A model family as data: which full names it owns and how each is checked, built and
    described. ``FAMILIES`` is tried in order (the first that ``owns`` a name has it); nothing
    outside this module asks which family a model is, only what the record answers."""

    name: str
    owns: Callable[[str], bool]
    check: Callable[[str, str], None]  # (name as given, full name): ConfigError if unusable
    create: Callable[..., nn.Module]  # (name, full, num_classes, pretrained, weights, img_size)
    input_config: Callable[[str], dict]
    hub_id: Callable[[str], str | None]
    architecture: architectures.Architecture
    registered: Callable[[str], bool]  # named by raystudy (not just any timm or saved model)
    source: Callable[[str], str] = lambda full: HUB_SOURCE  # what probes draw x from
    note: Callable[[str], str] = _nothing
    plasticity_note: Callable[[str], str] = _nothing


FAMILIES: tuple[Family, ...] = (
    Family(
        name="gpt2",
        owns=lambda full: full in GPT2_SIZES,
        check=_check_gpt2,
        create=_create_gpt2,
        input_config=_gpt2_inputs,
        hub_id=GPT2_HUB_IDS.get,
        architecture=architectures.GPT2,
        registered=lambda full: True,
        note=lambda full: GPT2_NOTES.get(full, ""),
    ),
    Family(
        name="local",
        owns=lambda full: full in LOCAL_MODELS,
        check=lambda name, full: None,
        create=_create_local,
        input_config=_local_inputs,
        hub_id=lambda full: None,
        architecture=architectures.VIT,
        registered=lambda full: True,
        source=lambda full: LOCAL_MODELS[full].source,
        note=lambda full: LOCAL_MODELS[full].note,
        plasticity_note=lambda full: LOCAL_MODELS[full].plasticity_note,
    ),
    Family(
        name="saved timm",
        owns=lambda full: sources.split(full)[0] is not None,
        check=_check_source,
        create=_create_timm,
        input_config=_source_inputs,
        hub_id=_source_hub_id,
        architecture=architectures.VIT,
        registered=lambda full: False,
    ),
    Family(
        name="timm",
        owns=lambda full: True,
        check=_check_timm,
        create=_create_timm,
        input_config=_timm_inputs,
        hub_id=_timm_hub_id,
        architecture=architectures.VIT,
        registered=lambda full: full in ALIAS_INPUTS,
    ),
)


def family(full: str) -> Family:
    """The record of the family that owns the full model name ``full``."""
    return next(f for f in FAMILIES if f.owns(full))
