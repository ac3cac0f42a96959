# Copyright (c) mmcalidet contributors. All rights reserved.
"""A seeded tiny CaliDINO saved as a config and a checkpoint, for the prior
page's tests (no training, no `make demo`): its known scores make every
image predict classes 1 and 2 on every query (``set_known_scores``), so
both panels always show detections while the scores still move with the
prior."""
import os.path as osp
from typing import Sequence, Tuple

import torch

from ._utils import data_root, get_config, set_known_scores

#: the classes every query scores high
PREDICTED = (1, 2)
#: the test images' scale (small: the page's tests run in seconds)
SCALE = (128, 128)


def seeded_app_model(folder: str,
                     predicted: Sequence[int] = PREDICTED,
                     seed: int = 0) -> Tuple[str, str]:
    """Write the tiny CaliDINO's config and a seeded checkpoint.

    Args:
        folder (str): where to write ``calidino_tiny.py`` and
            ``calidino_tiny.pth``.
        predicted (Sequence[int]): the classes that score high.
        seed (int): the torch seed of the weights.

    Returns:
        tuple[str, str]: the config and the checkpoint.
    """
    from mmengine.runner import save_checkpoint

    from mmcalidet.apis import init_detector
    cfg = get_config('calidet/calidet_dino_tiny_coco-mini.py')
    cfg.test_dataloader.dataset.pipeline[1].scale = SCALE
    # every high-scoring (query, class) pair kept: the same boxes under
    # every prior
    cfg.model.test_cfg.max_per_img = 30 * len(predicted)
    config = osp.join(folder, 'calidino_tiny.py')
    cfg.dump(config)
    torch.manual_seed(seed)
    model = init_detector(cfg, None, device='cpu')
    set_known_scores(model, predicted)
    ckpt = osp.join(folder, 'calidino_tiny.pth')
    save_checkpoint(
        dict(
            state_dict=model.state_dict(),
            meta=dict(dataset_meta=dict(model.dataset_meta))), ckpt)
    return config, ckpt


def coco_mini_val_image(name: str = '000000000139.jpg') -> str:
    """A coco-mini val image."""
    return osp.join(data_root(), 'coco-mini', 'images', 'val2017', name)
