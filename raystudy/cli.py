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

from raystudy.config import parse_value
from raystudy.errors import ConfigError, OneLineParser


class Parser(OneLineParser):
    """argparse with one-line errors (exit 2) and the module docstring as its epilog."""

    def __init__(self, prog: str, doc: str | None, **kw: Any):
        doc = doc or ""
        super().__init__(prog=prog, description=doc.split("\n")[0], epilog=doc,
                         formatter_class=argparse.RawDescriptionHelpFormatter, **kw)


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


def parse_list(flag: str, value: str | None, allowed: list[str],
               canon: Callable[[str], str] = lambda s: s) -> list[str] | None:
    """A comma-separated flag value, each item (after ``canon``) one of ``allowed``; None if unset."""
    if value is None:
        return None
    items = [canon(v.strip()) for v in value.split(",") if v.strip()]
    bad = [v for v in items if v not in allowed]
    if bad or not items:
        raise ConfigError(f"{flag}: {', '.join(bad) or 'empty list'} not in this space; valid: {', '.join(allowed)}")
    return items


def check_count(flag: str, value: int | None, low: int = 1) -> None:
    """An integer flag that must be at least ``low`` (unset: its default)."""
    if value is not None and value < low:
        raise ConfigError(f"{flag} must be >= {low}, got {value}")


def check_seconds(flag: str, value: float | None) -> None:
    """A duration flag: a finite number > 0 (unset: its default)."""
    if value is not None and not (math.isfinite(value) and value > 0):
        raise ConfigError(f"{flag} must be a finite number > 0, got {value}")


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
    ap.add_argument("--tracking-uri", help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else "
                                           "sqlite:///./mlflow.db)")
    ap.add_argument("--experiment", help="MLflow experiment (default: raystudy-<study>-<model>)")


def add_ray_args(ap: argparse.ArgumentParser, storage_default: str) -> None:
    """Which Ray runs the trials and where their checkpoints go."""
    import os

    ap.add_argument("--address", default=os.environ.get("RAY_ADDRESS"),
                    help="Ray cluster: auto, HOST:PORT (default: $RAY_ADDRESS, else a local Ray)")
    ap.add_argument("--storage", help=f"Ray storage path for checkpoints (default: {storage_default})")
    ap.add_argument("--num-cpus", type=int, help="CPUs of a local Ray (default: all)")
    ap.add_argument("--ray-temp-dir", help="temp dir of a local Ray (default: Ray's)")
