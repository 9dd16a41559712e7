"""Finetuning configs: frozen dataclasses loaded from YAML or dicts, strict about keys and values.

A config is plain data. ``load_config`` rejects unknown keys and wrong types with one line that
names the bad value and what is allowed; ``validate`` checks the names (model, dataset,
condition, optimizer) against their registries before any heavy work starts.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import hashlib
import json
import math
import os
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from raystudy.bounds import BOUNDS, SEED_END_TEXT, seed_error
from raystudy.errors import ConfigError, check_input_file
from raystudy.models.components import PAIRINGS

OPTIMIZERS = ("sgd", "adamw")
DEVICES = ("auto", "cpu", "cuda")
LOW_DATA_SPLITS = ("vtab1k", "per_class")
PROBE_BOUNDS = ("raystudy", "paper")  # raystudy.measure.plasticity.BOUNDS, without importing torch here
NORMALIZATIONS = ("checkpoint", "imagenet")
PRECISIONS = ("bf16", "fp32")
ACCURACY_COUNTS = ("per_image", "batch_mean")
LINEAR_PROBE_DATA = ("clean", "augmented")
COMPILE_CHOICES = (False, True, "auto")  # auto: on a GPU, where a measured verdict says it holds
CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"

# The config keys with a row in ``bounds.BOUNDS``, each tuple in the order its check walks it (the
# first error named depends on it): those with a lower bound (the positive ones first), then the seed
# and those with an upper bound. The command lines that take the same counts read the same rows.
LOWER_BOUNDED = (
    "lr",
    "steps",
    "batch_size",
    "grad_accum",
    "eval_every",
    "log_every",
    "eval_batch_size",
    "lora_rank",
    "lora_alpha",
    "weight_decay",
    "momentum",
    "warmup_steps",
    "clip_grad",
    "probe_pairs",
    "probe_batch_size",
    "num_workers",
    "expect_images",
)
LIMITED = (
    "seed",
    "steps",
    "eval_every",
    "log_every",
    "batch_size",
    "eval_batch_size",
    "lora_rank",
    "probe_pairs",
    "num_workers",
)


@dataclass(frozen=True)
class FinetuneConfig:
    """One finetuning run of one study condition. Defaults are the offline demo's."""

    # what to train
    model: str = "vit_demo"
    weights: str | None = None  # local checkpoint file; default: timm hub cache / demo cache
    pretrained: bool = True
    dataset: str = "digits_c"  # a registry dataset; with ``data``: your name for your own data
    data: str = ""  # your own images: a class-folder tree, a .csv/.parquet, a save_to_disk folder or
    # hf:NAME (raystudy.data.userdata); empty: ``dataset`` is a registry dataset
    data_root: str | None = None  # default: $RAYSTUDY_DATA or ~/.cache/raystudy/data
    download: bool = False  # torchvision datasets only, on request
    expect_images: int = 0  # a class-folder dataset must hold this many images (0: any): the
    # seeded split depends on the count, so another release gives other test images
    low_data: bool = False  # the low-data regime (low_data_split says which subsets)
    low_data_split: str = "vtab1k"  # vtab1k: 800 train + 200 val images (the paper's, VTAB-1k);
    # per_class: 10 training images per class
    normalization: str = "checkpoint"  # checkpoint: the model's own mean/std; imagenet: ImageNet's
    # (0.485, 0.456, 0.406) / (0.229, 0.224, 0.225), the paper's
    condition: str = "MHA"
    lora_rank: int = 8
    lora_alpha: int = 16
    # optimisation (the paper: SGD momentum 0.9, wd 0, clip 1.0, cosine with linear warmup)
    optimizer: str = "sgd"
    lr: float = 0.1
    weight_decay: float = 0.0
    momentum: float = 0.9
    betas: tuple[float, float] = (0.9, 0.999)
    steps: int = 300
    warmup_steps: int = 30
    batch_size: int = 64
    grad_accum: int = 1  # micro-batches per step; batch_size is the effective batch
    clip_grad: float = 1.0
    # measurement
    eval_every: int = 50
    eval_last: bool = True  # also evaluate at the last step, so the final weights are a candidate
    # (false: only every eval_every steps, the paper's)
    log_every: int = 50
    eval_batch_size: int = 256
    accuracy: str = "per_image"  # per_image: every image counts once; batch_mean: the mean of
    # per-batch accuracies, as the paper's code counts (a last small batch weighs as much): the
    # test in its batches of 512 whatever eval_batch_size is, validation in eval_batch_size ones
    probe_pairs: int = 0  # plasticity pairs probed before and after (0: no probe)
    probe_pairing: str = "random"  # random: seeded draws; sequential: each split in loader
    # order, whole batches, cycled (the paper's measurement)
    probe_bounds: str = "raystudy"  # the bounds column: raystudy (sound: |γ|max/σ_min, heads
    # by rows, r measured) or paper (the reference's figure: max γ, heads by input columns, r 19.4)
    probe_batch_size: int = 0  # pairs per probe batch (0: eval_batch_size); with sequential
    # pairing it decides which images pair, as in the paper
    linear_probe_data: str = "clean"  # the linear probe's fit: clean (eval transform, every training
    # image) or augmented (one pass of training batches with the
    # training augmentation, the last partial batch dropped: the paper's)
    # execution
    precision: str = "bf16"  # bf16 autocast on GPU (fp32 on CPU either way), or fp32 (the paper's)
    seed: int = 0
    device: str = "auto"
    num_workers: int = 0
    compile: bool | str = False  # true, false, or auto: on a GPU for the conditions whose measured
    # verdict holds (search_spaces/measured/compile_verdicts.json), off on a CPU and under DDP
    data_path: str = "auto"  # torchvision (per image) | cache (tensor cache, batched on
    # the device) | auto (cache for the demo, else torchvision)

    def to_dict(self) -> dict[str, Any]:
        """The config as plain data (``betas`` a list), as YAML and MLflow take it."""
        d = dataclasses.asdict(self)
        d["betas"] = list(self.betas)
        return d

    def replace(self, **changes: Any) -> FinetuneConfig:
        """A copy with ``changes`` applied, checked as ``from_dict`` checks a config."""
        return from_dict({**self.to_dict(), **changes})


