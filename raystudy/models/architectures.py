"""Model families as data: one record per architecture (timm ViT, Hugging Face GPT-2), by a stable name.

A record holds everything that differs between families: the parameter-name patterns of each
study component, the module path of each probed component inside a block, how the tokens that
enter the first block are computed, how an attention module is called on its own, what the
model reads (images or token ids), which layers LoRA adapts, and what the hub needs beside the
weights. Code that treats families differently looks the record up once, from a built model
(``of_model``) or a model name (``raystudy.models.registry.architecture``), and reads it; none tests for
a family itself.

ViT's record covers timm's VisionTransformer variants through its patterns: LayerScale (``ls1``,
``ls2``), register tokens (``reg_token``), CLIP's pre-norm (``norm_pre``) and global-average
pooling (``fc_norm``). Nothing here imports torch, timm or transformers: the records are
strings and patterns, and their functions import what they need when called.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from torch import nn

# peft wraps an adapted layer and moves its weight to ``<name>.base_layer.weight``.
_BASE = r"(\.base_layer)?"
# GPT-2's blocks, under ``transformer.`` in raystudy's classifier.
_H = r"(transformer\.)?h\.\d+"


@dataclass(frozen=True)
class Architecture:
    """What raystudy needs to know of one model family.

    ``patterns``: component -> regular expressions over parameter names (full match), keys in
    table order; ``module_paths``: probed component -> module path inside every block;
    ``blocks``: where the blocks sit (for messages; every model exposes them as ``.blocks``);
    ``inputs``: ``"images"`` or ``"token ids"``; ``embed(model, x)``: the tokens entering the
    first block; ``attention_mask(n, dtype, device)``: the mask its attention is called with
    (None: none); ``attend(attn, x, mask)``: an attention module's output tensor on ``x``;
    ``matches(module)``: whether a built (unwrapped) model is of this family;
    ``lora_targets`` / ``is_lora_layer`` / ``lora_fan_in_fan_out``: the layers LoRA adapts and
    how peft reads their weights; ``head_input``: what the classifier head reads, beyond the
    family's usual (for the components table); ``hub_extra_files``: files a hub download needs
    beside the weights; ``hubless_is_random_init``: a model of the family with no hub repo is
    random-init (nothing to download) rather than missing; ``probe_source``: the dataset
    plasticity probes draw x from for every model of the family (None: per model);
    ``plasticity_note``: what a reader of its plasticity measurements should know.
    """

    name: str
    title: str
    inputs: str
    patterns: dict[str, tuple[str, ...]]
    module_paths: dict[str, str]
    blocks: str
    embed: Callable[[nn.Module, torch.Tensor], torch.Tensor]
    attention_mask: Callable[[int, torch.dtype, torch.device], torch.Tensor | None]
    attend: Callable[[nn.Module, torch.Tensor, torch.Tensor | None], torch.Tensor]
    matches: Callable[[nn.Module], bool]
    lora_targets: tuple[str, ...]
    is_lora_layer: Callable[[nn.Module], bool]
    lora_fan_in_fan_out: bool = False
    head_input: str = ""
    hub_extra_files: tuple[str, ...] = ()
    hubless_is_random_init: bool = False
    probe_source: str | None = None
    plasticity_note: str = ""

    @property
    def tokens(self) -> bool:
        """Whether the family reads token ids rather than images."""
        return self.inputs == "token ids"


# ---------------------------------------------------------------- timm VisionTransformer


def _vit_embed(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """E(x) by timm's own steps: patches, prefix tokens and positions, patch dropout, pre-norm."""
    x = model.patch_embed(x)
    x = model._pos_embed(x)
    x = model.patch_drop(x)
    return model.norm_pre(x)


def _no_mask(n: int, dtype: torch.dtype, device: torch.device) -> None:
    """ViT attention sees every token: no mask (None)."""


