"""``raystudy COMMAND ...``: one entry point for every command line of the study.

    raystudy grid --model vit_base --dry-run        # = python -m raystudy.grid --model vit_base --dry-run
    raystudy finetune --condition FC1 --lr 0.3
    raystudy report --experiment raystudy-demo-vit_demo
    python -m raystudy grid --help                  # the same without the console script

Each command is its module's ``main``; the module is imported only once its name is known, so
``raystudy --help`` and ``raystudy grid --help`` never import torch, Ray or MLflow.
"""

from __future__ import annotations

import importlib
import sys

import raystudy

# name -> (module whose main() runs it, one line for the overview)
COMMANDS = {
    "grid": ("raystudy.commands.grid", "the study grid on Ray, every trial recorded once in MLflow"),
    "finetune": ("raystudy.commands.finetune", "one finetuning run of one condition, recorded in MLflow"),
    "probe": ("raystudy.commands.probe", "plasticity of every component of every block, with its bound"),
    "search": ("raystudy.commands.search", "Optuna searches per condition with ASHA early stopping"),
    "init": ("raystudy.commands.init", "a starter grid space for your model and your own images, and its dry run"),
    "report": ("analysis.commands.report", "the paper's tables, tests and figures from MLflow or a CSV"),
    "export": ("analysis.commands.export", "the best config per condition as finetune YAML files"),
    "replay": (
        "analysis.commands.replay",
        "what an adaptive policy would have spent on a finished grid, and concluded",
    ),
    "slurm": ("raystudy.commands.slurm", "the study as SLURM jobs that requeue themselves until it is done"),
    "prefetch": ("raystudy.commands.prefetch", "weights and datasets into the caches before a cluster run"),
    "components": ("raystudy.commands.components", "parameter counts per component and condition"),
    "data": ("raystudy.commands.data", "the dataset registry and where its files live"),
}


def usage() -> str:
    """The top-level help: the usage line and one line per command."""
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {text}" for name, (_, text) in COMMANDS.items()]
    return (
        "usage: raystudy [--version] [--help] COMMAND [ARGS...]\n\n"
        "Which components of a pretrained Vision Transformer to finetune, and why.\n\ncommands:\n"
        + "\n".join(lines)
        + "\n\n`raystudy COMMAND --help` describes a command; `python -m raystudy COMMAND` is the same.\n"
    )


def main(argv: list[str] | None = None) -> int:
    """Dispatch ``argv`` (default: the command line) to its command's ``main``; its exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage(), end="")
        return 0 if argv else 2
    if argv[0] in ("-V", "--version"):
        print(f"raystudy {raystudy.__version__}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"error: unknown command {name!r}; valid: {', '.join(COMMANDS)} (see raystudy --help)", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name][0])  # only now: its imports are its own
    return module.main(rest)


if __name__ == "__main__":
    sys.exit(main())