@functools.cache
def _field_types() -> dict[str, Any]:
    return typing.get_type_hints(FinetuneConfig)


def check_value(key: str, value: Any) -> Any:
    """One config value, typed and checked as ``from_dict`` would, and within its bound if it
    has one (``LIMITED``, the seed's range): a grid axis value."""
    value = _coerce(key, value, _field_types()[key])
    _check_limit(key, value)
    return value


def _coerce(key: str, value: Any, tp: Any) -> Any:
    """Check ``value`` against the annotated type; ints are accepted for floats."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        if len(inner) > 1:  # compile: a bool or a word (auto)
            for a in inner:
                try:
                    return _coerce(key, value, a)
                except ConfigError:
                    pass
            raise ConfigError(f"config key {key!r} must be true, false or auto, got {value!r}")
        return _coerce(key, value, inner[0])
    if origin is tuple:
        args = typing.get_args(tp)
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            raise ConfigError(f"config key {key!r} must be a list of {len(args)} numbers, got {value!r}")
        return tuple(_coerce(key, v, a) for v, a in zip(value, args))
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"config key {key!r} must be true or false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"config key {key!r} must be an integer, got {value!r}")
    if tp is float:
        out = None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out = float(value)
        elif isinstance(value, str):  # YAML 1.1 reads "1e-3" as a string
            try:
                out = float(value)
            except ValueError:
                pass
        if out is None:
            raise ConfigError(f"config key {key!r} must be a number, got {value!r}")
        if not math.isfinite(out):  # NaN passes every range check: refuse it here
            raise ConfigError(f"config key {key!r} must be a finite number, got {value!r}")
        return out
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"config key {key!r} must be a string, got {value!r}")
    return value


def parse_value(key: str, text: str) -> Any:
    """A config value from text (a CLI flag, ``--set key=value``, an MLflow param), typed by the
    key: ``"3e-3"`` for ``lr`` is 0.003, ``"None"`` for ``weights`` is None, ``"[0.9, 0.99]"``
    for ``betas`` a pair. The one parser of config values from text."""
    types_ = _field_types()
    if key not in types_:
        close = difflib.get_close_matches(str(key), types_, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"unknown config key {key!r}{hint}; valid keys: {', '.join(types_)}")
    tp = types_[key]
    if text in ("None", "null", "~") and type(None) in typing.get_args(tp):
        return None
    if bool in typing.get_args(tp) and text.strip().lower() in ("true", "false"):
        return text.strip().lower() == "true"  # compile: a bool, or a word such as auto
    if tp is str or (typing.get_origin(tp) in (typing.Union, types.UnionType) and str in typing.get_args(tp)):
        return text  # a name stays a name: "1e3" as a dataset is not a number
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        raise ConfigError(f"config key {key!r}: cannot read {text!r} as a value") from None
    if tp is bool and isinstance(value, str) and value.lower() in ("true", "false"):
        value = value.lower() == "true"  # MLflow logs Python's True/False
    if tp is int and isinstance(value, float) and value.is_integer():
        value = int(value)
    return _coerce(key, value, tp)


# Config keys that say how a trial runs, not what it is: they do not enter its key.
EXECUTION_KEYS = frozenset(
    {"device", "num_workers", "data_root", "download", "compile", "eval_batch_size", "log_every", "expect_images"}
)


# Identity keys added after studies were recorded: at these values they stay out of the key, so a
# trial recorded before the key existed is still recognised as the same trial.
KEYS_ADDED = {
    "probe_batch_size": 0,
    "precision": "bf16",
    "accuracy": "per_image",
    "linear_probe_data": "clean",
    "data": "",
    "eval_last": True,
    "probe_bounds": "raystudy",
}


def trial_key(config: dict[str, Any]) -> str:
    """A stable key for a trial config: the hash of its identity keys, canonical JSON."""
    ident = {
        k: v
        for k, v in sorted(config.items())
        if k not in EXECUTION_KEYS and not (k in KEYS_ADDED and v == KEYS_ADDED[k])
    }
    return hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:16]


def from_dict(d: dict[str, Any]) -> FinetuneConfig:
    """Build a config, refusing unknown keys and mistyped values."""
    if not isinstance(d, dict):
        raise ConfigError(f"a config must be a mapping of keys to values, got {type(d).__name__}")
    types_ = _field_types()
    for key in d:
        if key not in types_:
            close = difflib.get_close_matches(str(key), types_, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"unknown config key {key!r}{hint}; valid keys: {', '.join(types_)}")
    return FinetuneConfig(**{k: _coerce(k, v, types_[k]) for k, v in d.items()})


def read_yaml(path: str | os.PathLike, what: str = "config file") -> dict[str, Any]:
    """The YAML document of a config or space file; ConfigError in one line if it is missing, a
    folder, unreadable, not YAML, or says nothing (empty, comments only, ``{}``): a file that
    says nothing is more likely a mistake than a choice of every default."""
    p = Path(path)
    check_input_file(what, p)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{what} {str(p)!r} is not a readable text file ({type(e).__name__})") from None
    if "\x00" in text:
        raise ConfigError(f"{what} {str(p)!r} is not a readable text file (binary)")
    try:
        data = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # C: big grids
    except yaml.YAMLError as e:
        raise ConfigError(f"{what} {str(p)!r} is not valid YAML: {str(e).splitlines()[0]}") from None
    if data is None or data == {}:
        raise ConfigError(f"{what} {str(p)!r} is empty: give at least one key (an empty file would run every default)")
    return data


def load_config(source: str | os.PathLike | dict | None = None, **overrides: Any) -> FinetuneConfig:
    """A config from a YAML file, a bundled name (``demo``) or a dict, with overrides on top."""
    if source is None:
        base: dict[str, Any] = {}
    elif isinstance(source, dict):
        base = dict(source)
    elif (CONFIG_DIR / f"{source}.yaml").is_file() and not Path(source).exists():
        base = read_yaml(CONFIG_DIR / f"{source}.yaml")
    else:
        base = read_yaml(source)
    if not isinstance(base, dict):
        raise ConfigError(f"config {str(source)!r} must be a mapping of keys to values")
    return from_dict({**base, **overrides})


def limit_help(key: str) -> str:
    """A config key's bound as help text states it ("" for a key without one)."""
    if key == "seed":
        return f"{BOUNDS['seed'].low} <= seed < {SEED_END_TEXT}"
    return f"at most {BOUNDS[key].high:,}" if key in LIMITED else ""


