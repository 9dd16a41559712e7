"""What a trial costs in GPU time: measured seconds per step where a measurement exists, else the
space's estimate from FLOPs.

A *step-times file* (JSON, written by ``benchmarks/gpu_acceptance.py``) holds, per model
architecture and per condition, the wall seconds of one training step at a stated number of
images per GPU, and where they were measured::

    {"format": "raystudy-step-times/1", "gpu": "NVIDIA H200", "date": "2026-05-01T12:00:00+00:00",
     "command": "python benchmarks/gpu_acceptance.py --out /tmp/gpu", "precision": "bf16",
     "models": {"vit_base_patch16_224": {
         "batch_per_gpu": 256, "data_feed_factor": 1.02,
         "seconds_per_step": {"full": 0.080, "MHA": 0.049, "linear_probe": 0.021},
         "compiled_seconds_per_step": {"full": 0.066}}}}

A grid space names one with ``step_times: FILE`` (relative to the space's own folder);
``python -m raystudy.grid --dry-run`` then prices each trial from it, says so, and falls back to
the space's ``step_seconds`` for trials the file does not cover, or when it is not there yet.

Pricing rule: a step's time grows linearly with the images each GPU processes in it (a trial's
batch over its DDP workers); ``data_feed_factor`` (a step fed by the real data path over one fed
a ready batch, measured) multiplies it. GPU-hours are wall hours times the trial's GPUs.
Evaluation passes are not priced: they are a small share of a trial's steps.

Compile verdicts (JSON, written by ``benchmarks/gpu_acceptance.py --parts B``, read from
``search_spaces/measured/compile_verdicts.json``) say per condition whether torch.compile holds
and what a trial's compile takes: ``compile: auto`` is on, on a GPU, where it holds, and a
compiled trial is priced with its compile seconds.

Pure arithmetic over plain data: no Ray, no MLflow, no device; nothing happens at import.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raystudy.errors import ConfigError

FORMAT = "raystudy-step-times/1"
VERDICTS_FORMAT = "raystudy-compile-verdicts/1"
# Where ``compile: auto`` reads whether compile holds per condition (written by the GPU acceptance's
# part set B, copied there by hand once it ran on a GPU).
COMPILE_VERDICTS = Path(__file__).resolve().parents[2] / "search_spaces" / "measured" / "compile_verdicts.json"


class StepTimesError(ConfigError):
    """A step-times file that cannot be used: one line naming the file and what is wrong."""


@dataclass(frozen=True)
class ModelTimes:
    """Measured seconds per training step of one architecture, per canonical condition name."""

    batch_per_gpu: float
    seconds: dict[str, float]
    compiled: dict[str, float] = field(default_factory=dict)
    data_feed_factor: float = 1.0


@dataclass(frozen=True)
class StepTimes:
    """A step-times file: per-architecture measurements and where they come from."""

    models: dict[str, ModelTimes]
    gpu: str = "unknown GPU"
    date: str = "unknown date"
    command: str = ""
    path: str | None = None

    def describe(self) -> str:
        """Where the step times come from, in one phrase: the GPU, the date and the file."""
        where = f"; {shown(self.path)}" if self.path else ""
        return f"{self.gpu}, {self.date[:10]}{where}"


@dataclass(frozen=True)
class TrialCost:
    """What pricing needs of one trial."""

    condition: str
    steps: int
    batch: int  # images per optimizer step, all GPUs together
    workers: int = 1  # DDP workers; each takes batch / workers images
    gpus: float = 1.0  # GPUs the trial holds (all workers)
    compiled: bool = False
    compile_s: float = 0.0  # wall seconds its compiles take, all ``steps`` counted (a compiled trial)


def hours_text(h: float) -> str:
    """GPU-hours for a line of output: whole hours, and two significant digits below half an hour
    (a small study on your own data would otherwise read "0 GPU-hours")."""
    return f"{h:.2g}" if 0 < h < 0.5 else f"{h:,.0f}"


@dataclass(frozen=True)
class Estimate:
    """GPU-hours of a list of trials, by condition, and which source priced how many trials."""

    hours: float | None  # None: no trial could be priced
    by_condition: dict[str, float]
    measured: int  # trials priced from the step-times file
    estimated: int  # trials priced from the space's step_seconds
    unpriced: int  # neither
    table: StepTimes | None = None
    fallback: float | None = None
    note: str = ""  # why a named file was not used, if it was not

    def describe(self) -> str:
        """One line for ``--dry-run``: the hours and the source they rest on."""
        if self.hours is None:
            return "no GPU-hour estimate (no step_seconds and no measured step times" + (
                f"; {self.note})" if self.note else ")"
            )
        head = f"estimate {hours_text(self.hours)} GPU-hours"
        fb = f"step_seconds={self.fallback} from the space, a FLOP estimate"
        if self.measured and not self.estimated:
            text = f"{head} from measured step times ({self.table.describe()})"
        elif self.measured:
            text = (
                f"{head}: {self.measured} trials from measured step times "
                f"({self.table.describe()}), {self.estimated} from {fb}"
            )
        else:
            text = f"{head} ({fb}" + (f"; {self.note})" if self.note else ")")
        if self.unpriced:
            text += f"; {self.unpriced} trials unpriced (no measurement, no step_seconds)"
        return text


# ---------------------------------------------------------------- names


def shown(path: str | Path) -> str:
    """``path`` relative to the working directory when it lies below it (shorter lines)."""
    p = Path(path)
    try:
        return str(p.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(p)


def arch(model: str) -> str:
    """The architecture a model name stands for: alias resolved, pretrained tag dropped.

    >>> arch("vit_base")
    'vit_base_patch16_224'
    """
    from raystudy.models.registry import ALIASES

    return ALIASES.get(model, model).split(".")[0]


def _condition(name: str) -> str:
    from raystudy.models.components import canonical_condition

    return canonical_condition(name)


# ---------------------------------------------------------------- the file


def _positive(where: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise StepTimesError(f"{where} must be a positive number, got {value!r}")
    return float(value)


def _seconds(where: str, table: Any) -> dict[str, float]:
    if not isinstance(table, dict):
        raise StepTimesError(f"{where} must map conditions to seconds, got {type(table).__name__}")
    out = {}
    for cond, secs in table.items():
        try:
            key = _condition(str(cond))
        except ValueError as e:
            raise StepTimesError(f"{where}: {e}") from None
        out[key] = _positive(f"{where}.{cond}", secs)
    return out


def parse_step_times(doc: Any, source: str = "step times") -> StepTimes:
    """Check a step-times document (a dict, as in the module docstring) and return it as StepTimes."""
    if not isinstance(doc, dict):
        raise StepTimesError(f"{source}: expected a JSON object, got {type(doc).__name__}")
    if doc.get("format") != FORMAT:
        raise StepTimesError(f"{source}: format must be {FORMAT!r}, got {doc.get('format')!r}")
    raw_models = doc.get("models")
    if not isinstance(raw_models, dict) or not raw_models:
        raise StepTimesError(f"{source}: 'models' must map architectures to measurements")
    models = {}
    for name, m in raw_models.items():
        where = f"{source}: models.{name}"
        if not isinstance(m, dict):
            raise StepTimesError(f"{where} must be a mapping, got {type(m).__name__}")
        unknown = set(m) - {
            "batch_per_gpu",
            "seconds_per_step",
            "compiled_seconds_per_step",
            "data_feed_factor",
            "notes",
        }
        if unknown:
            raise StepTimesError(
                f"{where}: unknown key {sorted(unknown)[0]!r}; valid: batch_per_gpu, "
                "seconds_per_step, compiled_seconds_per_step, data_feed_factor, notes"
            )
        models[arch(str(name))] = ModelTimes(
            batch_per_gpu=_positive(f"{where}.batch_per_gpu", m.get("batch_per_gpu")),
            seconds=_seconds(f"{where}.seconds_per_step", m.get("seconds_per_step")),
            compiled=_seconds(f"{where}.compiled_seconds_per_step", m.get("compiled_seconds_per_step") or {}),
            data_feed_factor=_positive(f"{where}.data_feed_factor", m.get("data_feed_factor", 1.0)),
        )
    return StepTimes(
        models=models,
        gpu=str(doc.get("gpu", "unknown GPU")),
        date=str(doc.get("date", "unknown date")),
        command=str(doc.get("command", "")),
    )


def load_step_times(path: str | Path) -> StepTimes:
    """Read and check a step-times file; StepTimesError (one line) if it is missing or malformed."""
    p = Path(path)
    try:
        doc = json.loads(p.read_text())
    except FileNotFoundError:
        raise StepTimesError(f"step-times file {str(p)!r} does not exist") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise StepTimesError(f"step-times file {str(p)!r} is not readable JSON: {e}") from None
    t = parse_step_times(doc, source=str(p))
    return StepTimes(t.models, t.gpu, t.date, t.command, str(p))


def write_step_times(path: str | Path, doc: dict) -> Path:
    """Check ``doc`` and write it as a step-times file (atomically: a reader never sees half)."""
    parse_step_times(doc, source=str(path))
    p = Path(path)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=False) + "\n")
    tmp.replace(p)
    return p


# ---------------------------------------------------------------- pricing


def step_seconds(
    table: StepTimes, model: str, condition: str, batch_per_gpu: float, compiled: bool = False
) -> float | None:
    """Seconds of one step of ``condition`` with ``batch_per_gpu`` images per GPU; None if not measured.

    Compiled trials use compiled measurements where there are some, else eager ones.
    """
    m = table.models.get(arch(model))
    if m is None:
        return None
    cond = _condition(condition)
    secs = (m.compiled.get(cond) if compiled else None) or m.seconds.get(cond)
    if secs is None:
        return None
    return secs * batch_per_gpu / m.batch_per_gpu * m.data_feed_factor


def trial_seconds(
    model: str,
    condition: str,
    steps: int,
    batch: int,
    table: StepTimes | None = None,
    fallback: float | None = None,
    *,
    workers: int = 1,
    compiled: bool = False,
) -> tuple[float | None, str]:
    """Wall seconds of a trial's ``steps`` training steps, and their source.

    ``table``'s measurement of (model, condition) scaled to ``batch / workers`` images per GPU
    (source ``"measured"``); else ``steps × fallback``, the space's ``step_seconds`` for the
    trial as configured (``"estimate"``); else ``(None, "none")``.
    """
    if table is not None:
        secs = step_seconds(table, model, condition, batch / max(workers, 1), compiled)
        if secs is not None:
            return steps * secs, "measured"
    if fallback is not None:
        return steps * float(fallback), "estimate"
    return None, "none"


def estimate(
    model: str,
    trials: Iterable[TrialCost],
    *,
    step_times: StepTimes | str | Path | None = None,
    fallback: float | None = None,
) -> Estimate:
    """GPU-hours of ``trials`` of ``model``: measured where ``step_times`` covers them, else ``fallback``.

    ``step_times`` is a StepTimes, a file path, or None. A path that does not exist yet is not an
    error: the estimate falls back and its note says so. A malformed file raises StepTimesError.
    """
    table, note = None, ""
    if isinstance(step_times, StepTimes):
        table = step_times
    elif step_times is not None:
        if Path(step_times).is_file():
            table = load_step_times(step_times)
        else:
            note = f"measured step times {shown(step_times)} not found"
    if table is not None and arch(model) not in table.models:
        note = f"{shown(table.path) if table.path else 'the step-times file'} has no measurement of {arch(model)}"
    counts = {"measured": 0, "estimate": 0, "none": 0}
    by_cond: dict[str, float] = {}
    for t in trials:
        secs, source = trial_seconds(
            model, t.condition, t.steps, t.batch, table, fallback, workers=t.workers, compiled=t.compiled
        )
        counts[source] += 1
        if secs is not None:
            secs += t.compile_s if t.compiled else 0.0
            by_cond[t.condition] = by_cond.get(t.condition, 0.0) + secs * t.gpus / 3600.0
    priced = counts["measured"] + counts["estimate"]
    return Estimate(
        hours=sum(by_cond.values()) if priced else None,
        by_condition=by_cond,
        measured=counts["measured"],
        estimated=counts["estimate"],
        unpriced=counts["none"],
        table=table if counts["measured"] else None,
        fallback=fallback,
        note=note,
    )


# ---------------------------------------------------------------- compile: auto


@dataclass(frozen=True)
class CompileVerdicts:
    """Per condition (canonical name), whether compile holds, and the seconds a trial's compile takes."""

    holds: dict[str, bool]
    seconds: dict[str, float]  # warm (Inductor's cache shared on the node) where measured, else cold
    gpu: str = "unknown GPU"
    date: str = "unknown date"
    path: str | None = None


