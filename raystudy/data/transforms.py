"""The paper's image transforms: RandomResizedCrop + horizontal flip for training, Resize +
CenterCrop for evaluation, then the model's normalisation (the torchvision data path's)."""

from __future__ import annotations

from collections.abc import Sequence


def transforms(img_size: int, mean: Sequence[float], std: Sequence[float], image: bool = True):
    """The paper's (train, eval) transforms; for ready tensors (the demo) only normalisation."""
    from torchvision import transforms as T

    norm = T.Normalize(mean, std)
    if not image:
        return norm, norm
    train = T.Compose([T.RandomResizedCrop(img_size), T.RandomHorizontalFlip(), T.ToTensor(), norm])
    evaluate = T.Compose([T.Resize(img_size), T.CenterCrop(img_size), T.ToTensor(), norm])
    return train, evaluate
