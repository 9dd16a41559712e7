"""The argument toolkit every raystudy CLI shares: one-line errors, ``--set``, list flags.

Bad input is a ``ConfigError``; each CLI prints it as ``error: <message>`` and exits 2, before
Ray, MLflow, weights or data are touched. argparse's own errors take the same one-line form.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from raystudy.errors import ConfigError, OneLineParser
from raystudy.train.config import (
    MAX_BATCH,
    MAX_CPUS,
    MAX_PAIRS,
    MAX_WORKERS,
    PAIRS_WHY,
    SEED_END,
    SEED_WHY,
    parse_value,
)


class Parser(OneLineParser):
    """argparse with one-line errors (exit 2) and the module docstring as its epilog."""

    def __init__(self, prog: str, doc: str | None, **kw: Any):
        doc = doc or ""
        super().__init__(
            prog=prog,
            description=doc.split("\n")[0],
            epilog=doc,
            formatter_class=argparse.RawDescriptionHelpFormatter,
            **kw,
        )


def fail(e: Exception) -> int:
    """Print a user error as one line; the exit status for bad input."""
    print(f"error: {e}", file=sys.stderr)
    return 2


def parse_set(items: Iterable[str]) -> dict[str, Any]:
    """``key=value`` pairs, each value typed by its config key (``lr=3e-3``, ``download=true``)."""
    out = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"--set expects key=value, got {item!r}")
        k, v = item.split("=", 1)
        out[k.strip()] = parse_value(k.strip(), v.strip())
    return out


def parse_data(values: Iterable[str] | None) -> dict[str, str]:
    """``--data NAME=PATH`` values (the flag repeated for more; a path may hold commas) as
    {name: location}; each name a plain name, each location one that exists (``userdata.check_location``)."""
    from raystudy.data import userdata

    out: dict[str, str] = {}
    for item in values or []:
        name, eq, data = (x.strip() for x in item.partition("="))
        if not eq or not name or not data:
            raise ConfigError(f"--data expects NAME=PATH (your name for the data, then where it is), got {item!r}")
        userdata.check_name(name)
        if name in out:
            raise ConfigError(f"--data names {name!r} twice")
        out[name] = userdata.resolve(data)
        userdata.check_location(out[name])
    return out


def check_data(
    locations: Iterable[str], cache: str | os.PathLike | None = None, vtab1k: Iterable[str] = ()
) -> list[str]:
    """The full check of each of your own data ``locations`` (every image decoded once, the verdict
    cached: ``userdata.verify``), before Ray or MLflow start; the note lines to print. Those of
    ``vtab1k`` (drawn with ``low_data_split: vtab1k``) must hold the images that draw needs
    (``datasets.check_vtab1k_pool``), refused here rather than when a trial builds its splits.
    Raises ConfigError (``userdata.DataError``) in one line on bad data."""
    from raystudy.data import datasets, userdata

    notes: list[str] = []
    for data in dict.fromkeys(d for d in locations if d):
        notes += userdata.verify(data, cache)
    for data in dict.fromkeys(d for d in vtab1k if d):
        datasets.check_vtab1k_pool(data)
    return notes


def parse_list(
    flag: str, value: str | None, allowed: list[str], canon: Callable[[str], str] = lambda s: s
) -> list[str] | None:
    """A comma-separated flag value, each item (after ``canon``) one of ``allowed`` (``all``: every
    one of them); None if unset."""
    if value is None:
        return None
    if value.strip() == "all":
        return list(allowed)
    items = [canon(v.strip()) for v in value.split(",") if v.strip()]
    bad = [v for v in items if v not in allowed]
    if bad or not items:
        raise ConfigError(f"{flag}: {', '.join(bad) or 'empty list'} not in this space; valid: {', '.join(allowed)}")
    return items


# The upper bound of each count a command line takes, from what the count sizes: a count past
# it is a typo or a unit mistake that would exhaust memory or never end. ``check_count`` and
# ``check_seconds`` apply them; each flag's help states its bound (``bound``).
BOUNDS: dict[str, tuple[float, str]] = {
    "--num-cpus": (MAX_CPUS, "a local Ray's CPUs are one machine's"),
    "--threads": (MAX_CPUS, "threads of one process"),
    "--num-workers": (MAX_WORKERS, "data loading processes"),
    "--max-concurrent": (100_000, "trials at once, a process each"),
    "--max-failures": (100, "retries of one trial, each a rerun from its checkpoint"),
    "--num-samples": (100_000, "trials per study, each a finetuning run"),
    "--time-budget": (366 * 86_400, "seconds: a year"),
    "--pairs": (MAX_PAIRS, PAIRS_WHY),
    "--batch-size": (MAX_BATCH, "memory: a batch is held at once"),
    "--bootstrap-reps": (100_000, "memory: each replicate holds a score per condition, dataset and seed"),
}


def bound(flag: str) -> str:
    """The help text's statement of ``flag``'s upper bound: ``at most N (why)``."""
    high, why = BOUNDS[flag]
    return f"at most {high:,} ({why})"


def _check_bound(flag: str, value: float) -> None:
    if flag in BOUNDS and value > BOUNDS[flag][0]:
        high, why = BOUNDS[flag]
        raise ConfigError(f"{flag} must be <= {high:,} ({why}), got {value:,}")


def check_count(flag: str, value: int | None, low: int = 1) -> None:
    """An integer flag that must be at least ``low`` and at most its bound in ``BOUNDS`` (unset:
    its default)."""
    if value is None:
        return
    if value < low:
        raise ConfigError(f"{flag} must be >= {low}, got {value}")
    _check_bound(flag, value)


def check_seed(flag: str, value: int | None) -> None:
    """A seed flag: ``0 <= seed < 2**32``, the seeds numpy takes (unset: its default)."""
    if value is not None and not 0 <= value < SEED_END:
        raise ConfigError(f"{flag} must be >= 0 and < 2**32 ({SEED_END:,}: {SEED_WHY}), got {value}")


def check_seconds(flag: str, value: float | None) -> None:
    """A duration flag: a finite number > 0, at most its bound in ``BOUNDS`` (unset: its default)."""
    if value is not None and not (math.isfinite(value) and value > 0):
        raise ConfigError(f"{flag} must be a finite number > 0, got {value}")
    if value is not None:
        _check_bound(flag, value)


def check_unused(switch: str, on: bool, given: dict[str, Any]) -> None:
    """Refuse flags that ``switch`` (when ``on``) leaves unused, such as ``--out`` with
    ``--no-save``: ``given`` maps each such flag to its value (None or False: not given). A flag
    dropped without a word would surprise later."""
    named = [flag for flag, value in given.items() if value not in (None, False)]
    if on and named:
        it = "them" if len(named) > 1 else "it"
        raise ConfigError(f"{' and '.join(named)} with {switch}: {switch} leaves {it} unused; drop one or the other")


def check_folder(flag: str, path: str | os.PathLike | None) -> None:
    """A folder the command will write to: not a file, and writable, checked without writing
    anything (an anonymous temporary file in the nearest existing folder)."""
    if path is None or "://" in str(path):
        return  # an object store: its own client says what is wrong
    p = Path(path).expanduser().absolute()
    if p.exists() and not p.is_dir():
        raise ConfigError(f"{flag} {str(path)!r} is a file, not a folder")
    q = p
    while not q.exists():
        q = q.parent
    if not q.is_dir():
        raise ConfigError(f"{flag} {str(path)!r}: {str(q)!r} is a file, not a folder")
    try:
        with tempfile.TemporaryFile(dir=q):
            pass
    except OSError as e:
        raise ConfigError(f"{flag} {str(path)!r}: cannot write in {str(q)!r} ({e.strerror or e})") from None


def check_device(flag: str, name: str) -> None:
    """A device the command itself will run on: CUDA only where CUDA is."""
    if name == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ConfigError(f"{flag} cuda: CUDA is not available on this machine; use auto or cpu")


def add_tracking_args(ap: argparse.ArgumentParser) -> None:
    """Where runs are recorded."""
    ap.add_argument(
        "--tracking-uri", help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else sqlite:///./mlflow.db)"
    )
    ap.add_argument("--experiment", help="MLflow experiment (default: raystudy-<study>-<model>)")


def add_ray_args(ap: argparse.ArgumentParser, storage_default: str) -> None:
    """Which Ray runs the trials and where their checkpoints go."""
    import os

    ap.add_argument(
        "--address",
        default=os.environ.get("RAY_ADDRESS"),
        help="Ray cluster: auto, HOST:PORT (default: $RAY_ADDRESS, else a local Ray)",
    )
    ap.add_argument("--storage", help=f"Ray storage path for checkpoints (default: {storage_default})")
    ap.add_argument("--num-cpus", type=int, help=f"CPUs of a local Ray (default: all; {bound('--num-cpus')})")
    ap.add_argument("--ray-temp-dir", help="temp dir of a local Ray (default: Ray's)")