def _check_limit(key: str, value: Any) -> None:
    if key not in LIMITED:
        return
    b = BOUNDS[key]
    if key == "seed" and (b.below(value) or b.over(value)):
        raise ConfigError(seed_error("config key 'seed'", value, "config"))
    if b.over(value):
        raise ConfigError(f"config key {key!r} must be <= {b.high:,} ({b.reason('config')}), got {value:,}")


def check_limits(cfg: FinetuneConfig) -> None:
    """The seed and every count of ``cfg`` within its bound (``LIMITED``); ConfigError naming it."""
    for key in LIMITED:
        _check_limit(key, getattr(cfg, key))


def _check_choices(cfg: FinetuneConfig) -> None:
    """Each of ``cfg``'s fixed-choice keys (optimizer, device, split, ...) among its allowed values."""
    if cfg.optimizer not in OPTIMIZERS:
        raise ConfigError(f"unknown optimizer {cfg.optimizer!r}; valid: {', '.join(OPTIMIZERS)}")
    if cfg.device not in DEVICES:
        raise ConfigError(f"unknown device {cfg.device!r}; valid: {', '.join(DEVICES)}")
    if not any(cfg.compile is c or (isinstance(c, str) and cfg.compile == c) for c in COMPILE_CHOICES):
        raise ConfigError(f"unknown compile {cfg.compile!r}; valid: true, false, auto")
    for key, allowed in (
        ("low_data_split", LOW_DATA_SPLITS),
        ("normalization", NORMALIZATIONS),
        ("probe_pairing", PAIRINGS),
        ("probe_bounds", PROBE_BOUNDS),
        ("precision", PRECISIONS),
        ("accuracy", ACCURACY_COUNTS),
        ("linear_probe_data", LINEAR_PROBE_DATA),
    ):
        if getattr(cfg, key) not in allowed:
            raise ConfigError(f"unknown {key} {getattr(cfg, key)!r}; valid: {', '.join(allowed)}")


