"""Study components as data over timm's ViT parameter names and Hugging Face GPT-2's (each
family's patterns are in its ``raystudy.models.architectures`` record).

A *component* is a named set of parameters (``MHA`` = every block's ``attn.qkv`` and
``attn.proj``, weights and biases). A *condition* is the set of components that train; the new
head and the final norm (``HEAD``) train in every condition. ``partition`` checks that every
parameter of a model belongs to exactly one component, so a timm rename (``ls1``, ``reg_token``)
fails loudly instead of silently freezing or training the wrong thing.

    python -m raystudy components --model vit_base_patch16_224   # counts per component/condition
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING

from raystudy.models import architectures

if TYPE_CHECKING:  # torch is imported where a model is, not here: cheap names for the analysis
    import torch.nn as nn


# Ordered: the order tables and condition names are printed in. Every family's patterns
# (raystudy.models.architectures) in one table, so any model's parameters (or a bare list of names) partition.
COMPONENTS: dict[str, tuple[str, ...]] = architectures.component_patterns()

# The components a study condition may name (HEAD always trains; LORA comes with ``lora``).
STUDY_COMPONENTS = ("LN1", "MHA", "LN2", "FC1", "FC2", "EMBED")
NAMED_CONDITIONS = {
    "full": frozenset(STUDY_COMPONENTS),
    "linear_probe": frozenset(),  # the paper's: logistic regression on frozen features, no SGD
    "head_only": frozenset(),  # the new head (and final norm) trained by SGD like the others
    "lora": frozenset({"LORA"}),
}
# Conditions fitted in closed form on frozen features: no learning rate, no steps.
CLOSED_FORM = frozenset({"linear_probe"})
# The paper's seven conditions, in the order its tables use.
PAPER_CONDITIONS = ("LN1", "MHA", "LN2", "FC1", "FC2", "full", "linear_probe")

# How the plasticity probe pairs x with y (a config key, the probe CLI's flag and the probe
# itself read it): kept here, where no torch is imported.
PAIRINGS = ("random", "sequential")

_COMPILED = {name: [re.compile(p) for p in pats] for name, pats in COMPONENTS.items()}


class ConditionError(ValueError):
    """A condition names something that is not a component."""


class PartitionError(RuntimeError):
    """A model has parameters that belong to no component, or to several."""


def parse_condition(condition: str) -> frozenset[str]:
    """Map a condition name to the set of components that train (besides HEAD).

    >>> sorted(parse_condition("mha+FC1"))
    ['FC1', 'MHA']
    """
    if not isinstance(condition, str) or not condition.strip():
        raise ConditionError(f"condition must be a non-empty string, got {condition!r}; {_allowed()}")
    key = condition.strip()
    if key.lower() in NAMED_CONDITIONS:
        return NAMED_CONDITIONS[key.lower()]
    parts = [p.strip().upper() for p in key.split("+")]
    for p in parts:
        if p not in STUDY_COMPONENTS:
            raise ConditionError(f"unknown component {p!r} in condition {condition!r}; {_allowed()}")
    if len(set(parts)) != len(parts):
        raise ConditionError(f"condition {condition!r} names a component twice")
    return frozenset(parts)


def canonical_condition(condition: str) -> str:
    """The one spelling of a condition: named conditions lower-case, combinations in table order."""
    comps = parse_condition(condition)
    if condition.strip().lower() in NAMED_CONDITIONS:
        return condition.strip().lower()
    return "+".join(c for c in STUDY_COMPONENTS if c in comps)


def has_lr(condition: str) -> bool:
    """Whether ``condition`` trains by SGD/AdamW (a grid's lr axis applies to it). A name that
    is no condition (a run record's tags are anyone's to set) is not the closed form: True."""
    try:
        return canonical_condition(condition) not in CLOSED_FORM
    except ConditionError:
        return True


def _allowed() -> str:
    return f"valid: {', '.join(STUDY_COMPONENTS)}, {', '.join(NAMED_CONDITIONS)}, or a '+' combination such as MHA+FC1"


def component_of(param_name: str) -> list[str]:
    """Every component whose patterns match ``param_name`` (exactly one in a sound model)."""
    return [c for c, pats in _COMPILED.items() if any(p.fullmatch(param_name) for p in pats)]


def partition(names: Iterable[str] | nn.Module) -> dict[str, list[str]]:
    """Group parameter names by component, checking each belongs to exactly one.

    Raises PartitionError naming every unmatched or ambiguous parameter.
    """
    if hasattr(names, "named_parameters"):
        names = [n for n, _ in names.named_parameters()]
    groups: dict[str, list[str]] = {c: [] for c in COMPONENTS}
    orphans, ambiguous = [], []
    for name in names:
        owners = component_of(name)
        if not owners:
            orphans.append(name)
        elif len(owners) > 1:
            ambiguous.append(f"{name} ({'/'.join(owners)})")
        else:
            groups[owners[0]].append(name)
    if orphans or ambiguous:
        msg = []
        if orphans:
            msg.append(f"{len(orphans)} parameter(s) belong to no component: {_head(orphans)}")
        if ambiguous:
            msg.append(f"{len(ambiguous)} parameter(s) belong to several: {_head(ambiguous)}")
        raise PartitionError(
            "; ".join(msg)
            + " (has timm renamed something? extend the family's patterns in raystudy.models.architectures)"
        )
    return groups


def _head(items: list[str], k: int = 6) -> str:
    return ", ".join(items[:k]) + (f", ... (+{len(items) - k})" if len(items) > k else "")


def trainable_components(condition: str) -> frozenset[str]:
    """Components that train under ``condition``, HEAD included."""
    return parse_condition(condition) | {"HEAD"}


def add_lora(model: nn.Module, rank: int = 8, alpha: int = 16) -> nn.Module:
    """Inject peft LoRA adapters into the attention linears, in place (keeps the model's names);
    returns the model. The study's: rank 8, alpha 16, on the layers the model's family names
    (``architectures.Architecture.lora_targets``: timm's Linear, GPT-2's Conv1D)."""
    from peft import LoraConfig, inject_adapter_in_model

    for arch in architectures.ARCHITECTURES.values():
        targets = [n for n, m in model.named_modules() if arch.is_lora_layer(m) and n.endswith(arch.lora_targets)]
        if targets:
            break
    else:
        raise PartitionError(
            "model has no attention linears for LoRA ("
            + "; ".join(f"{a.title}: {' / '.join(a.lora_targets)}" for a in architectures.ARCHITECTURES.values())
            + ")"
        )
    config = LoraConfig(
        r=rank, lora_alpha=alpha, lora_dropout=0.0, target_modules=targets, fan_in_fan_out=arch.lora_fan_in_fan_out
    )
    return inject_adapter_in_model(config, model)


def apply_condition(model: nn.Module, condition: str, *, lora_rank: int = 8, lora_alpha: int = 16) -> dict[str, int]:
    """Make exactly the condition's parameters trainable; returns trainable counts per component.

    For ``lora`` the adapters are injected first. Every other parameter gets
    ``requires_grad=False``, so it receives no gradient and no optimizer state.
    """
    return apply_trainable(model, trainable_components(condition), lora_rank=lora_rank, lora_alpha=lora_alpha)


def apply_trainable(
    model: nn.Module, train: frozenset[str], *, lora_rank: int = 8, lora_alpha: int = 16
) -> dict[str, int]:
    """``apply_condition`` for the components ``train`` (``trainable_components``, HEAD included)
    already parsed from the condition: a trial parses its condition once, when it is resolved."""
    if "LORA" in train and not any("lora_" in n for n, _ in model.named_parameters()):
        add_lora(model, lora_rank, lora_alpha)
    groups = partition(model)
    params = dict(model.named_parameters())
    counts = {}
    for comp, names in groups.items():
        on = comp in train
        for n in names:
            params[n].requires_grad_(on)
        if on and names:
            counts[comp] = sum(params[n].numel() for n in names)
    return counts


def component_counts(model: nn.Module) -> dict[str, int]:
    """Parameter count of every component of ``model`` (zero-sized ones omitted)."""
    params = dict(model.named_parameters())
    return {c: sum(params[n].numel() for n in ns) for c, ns in partition(model).items() if ns}


def condition_counts(model: nn.Module, conditions: Iterable[str]) -> dict[str, int]:
    """Trainable-parameter count of each condition on ``model`` (LoRA counted on a copy)."""
    import copy

    per_comp = component_counts(model)
    out = {}
    for cond in conditions:
        comps = trainable_components(cond)
        if "LORA" in comps:
            out[cond] = sum(apply_condition(copy.deepcopy(model), cond).values())
        else:
            out[cond] = sum(per_comp.get(c, 0) for c in comps)
    return out