def _vit_attend(attn: nn.Module, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """A timm attention module on ``x`` (bidirectional; ``mask`` is None)."""
    return attn(x)


def _is_vit(module: nn.Module) -> bool:
    """Whether ``module`` is a timm VisionTransformer."""
    from timm.models.vision_transformer import VisionTransformer

    return isinstance(module, VisionTransformer)


def _is_linear(module: nn.Module) -> bool:
    """Whether ``module`` is a torch Linear layer (timm's attention linears)."""
    from torch import nn

    return isinstance(module, nn.Linear)


VIT = Architecture(
    name="vit",
    title="a timm VisionTransformer",
    inputs="images",
    patterns={
        "LN1": (r"blocks\.\d+\.norm1\.(weight|bias)",),
        # LayerScale's ls1 scales the attention branch's output, ls2 the MLP's: each trains with
        # the component whose output it scales (MHA, FC2). EVA's separate q/v biases belong to MHA.
        "MHA": (
            rf"blocks\.\d+\.attn\.(qkv|proj){_BASE}\.(weight|bias)",
            r"blocks\.\d+\.attn\.(q_bias|v_bias)",
            r"blocks\.\d+\.ls1\.gamma",
        ),
        "LN2": (r"blocks\.\d+\.norm2\.(weight|bias)",),
        "FC1": (r"blocks\.\d+\.mlp\.fc1\.(weight|bias)",),
        "FC2": (r"blocks\.\d+\.mlp\.fc2\.(weight|bias)", r"blocks\.\d+\.ls2\.gamma"),
        # Register tokens (DINOv2, DeiT-III style) and CLIP's pre-norm are part of the embedding stage.
        "EMBED": (
            r"cls_token",
            r"reg_token",
            r"pos_embed",
            r"patch_embed\.proj\.(weight|bias)",
            r"norm_pre\.(weight|bias)",
        ),
        "HEAD": (r"head\.(weight|bias)", r"norm\.(weight|bias)", r"fc_norm\.(weight|bias)"),
        "LORA": (r"blocks\.\d+\.attn\.(qkv|proj)\.lora_[AB]\.[\w]+\.weight",),
    },
    module_paths={"LN1": "norm1", "MHA": "attn", "LN2": "norm2", "FC1": "mlp.fc1", "FC2": "mlp.fc2"},
    blocks="blocks",
    embed=_vit_embed,
    attention_mask=_no_mask,
    attend=_vit_attend,
    matches=_is_vit,
    lora_targets=("attn.qkv", "attn.proj"),
    is_lora_layer=_is_linear,
)


# ---------------------------------------------------------------- Hugging Face GPT-2


def _gpt2_embed(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Token plus position embeddings (the dropout after them is off in eval mode)."""
    import torch

    t = model.transformer
    return t.drop(t.wte(x) + t.wpe(torch.arange(x.shape[1], device=x.device)))


def causal_mask(n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Additive (1, 1, n, n) mask: token i attends to tokens j <= i, as GPT-2 does in its forward.

    Given explicitly because a GPT-2 attention called alone is causal only under some attention
    implementations (sdpa infers it from a missing mask, eager does not).
    """
    import torch

    m = torch.full((n, n), torch.finfo(dtype).min, dtype=dtype, device=device).triu(1)
    return m[None, None]


def _gpt2_attend(attn: nn.Module, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """A GPT-2 attention module on ``x`` under ``mask``; it returns (output, weights): the output."""
    out = attn(x, attention_mask=mask)
    return out[0] if isinstance(out, tuple) else out


def _is_gpt2(module: nn.Module) -> bool:
    """Whether ``module`` is raystudy's GPT-2 classifier."""
    from raystudy.models import gpt2

    return gpt2.is_gpt2(module)


def _is_conv1d(module: nn.Module) -> bool:
    """Whether ``module`` is transformers' Conv1D (GPT-2's linears, weights stored (in, out))."""
    return type(module).__name__ == "Conv1D"


GPT2 = Architecture(
    name="gpt2",
    title="raystudy's GPT-2 classifier",
    inputs="token ids",
    # Hugging Face's own names, under ``transformer.`` in the classifier; its Conv1D layers
    # (c_attn, c_proj, c_fc) hold their weights as (in, out), nn.Linear's transpose.
    patterns={
        "LN1": (rf"{_H}\.ln_1\.(weight|bias)",),
        "MHA": (rf"{_H}\.attn\.(c_attn|c_proj){_BASE}\.(weight|bias)",),
        "LN2": (rf"{_H}\.ln_2\.(weight|bias)",),
        "FC1": (rf"{_H}\.mlp\.c_fc\.(weight|bias)",),
        "FC2": (rf"{_H}\.mlp\.c_proj\.(weight|bias)",),
        "EMBED": (r"(transformer\.)?(wte|wpe)\.weight",),
        # The final norm ln_f sits before the pooled head, as timm's norm does.
        "HEAD": (r"head\.(weight|bias)", r"(transformer\.)?ln_f\.(weight|bias)"),
        "LORA": (rf"{_H}\.attn\.(c_attn|c_proj)\.lora_[AB]\.[\w]+\.weight",),
    },
    module_paths={"LN1": "ln_1", "MHA": "attn", "LN2": "ln_2", "FC1": "mlp.c_fc", "FC2": "mlp.c_proj"},
    blocks="transformer.h",
    embed=_gpt2_embed,
    attention_mask=causal_mask,
    attend=_gpt2_attend,
    matches=_is_gpt2,
    lora_targets=("attn.c_attn", "attn.c_proj"),
    is_lora_layer=_is_conv1d,
    lora_fan_in_fan_out=True,  # Conv1D stores (in, out)
    head_input="mean-pooled last hidden state",
    hub_extra_files=("config.json",),  # transformers' from_pretrained reads it beside the weights
    hubless_is_random_init=True,
    # GPT-2's stand-in for its pretraining data: uniform random tokens (the probe CLI's
    # --tokens FILE gives real text).
    probe_source="tokens_random",
    plasticity_note=(
        "x are uniform random tokens unless a token file of pretraining-like text is given "
        "(--tokens); GPT-2's attention is causal, which the MHA bound does not cover (none is given)."
    ),
)

# Stable name -> record; the order is the order families are tried in (``of_model``, LoRA).
ARCHITECTURES: dict[str, Architecture] = {a.name: a for a in (VIT, GPT2)}

# The components plasticity probes measure: those every family has a module for, in table order.
PROBE_COMPONENTS = tuple(c for c in VIT.patterns if all(c in a.module_paths for a in ARCHITECTURES.values()))


def of_model(module: nn.Module) -> Architecture | None:
    """The record of a built, unwrapped model's family, or None if raystudy knows none."""
    for arch in ARCHITECTURES.values():
        if arch.matches(module):
            return arch
    return None


def component_patterns() -> dict[str, tuple[str, ...]]:
    """Every family's patterns merged per component, in table order: one table that partitions
    the parameters of a model of any family (and of a bare list of names)."""
    order = list(dict.fromkeys(c for a in ARCHITECTURES.values() for c in a.patterns))
    return {c: tuple(dict.fromkeys(p for a in ARCHITECTURES.values() for p in a.patterns.get(c, ()))) for c in order}
