"""Model names with a source, as timm spells them: ``local-dir:FOLDER`` and ``hf-hub:ORG/NAME``.

Either points at a timm model saved for the hub: a ``config.json`` naming the timm architecture
(with its model arguments and input settings) beside ``model.safetensors`` or
``pytorch_model.bin``, as ``timm.models.save_for_hf`` and ``timm.models.push_to_hf_hub`` write it.
What is not mapped: a Hugging Face ``transformers`` ViT checkpoint (``ViTModel``,
``config.json`` with ``model_type: vit``) names no timm architecture and uses other parameter
names; convert it to a timm state dict first (or use the timm build of the same weights on the
hub, e.g. ``hf-hub:timm/vit_base_patch16_224.augreg_in21k``).

Reading a name's config touches no torch; a hub name's config comes from the Hugging Face cache,
or from the hub where it is reachable.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable
from pathlib import Path

from raystudy.errors import ConfigError

SOURCES = ("local-dir", "hf-hub")
NOT_MAPPED = (
    "a transformers ViT checkpoint (model_type 'vit') is not mapped: save the model with "
    "timm.models.save_for_hf, or use the timm build of its weights (hf-hub:timm/...)"
)


def split(name: str) -> tuple[str | None, str]:
    """(source, folder or repo id) of ``name``; (None, name) for a plain timm or raystudy name."""
    source, sep, rest = name.partition(":")
    if sep and source.lower().replace("_", "-") in SOURCES:
        return source.lower().replace("_", "-"), rest
    return None, name


def short(name: str) -> str:
    """A plain label for ``name`` (experiment names, folders): the folder's or repo's last part."""
    source, ident = split(name)
    if source is None:
        return name.split(".")[0]
    last = Path(ident.rstrip("/\\")).name or "model"
    return re.sub(r"[^A-Za-z0-9_.-]", "_", last).split(".")[0] or "model"


def config_json(name: str, reachable: Callable[[], bool]) -> dict:
    """The ``config.json`` of a source name; ConfigError naming what is missing or unreadable."""
    source, ident = split(name)
    if source == "local-dir":
        return _folder_config(ident)
    return _hub_config(ident, reachable)


def _folder_config(folder: str) -> dict:
    """``folder``'s config.json, checked: it exists, parses and names a timm architecture."""
    p = Path(folder).expanduser()
    if not p.is_dir():
        raise ConfigError(f"model 'local-dir:{folder}': {folder!r} is not a folder (a timm model saved for the hub)")
    f = p / "config.json"
    if not f.is_file():
        raise ConfigError(
            f"model 'local-dir:{folder}': no config.json in {folder!r}; the folder must hold a timm model "
            "saved for the hub (config.json and model.safetensors, as timm.models.save_for_hf writes them)"
        )
    st = f.stat()
    return _parse(str(f.resolve()), st.st_size, st.st_mtime_ns, f"local-dir:{folder}")


def _hub_config(repo: str, reachable: Callable[[], bool]) -> dict:
    """Hub repo ``repo``'s config.json: from the cache, else downloaded where the hub is reachable."""
    from huggingface_hub import hf_hub_download, try_to_load_from_cache

    cached = try_to_load_from_cache(repo, "config.json")
    if not isinstance(cached, str):
        if not reachable():
            raise ConfigError(
                f"model 'hf-hub:{repo}': its config.json is not in the Hugging Face cache and the hub is "
                "unreachable; download the repo on a machine with network (or save it with "
                "timm.models.save_for_hf and pass local-dir:FOLDER)"
            )
        try:
            cached = hf_hub_download(repo, "config.json")
        except Exception as e:  # noqa: BLE001 - a missing repo, a gated one, a dropped connection: same advice
            raise ConfigError(
                f"model 'hf-hub:{repo}': cannot fetch its config.json ({type(e).__name__}); check the repo name"
            ) from None
    st = Path(cached).stat()
    return _parse(cached, st.st_size, st.st_mtime_ns, f"hf-hub:{repo}")


@functools.lru_cache(maxsize=32)
def _parse(path: str, size: int, mtime_ns: int, name: str) -> dict:
    """The parsed config.json at ``path`` (once per file version), with an ``architecture``."""
    try:
        cfg = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"model {name!r}: config.json is not readable JSON ({type(e).__name__})") from None
    if not isinstance(cfg, dict) or not isinstance(cfg.get("architecture"), str):
        mt = cfg.get("model_type") if isinstance(cfg, dict) else None
        why = f"; {NOT_MAPPED}" if mt else ""
        raise ConfigError(f"model {name!r}: config.json names no timm architecture{why}")
    return cfg


def input_config(cfg: dict) -> dict:
    """Input size, channels and normalisation a saved timm model's config.json gives."""
    pre = cfg.get("pretrained_cfg") or {}
    args = cfg.get("model_args") or {}
    size = pre.get("input_size") or (3, 224, 224)
    img = args.get("img_size") or size[-1]
    img = img[-1] if isinstance(img, list | tuple) else img
    chans = args.get("in_chans") or size[0]
    default = (0.5,) * chans
    return dict(
        img_size=int(img), in_chans=int(chans), mean=tuple(pre.get("mean", default)), std=tuple(pre.get("std", default))
    )