def load_compile_verdicts(path: str | Path | None = None) -> CompileVerdicts | None:
    """The compile verdicts at ``path`` (default ``COMPILE_VERDICTS``); None when there is no file
    or it comes from a smoke run (a code-path check, not a verdict); StepTimesError if malformed."""
    p = Path(path) if path is not None else COMPILE_VERDICTS
    if not p.is_file():
        return None
    st = p.stat()
    return _verdicts(str(p), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _verdicts(path: str, size: int, mtime_ns: int) -> CompileVerdicts | None:
    """The file read once per version (a grid's dry run asks for every trial)."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise StepTimesError(f"compile verdicts {path!r} are not readable JSON: {e}") from None
    conds = doc.get("conditions") if isinstance(doc, dict) else None
    if not isinstance(doc, dict) or doc.get("format") != VERDICTS_FORMAT or not isinstance(conds, dict):
        raise StepTimesError(f"{path}: format must be {VERDICTS_FORMAT!r} with a 'conditions' mapping")
    if doc.get("smoke"):
        return None
    holds, seconds = {}, {}
    for name, v in conds.items():
        if not isinstance(v, dict) or not isinstance(v.get("holds"), bool):
            raise StepTimesError(f"{path}: conditions.{name}.holds must be true or false")
        cond = _condition(str(name))
        holds[cond] = v["holds"]
        s = v.get("compile_s_warm", v.get("compile_s_cold"))
        if isinstance(s, (int, float)) and math.isfinite(s) and s >= 0:
            seconds[cond] = float(s)
    return CompileVerdicts(
        holds, seconds, str(doc.get("gpu", "unknown GPU")), str(doc.get("date", "unknown date")), path
    )


def compile_on(
    setting: bool | str, condition: str, device_type: str, verdicts: CompileVerdicts | None, workers: int = 1
) -> bool:
    """Whether a trial compiles: ``true`` and ``false`` as they say; ``auto`` on a GPU (``cuda``),
    in one process (DDP under compile is untested), for a condition whose measured verdict holds;
    off on a CPU and wherever no verdict is recorded."""
    if setting != "auto":
        return bool(setting)
    if device_type != "cuda" or workers > 1 or verdicts is None:
        return False
    return verdicts.holds.get(_condition(condition), False)


def compile_seconds(condition: str, verdicts: CompileVerdicts | None) -> float:
    """The measured seconds a compiled trial of ``condition`` spends compiling (0 if not measured)."""
    return verdicts.seconds.get(_condition(condition), 0.0) if verdicts is not None else 0.0
