"""The bounds of every count, size, duration and seed raystudy takes, as data: one table that a
config (``train.config``), a space file (``spaces.schema``) and a command line's flags (``cli``)
all check against, and the one check of a seed and a list of seeds.

Each bound is named after its config or space key (a flag names its row in ``cli.FLAGS``). An
upper bound follows from what the value sizes: past it a value is a typo or a unit mistake that
would exhaust memory or a cluster, or never end. Each place words its own error line from the
row (config, space and flag lines differ); ``Bound.says`` holds a place's own reason where its
line has always given another one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

# What an error line calls each kind of value; all three refuse nan and inf.
KINDS = {"int": "an integer", "number": "a number", "finite": "a finite number"}
PLACES = ("config", "space", "flag")  # where a value comes from: a config key, a space file's key, a flag


@dataclass(frozen=True)
class Bound:
    """What one value may be: its ``kind`` (a name in ``KINDS``), at least ``low`` (more than
    it, if ``above``), at most ``high`` (None: unbounded there), and ``why`` the upper bound is
    where it is; ``says``: the reason a place (one of ``PLACES``) gives instead."""

    kind: str
    low: float | None = None
    above: bool = False
    high: float | None = None
    why: str = ""
    says: Mapping[str, str] = field(default_factory=dict)

    def reason(self, place: str) -> str:
        """Why ``high`` is where it is, as ``place``'s error line and help text state it."""
        return self.says.get(place, self.why)

    def least(self) -> float:
        """The least value allowed, for an integer: ``low``, or the next integer if ``above``."""
        return self.low + 1 if self.above and self.kind == "int" else self.low

    def below(self, value: Any) -> bool:
        """``value`` under the lower bound (at it, if ``above``)."""
        return self.low is not None and (value <= self.low if self.above else value < self.low)

    def over(self, value: Any) -> bool:
        """``value`` past the upper bound."""
        return self.high is not None and value > self.high


# Shared by several rows; private, so that every check reads a row, not a number of its own.
_YEAR_S = 366 * 86_400
_MAX_STEPS = 10_000_000
_MAX_BATCH = 65_536
_MAX_PAIRS = 1_000_000
_MAX_CPUS = 1024
_MAX_GPUS = 1_024  # GPUs of one trial: a large cluster's
_BATCH_WHY = "memory: a batch's images are held at once"
_PAIRS_WHY = "time: each pair is a forward pass per component and probe mode; the paper measures 12,800"
SEED_END_TEXT = "2**32"  # the end of the seeds' range (BOUNDS["seed"].high + 1) as lines and help state it


def _int(low: int, high: int | None = None, why: str = "", above: bool = False, **says: str) -> Bound:
    return Bound("int", low=low, above=above, high=high, why=why, says=MappingProxyType(says))  # read-only: a table


def _real(kind: str, low: float, high: float | None = None, why: str = "", above: bool = False) -> Bound:
    return Bound(kind, low=low, above=above, high=high, why=why)


BOUNDS: dict[str, Bound] = {
    # config keys (``train.config``); the finetune and grid flags set them through the config
    "lr": _real("finite", 0, above=True),
    "steps": _int(0, _MAX_STEPS, "time: a thousand times the paper's longest run", above=True),
    "batch_size": _int(0, _MAX_BATCH, _BATCH_WHY, above=True, flag="memory: a batch is held at once"),
    "grad_accum": _int(0, above=True),
    "eval_every": _int(0, _MAX_STEPS, "steps", above=True),
    "log_every": _int(0, _MAX_STEPS, "steps", above=True),
    "eval_batch_size": _int(0, _MAX_BATCH, _BATCH_WHY, above=True),
    "lora_rank": _int(0, 4096, "a rank above a layer's width adds nothing", above=True),
    "lora_alpha": _int(0, above=True),
    "weight_decay": _real("finite", 0),
    "momentum": _real("finite", 0),
    "warmup_steps": _int(0),
    "clip_grad": _real("finite", 0),
    "probe_pairs": _int(0, _MAX_PAIRS, _PAIRS_WHY),  # 0: no probe
    "probe_batch_size": _int(0),  # 0: eval_batch_size
    "num_workers": _int(0, 256, "data loading processes"),
    "expect_images": _int(0),  # 0: any count
    "seed": _int(0, 2**32 - 1, "the seeds numpy's legacy seeding and scikit-learn take", space="numpy's seeds"),
    # a space file's keys (``spaces.schema``): a model's resources, Ray Tune's options, a search's budget
    "gpu": _real("number", 0, _MAX_GPUS, "GPUs of one trial"),
    "cpu": _real("number", 0, _MAX_CPUS, "CPUs of one trial"),
    "workers": _int(1, _MAX_GPUS, "DDP workers of one trial, a GPU each"),
    "step_seconds": _real("finite", 0, 86_400, "seconds: a day per step", above=True),
    "max_failures": _int(
        0, 100, "retries of one trial, each a rerun from its checkpoint", space="retries of one trial"
    ),
    "max_concurrent": _int(1, 100_000, "trials at once, a process each"),
    "threads_per_trial": _int(1, _MAX_CPUS, "threads of one process"),
    "checkpoint_every_s": _real("finite", 0, _YEAR_S, "seconds: a year"),
    "trials_per_run": _int(1, 100_000, "trials of one Tune run"),
    "num_samples": _int(1, 100_000, "trials per study, each a finetuning run"),
    "time_budget_s": _real("finite", 0, _YEAR_S, "seconds: a year", above=True),
    "lr_scale": _real("finite", 0, above=True),
    "grace_period": _int(1),
    "reduction_factor": _int(2),
    # flags of their own (``cli.FLAGS``)
    "num_cpus": _int(1, _MAX_CPUS, "a local Ray's CPUs are one machine's"),
    "pairs": _int(1, _MAX_PAIRS, _PAIRS_WHY),  # the probe's: at least one, unlike probe_pairs
    "bootstrap_reps": _int(1, 100_000, "memory: each replicate holds a score per condition, dataset and seed"),
    "nodes": _int(1),
    "cpus_per_node": _int(1),
    "gpus_per_node": _int(0),
    "stop_before": _int(60),
    "rehearse_s": _real("finite", 0, 3600, "seconds of one synthetic trial: an hour", above=True),
}


# ---------------------------------------------------------------- seeds


def is_seed(value: Any) -> bool:
    """``value`` an integer seed within ``BOUNDS["seed"]`` (a bool is not one)."""
    b = BOUNDS["seed"]
    return isinstance(value, int) and not isinstance(value, bool) and b.low <= value <= b.high


def is_seed_list(value: Any, distinct: bool = False) -> bool:
    """``value`` a non-empty list of seeds (``distinct``: none of them twice)."""
    return (
        isinstance(value, list)
        and bool(value)
        and all(is_seed(v) for v in value)
        and (not distinct or len(set(value)) == len(value))
    )


def parse_seed_list(text: str) -> list[int] | None:
    """Distinct seeds from comma-separated text (``100,101,102``); None where it holds none, a
    non-integer, one out of range or one twice."""
    try:
        seeds = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        return None
    return seeds if is_seed_list(seeds, distinct=True) else None


def seed_error(who: str, value: Any, place: str) -> str:
    """The error line of a seed out of range: a config key's or a flag's (``who``, from ``place``)."""
    b = BOUNDS["seed"]
    return f"{who} must be >= {b.low} and < {SEED_END_TEXT} ({b.high + 1:,}: {b.reason(place)}), got {value}"
