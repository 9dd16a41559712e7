"""The argument toolkit every raystudy CLI shares: one-line errors, ``--set``, list flags.

Bad input is a ``ConfigError``; each CLI prints it as ``error: <message>`` and exits 2, before
Ray, MLflow, weights or data are touched. argparse's own errors take the same one-line form.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable
from typing import Any

from raystudy.config import parse_value
from raystudy.errors import ConfigError


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (exit 2) and the module docstring as its epilog."""

    def __init__(self, prog: str, doc: str | None, **kw: Any):
        doc = doc or ""
        super().__init__(prog=prog, description=doc.split("\n")[0], epilog=doc,
                         formatter_class=argparse.RawDescriptionHelpFormatter, **kw)

    def error(self, message: str):
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


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
