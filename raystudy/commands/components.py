"""``raystudy components``: parameter counts per component and per condition of a model.

python -m raystudy components --model vit_base --conditions MHA,FC1,full
"""

from __future__ import annotations

import sys

from raystudy.models.components import (
    PAPER_CONDITIONS,
    ConditionError,
    PartitionError,
    canonical_condition,
    component_counts,
    condition_counts,
)


def build_parser():
    """The components CLI's argument parser (one-line errors, exit status 2)."""
    from raystudy.errors import OneLineParser

    ap = OneLineParser(
        prog="raystudy components",
        description=(
            "Print parameter counts per component and trainable counts per study condition "
            "for a model architecture (random init, no weights needed)."
        ),
    )
    ap.add_argument(
        "--model",
        default="vit_base_patch16_224",
        help="timm ViT name, alias (vit_base, vit_large, vit_huge), vit_demo, gpt2 or gpt2_tiny",
    )
    ap.add_argument(
        "--conditions",
        default=",".join(PAPER_CONDITIONS + ("EMBED", "lora")),
        help="comma-separated conditions (default: the paper's, EMBED and lora)",
    )
    return ap


def main(argv: list[str] | None = None) -> int:
    """Print ``--model``'s parameter counts per component and per condition; returns the exit status."""
    args = build_parser().parse_args(argv)
    from raystudy.errors import ConfigError
    from raystudy.models import registry

    try:
        items = [c.strip() for c in args.conditions.split(",")]
        if not all(items):
            raise ConfigError(f"--conditions {args.conditions!r}: empty item; give conditions such as MHA,FC1")
        conds = [canonical_condition(c) for c in items]
        model = registry.create_model(args.model, num_classes=100, pretrained=False)
        per_comp = component_counts(model)
    except (ConfigError, ConditionError, PartitionError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    total = sum(per_comp.values())
    head_input = registry.architecture(args.model).head_input
    print(f"{args.model}: {total:,} parameters (head for 100 classes" + (f", {head_input})" if head_input else ")"))
    print(f"{'component':<14}{'parameters':>14}")
    for c, n in per_comp.items():
        print(f"{c:<14}{n:>14,}")
    print(f"\n{'condition':<14}{'trainable':>14}{'share':>9}")
    for c, n in condition_counts(model, conds).items():
        print(f"{c:<14}{n:>14,}{n / total:>9.2%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