@dataclass(frozen=True)
class Names:
    """What checking a config's names looked up in the registries, kept for the trial's plan
    (``raystudy.train.plan.resolve``) so that no later step looks it up again."""

    trainable: frozenset[str]  # the condition's components, HEAD included
    data_path: str  # torchvision or cache: ``auto`` resolved
    model: str  # the full model name
    architecture: Any  # the family record (raystudy.models.architectures.Architecture)
    inputs: dict[str, Any]  # registry.input_config
    mean: tuple[float, ...]
    std: tuple[float, ...]
    source: str  # the dataset the model was pretrained on, where plasticity probes draw x from


def _check_names(cfg: FinetuneConfig) -> Names:
    """``cfg``'s condition, dataset, model and weights known to their registries, and the model
    fits the dataset; returns what the checks looked up."""
    from raystudy.data.registry import DATASETS, dataset_info
    from raystudy.data.splits import resolve_data_path
    from raystudy.models import components, registry

    try:
        condition = components.parse_condition(cfg.condition)
    except components.ConditionError as e:
        raise ConfigError(str(e)) from None
    info = dataset_info(cfg.dataset, cfg.data)
    data_path = resolve_data_path(cfg.data_path, cfg.dataset, cfg.data)
    full = registry.check_model(cfg.model)
    arch = registry.architecture(cfg.model)
    if arch.tokens != info.tokens:
        fits = [n for n, i in DATASETS.items() if i.tokens == arch.tokens]
        raise ConfigError(
            f"model {cfg.model!r} reads {arch.inputs}, dataset {cfg.dataset!r} does not; "
            f"datasets for it: {', '.join(fits)}"
        )
    inputs = registry.input_config(cfg.model)
    mean, std = registry.normalization_of(inputs, cfg.model, cfg.normalization)
    source = registry.source_dataset(cfg.model)
    if cfg.weights is not None:
        registry.check_weights_file(cfg.weights)
    return Names(condition | {"HEAD"}, data_path, full, arch, inputs, mean, std, source)


def _check_signs(cfg: FinetuneConfig) -> None:
    """``cfg``'s rates, counts and sizes > 0, and its decays, clips and optional counts >= 0
    (``LOWER_BOUNDED``: each key's row in ``bounds.BOUNDS``)."""
    for key in LOWER_BOUNDED:
        b = BOUNDS[key]
        if b.below(getattr(cfg, key)):
            raise ConfigError(
                f"config key {key!r} must be {'>' if b.above else '>='} {b.low:g}, got {getattr(cfg, key)!r}"
            )


def _check_relations(cfg: FinetuneConfig) -> None:
    """``cfg``'s keys consistent with each other: batch vs accumulation, warmup vs steps, betas in [0, 1)."""
    if cfg.batch_size % cfg.grad_accum:
        raise ConfigError(f"batch_size {cfg.batch_size} must be divisible by grad_accum {cfg.grad_accum}")
    if cfg.warmup_steps >= cfg.steps:
        raise ConfigError(f"warmup_steps {cfg.warmup_steps} must be below steps {cfg.steps}")
    if not all(0.0 <= b < 1.0 for b in cfg.betas):
        raise ConfigError(f"betas must lie in [0, 1), got {list(cfg.betas)}")


def validate(cfg: FinetuneConfig) -> FinetuneConfig:
    """Check every name and range; raises ConfigError with one line. Cheap: no weights, no data."""
    checked_names(cfg)
    return cfg


def checked_names(cfg: FinetuneConfig) -> Names:
    """``validate``, returning what checking the names looked up (a trial's plan is made of it)."""
    _check_choices(cfg)
    names = _check_names(cfg)
    _check_signs(cfg)
    check_limits(cfg)
    _check_relations(cfg)
    return names
