"""GPT-2 (Hugging Face ``transformers``) as a study model: sizes as data, a sequence classifier,
token files.

``GPT2Classifier`` keeps Hugging Face's own parameter names under ``transformer.``
(``transformer.h.{i}.ln_1``, ``attn.c_attn``, ``attn.c_proj``, ``ln_2``, ``mlp.c_fc``,
``mlp.c_proj``, ``wte``, ``wpe``, ``ln_f``), which its ``raystudy.models.architectures`` record maps
onto LN1, MHA, LN2, FC1, FC2, EMBED and HEAD as timm's record does timm's. The last hidden
state (after ``ln_f``) is mean-pooled over tokens into a fresh linear ``head``. Like timm's ViTs
it exposes ``blocks`` and ``forward_features``, which the probes and the linear probe use.

The registry of sizes lives in ``raystudy.models`` (``GPT2_SIZES``), which loads without torch;
``transformers`` is imported when a model is built, not with this module.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

from raystudy.errors import ConfigError, check_input_file


def gpt2_config(arch: dict):
    """A ``GPT2Config`` from its arguments (``models.GPT2_SIZES``), on PyTorch's fused attention."""
    from transformers import GPT2Config

    return GPT2Config(**arch, attn_implementation="sdpa")


class GPT2Classifier(nn.Module):
    """A GPT-2 body and a linear head on its mean-pooled last hidden state: token ids -> logits."""

    def __init__(self, config, num_classes: int, body: nn.Module | None = None):
        super().__init__()
        from transformers import GPT2Model

        self.transformer = body if body is not None else GPT2Model(config)
        self.head = nn.Linear(self.transformer.config.n_embd, num_classes)

    @property
    def blocks(self) -> nn.ModuleList:
        """The transformer blocks, as timm calls them (``transformer.h``)."""
        return self.transformer.h

    def forward_features(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The last hidden state (batch, tokens, width), after the final norm ``ln_f``."""
        return self.transformer(input_ids=input_ids).last_hidden_state

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Logits (batch, classes) of token ids (batch, tokens)."""
        return self.head(self.forward_features(input_ids).mean(1))


def is_gpt2(module: nn.Module) -> bool:
    """Whether ``module`` is raystudy's GPT-2 classifier (``raystudy.models.architectures.GPT2`` asks this)."""
    return isinstance(module, GPT2Classifier)


def create(
    arch: dict, num_classes: int, *, body: nn.Module | None = None, weights: str | Path | None = None
) -> GPT2Classifier:
    """A classifier of GPT2Config arguments ``arch``: random init, ``body`` (a loaded
    GPT2Model), or a ``weights`` file."""
    model = GPT2Classifier(gpt2_config(arch), num_classes, body=body)
    if weights is not None:
        load_state(model, weights)
    return model


def load_state(model: GPT2Classifier, path: str | Path) -> None:
    """Load a GPT-2 state dict (a bare GPT2Model's, a GPT2LMHeadModel's or a raystudy
    classifier's; torch.save'd or safetensors) into ``model``'s body; the head stays fresh."""
    p = str(path)
    if p.endswith(".safetensors"):
        from safetensors.torch import load_file

        state = load_file(p)
    else:
        state = torch.load(p, map_location="cpu", weights_only=True)
        state = state.get("model", state)
    state = {
        (k if k.startswith("transformer.") else f"transformer.{k}"): v
        for k, v in state.items()
        if not k.startswith(("head.", "lm_head."))
    }
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.startswith("head.")]
    if missing or unexpected:
        raise ConfigError(
            f"weights file {p} does not fit the model: missing {missing[:4]}, unexpected {unexpected[:4]}"
        )


def load_tokens(path: str | Path, vocab_size: int, max_len: int) -> torch.Tensor:
    """Token ids (sequences, tokens) from a ``.npy`` or ``.pt`` file, checked against the model:
    a 2-D integer array, ids in [0, vocab_size), at most ``max_len`` tokens a sequence."""
    p = Path(path)
    check_input_file("token file", path)
    try:
        if p.suffix == ".npy":
            arr = torch.from_numpy(np.load(p, allow_pickle=False))
        elif p.suffix == ".pt":
            arr = torch.load(p, map_location="cpu", weights_only=True)
        else:
            raise ConfigError(f"token file {str(path)!r}: give a .npy or .pt file of token ids")
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001 - whatever the loader trips on, the file is the problem
        raise ConfigError(
            f"token file {str(path)!r} cannot be read as an array of token ids: {type(e).__name__}"
        ) from None
    if (
        not isinstance(arr, torch.Tensor)
        or arr.ndim != 2
        or arr.is_floating_point()
        or arr.is_complex()
        or arr.dtype == torch.bool
        or arr.numel() == 0
    ):
        what = f"{tuple(arr.shape)} {arr.dtype}" if isinstance(arr, torch.Tensor) else type(arr).__name__
        raise ConfigError(
            f"token file {str(path)!r} must hold a non-empty 2-D integer array (sequences, tokens), got {what}"
        )
    lo, hi = int(arr.min()), int(arr.max())
    if lo < 0 or hi >= vocab_size:
        raise ConfigError(
            f"token file {str(path)!r} has ids in [{lo}, {hi}]; the model's vocabulary is [0, {vocab_size - 1}]"
        )
    if arr.shape[1] > max_len:
        raise ConfigError(
            f"token file {str(path)!r} has sequences of {arr.shape[1]} tokens; the model takes at most {max_len}"
        )
    return arr.long()


class TokenRows(torch.utils.data.Dataset):
    """Rows of a (sequences, tokens) id tensor as ``(ids, label)`` items, for probes and loaders."""

    def __init__(self, ids: torch.Tensor, labels=None):
        self.ids = ids
        self.labels = np.zeros(len(ids), dtype=np.int64) if labels is None else np.asarray(labels, np.int64)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int):
        return self.ids[i], int(self.labels[i])
