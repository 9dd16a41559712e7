"""tokens_rule and tokens_random: token-id datasets for GPT-2, no files to fetch."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from raystudy.data.source import DatasetInfo, Pool, Source, pool_test

if TYPE_CHECKING:
    import torch

# Token data for GPT-2, generated offline from a fixed seed: sequences of TOKEN_LEN ids below
# TOKEN_VOCAB (so they fit every GPT-2 size). tokens_rule: 4 classes; class c has TOKEN_PLANTED
# of its positions replaced by ids = c (mod 4), so its residue class is the most frequent one,
# a rule a mean-pooled model can learn. tokens_random: uniform ids, the probes' stand-in for
# pretraining text (test split only).
TOKEN_VOCAB, TOKEN_LEN, TOKEN_PLANTED, TOKEN_CLASSES = 256, 32, 12, 4


def rule_tokens(n: int = 2000, seed: int = 4321) -> tuple[torch.Tensor, np.ndarray]:
    """(ids (n, TOKEN_LEN) int64, labels (n,)) of tokens_rule."""
    import torch

    rng = np.random.default_rng(seed)
    labels = rng.integers(0, TOKEN_CLASSES, n)
    ids = rng.integers(0, TOKEN_VOCAB, (n, TOKEN_LEN))
    for i, c in enumerate(labels):
        pos = rng.choice(TOKEN_LEN, TOKEN_PLANTED, replace=False)
        ids[i, pos] = TOKEN_CLASSES * rng.integers(0, TOKEN_VOCAB // TOKEN_CLASSES, TOKEN_PLANTED) + c
    return torch.from_numpy(ids), labels.astype(np.int64)


def tokens_rule(root: Path, download: bool) -> Source:
    """The loader of tokens_rule: 2,000 sequences, split 80/20 once."""
    from raystudy.models.gpt2 import TokenRows

    ids, labels = rule_tokens()
    return pool_test(TokenRows(ids, labels), labels)


def tokens_random(root: Path, download: bool) -> Source:
    """The loader of tokens_random: 1,024 uniform sequences, a test split only."""
    import torch

    from raystudy.models.gpt2 import TokenRows

    ids = torch.from_numpy(np.random.default_rng(8765).integers(0, TOKEN_VOCAB, (1024, TOKEN_LEN)))
    labels = np.zeros(len(ids), dtype=np.int64)
    return Source(Pool([], np.zeros(0, dtype=np.int64)), Pool(TokenRows(ids, labels), labels))


DATASETS = (
    DatasetInfo(
        "tokens_rule", TOKEN_CLASSES, tokens_rule, "generated (seeded)", image=False, tokens=True, val_fraction=0.25
    ),
    DatasetInfo("tokens_random", 1, tokens_random, "generated (seeded)", image=False, tokens=True),
)
