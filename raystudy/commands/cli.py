"""The argument toolkit every raystudy CLI shares: one-line errors, ``--set``, list flags.

Bad input is a ``ConfigError``; each CLI prints it as ``error: <message>`` and exits 2, before
Ray, MLflow, weights or data are touched. argparse's own errors take the same one-line form.
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from raystudy.bounds import BOUNDS, Bound, is_seed, seed_error
from raystudy.errors import ConfigError, OneLineParser, fail  # noqa: F401 - the commands call cli.fail
from raystudy.train.config import parse_value


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
    (``check_vtab1k_pool``), refused here rather than when a trial builds its splits.
    Raises ConfigError (``userdata.DataError``) in one line on bad data."""
    from raystudy.data import userdata
    from raystudy.data.splits import check_vtab1k_pool

    notes: list[str] = []
    for data in dict.fromkeys(d for d in locations if d):
        notes += userdata.verify(data, cache)
    for data in dict.fromkeys(d for d in vtab1k if d):
        check_vtab1k_pool(data)
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


# Each count a command line takes, and its row in ``bounds.BOUNDS`` (shared with the config key or
# space file key of the same count): ``check_count`` and ``check_seconds`` apply it, and each
# flag's help states its upper bound (``bound``).
FLAGS: dict[str, Bound] = {
    "--num-cpus": BOUNDS["num_cpus"],
    "--threads": BOUNDS["threads_per_trial"],
    "--num-workers": BOUNDS["num_workers"],
    "--max-concurrent": BOUNDS["max_concurrent"],
    "--max-failures": BOUNDS["max_failures"],
    "--num-samples": BOUNDS["num_samples"],
    "--time-budget": BOUNDS["time_budget_s"],
    "--pairs": BOUNDS["pairs"],
    "--batch-size": BOUNDS["batch_size"],
    "--bootstrap-reps": BOUNDS["bootstrap_reps"],
    "--nodes": BOUNDS["nodes"],
    "--cpus-per-node": BOUNDS["cpus_per_node"],
    "--gpus-per-node": BOUNDS["gpus_per_node"],
    "--stop-before": BOUNDS["stop_before"],
    "--rehearse": BOUNDS["rehearse_s"],
}


def bound(flag: str) -> str:
    """The help text's statement of ``flag``'s upper bound: ``at most N (why)``."""
    b = FLAGS[flag]
    return f"at most {b.high:,} ({b.reason('flag')})"


def _check_bound(flag: str, value: float) -> None:
    b = FLAGS[flag]
    if b.over(value):
        raise ConfigError(f"{flag} must be <= {b.high:,} ({b.reason('flag')}), got {value:,}")


def check_count(flag: str, value: int | None) -> None:
    """An integer flag within its bounds in ``FLAGS`` (unset: its default)."""
    if value is None:
        return
    if FLAGS[flag].below(value):
        raise ConfigError(f"{flag} must be >= {FLAGS[flag].least()}, got {value}")
    _check_bound(flag, value)


def check_seed(flag: str, value: int | None) -> None:
    """A seed flag: ``bounds.is_seed``, the seeds numpy takes (unset: its default)."""
    if value is not None and not is_seed(value):
        raise ConfigError(seed_error(flag, value, "flag"))


def check_seconds(flag: str, value: float | None) -> None:
    """A duration flag: a finite number within its bounds in ``FLAGS`` (unset: its default)."""
    if value is None:
        return
    b = FLAGS[flag]
    if not math.isfinite(value) or b.below(value):
        raise ConfigError(f"{flag} must be a finite number {'>' if b.above else '>='} {b.low:g}, got {value}")
    _check_bound(flag, value)


def parse_seconds(flag: str, text: str | None) -> float | None:
    """A duration flag given as text (one with an optional value, which argparse leaves as it
    is): a number within its bounds in ``FLAGS`` (``check_seconds``); None if unset."""
    if text is None:
        return None
    b = FLAGS[flag]
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(
            f"{flag} takes seconds, a number {'>' if b.above else '>='} {b.low:g} and <= {b.high:,g}, got {text!r}"
        ) from None
    check_seconds(flag, value)
    return value


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


def add_rehearse_arg(ap: argparse.ArgumentParser, what: str) -> None:
    """``--rehearse [SECONDS]``: the command's dress rehearsal, ``what`` it runs as it is."""
    from raystudy.train import rehearsal

    ap.add_argument(
        "--rehearse",
        nargs="?",
        const=str(rehearsal.DEFAULT_S),
        metavar="SECONDS",
        help=f"a dress rehearsal: {what}, each trial reporting synthetic numbers for about SECONDS "
        f"(default {rehearsal.DEFAULT_S:g}; {bound('--rehearse')}) without model or data; "
        f"recorded in the experiment <experiment>{rehearsal.SUFFIX}",
    )


def add_data_change_arg(ap: argparse.ArgumentParser) -> None:
    """``--accept-data-change``: go on where your own data changed under the study's runs."""
    ap.add_argument(
        "--accept-data-change",
        action="store_true",
        help="go on where your own data changed since the study's recorded runs saw it (they stay done)",
    )
