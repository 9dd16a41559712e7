"""The paper's transforms."""

import numpy as np
import torch

from raystudy.data.transforms import transforms


def test_eval_transform_is_resize_then_center_crop():
    from PIL import Image
    from torchvision.transforms import functional as TF

    _, ev = transforms(224, (0.0,) * 3, (1.0,) * 3)
    img = Image.fromarray(np.random.default_rng(0).integers(0, 255, (32, 48, 3), dtype=np.uint8))
    want = TF.to_tensor(TF.center_crop(TF.resize(img, 224), 224))
    assert torch.allclose(ev(img), want)
