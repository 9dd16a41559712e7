"""What a trial is, resolved once: the plan the loop and its helpers read.

``resolve(cfg)`` validates a config and keeps what validating it looked up (the model's full
name, family record and input config, the normalisation, the dataset's entry and data path, the
condition's components), adds what follows from those (the splits' parameters, the probe's
source, the optimizer's settings), and hands it all on as one frozen ``TrialPlan``. The loop
(``raystudy.train.engine``) then derives none of it again, however many helpers it calls.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from raystudy.data.splits import SplitSpec
from raystudy.models import architectures, components
from raystudy.train.config import FinetuneConfig, checked_names


@dataclass(frozen=True)
class OptimizerPlan:
    """The optimizer's settings, under the config's key names (``engine.build_optimizer`` takes
    either)."""

    optimizer: str
    lr: float
    momentum: float
    weight_decay: float
    betas: tuple[float, float]


@dataclass(frozen=True)
class TrialPlan:
    """One trial, resolved: the validated config and everything derived from it."""

    cfg: FinetuneConfig
    model: str  # the full model name
    architecture: architectures.Architecture
    inputs: dict[str, Any]  # registry.input_config: img_size, in_chans, mean, std (, tokens)
    mean: tuple[float, ...]  # the normalisation the run sees images with
    std: tuple[float, ...]
    splits: SplitSpec  # the run's data
    source: SplitSpec  # the plasticity probe's x: the model's pretraining data
    trainable: frozenset[str]  # the condition's components, HEAD included
    closed_form: bool  # fitted on frozen features (linear_probe): no steps
    optim: OptimizerPlan


def resolve(cfg: FinetuneConfig) -> TrialPlan:
    """``cfg`` validated (``config.validate``; ConfigError in one line) and resolved into its plan."""
    names = checked_names(cfg)
    img_size = names.inputs["img_size"]
    return TrialPlan(
        cfg=cfg,
        model=names.model,
        architecture=names.architecture,
        inputs=names.inputs,
        mean=names.mean,
        std=names.std,
        splits=SplitSpec(
            cfg.dataset,
            cfg.seed,
            img_size,
            names.mean,
            names.std,
            cfg.data_root,
            download=cfg.download,
            low_data=cfg.low_data,
            low_data_split=cfg.low_data_split,
            data_path=names.data_path,
            data=cfg.data,
            channels=names.inputs["in_chans"] or 3,
        ),
        # The source as the finetuning sees images (its normalisation), on the default data path.
        source=SplitSpec(names.source, cfg.seed, img_size, names.mean, names.std, cfg.data_root),
        trainable=names.trainable,
        closed_form=cfg.condition in components.CLOSED_FORM,
        optim=OptimizerPlan(cfg.optimizer, cfg.lr, cfg.momentum, cfg.weight_decay, cfg.betas),
    )
