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

from raystudy.data import datasets
from raystudy.models import architectures, components, registry
from raystudy.train.config import FinetuneConfig, checked_names


@dataclass(frozen=True)
class SplitPlan:
    """One dataset's ``datasets.build_splits`` arguments, but for ``augment_train``."""

    dataset: str
    seed: int
    img_size: int | None
    mean: tuple[float, ...]
    std: tuple[float, ...]
    root: str | None
    download: bool = False
    low_data: bool = False
    low_data_split: str = "vtab1k"
    data_path: str = "torchvision"
    data: str = ""
    channels: int = 3

    def build(self, augment_train: bool = True) -> datasets.Splits:
        """The splits (``augment_train=False``: the eval transform on training images too)."""
        return datasets.build_splits(
            self.dataset,
            seed=self.seed,
            img_size=self.img_size,
            mean=self.mean,
            std=self.std,
            root=self.root,
            download=self.download,
            low_data=self.low_data,
            low_data_split=self.low_data_split,
            data_path=self.data_path,
            augment_train=augment_train,
            data=self.data,
            channels=self.channels,
        )


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
    splits: SplitPlan  # the run's data
    source: SplitPlan  # the plasticity probe's x: the model's pretraining data
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
        splits=SplitPlan(
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
        source=SplitPlan(registry.source_dataset(cfg.model), cfg.seed, img_size, names.mean, names.std, cfg.data_root),
        trainable=names.trainable,
        closed_form=cfg.condition in components.CLOSED_FORM,
        optim=OptimizerPlan(cfg.optimizer, cfg.lr, cfg.momentum, cfg.weight_decay, cfg.betas),
    )
