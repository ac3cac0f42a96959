# Copyright (c) mmcalidet contributors. All rights reserved.
"""A toy model for the tests of training loops and hooks: what it was fed
and what it drew, recorded."""
import torch
from mmengine.model import BaseModel
from torch import nn


class NoisyModel(BaseModel):
    """Records every batch and a draw of its own (like DINO's denoising
    queries), and learns from both.

    Args:
        width (int): the length of each sample's input vector.
    """

    def __init__(self, width: int = 4) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(width))
        self.records = []

    def forward(self, inputs, data_samples=None, mode='loss'):
        noise = torch.rand(len(self.weight))
        self.records.append((inputs.clone(), noise))
        return dict(loss=((self.weight - inputs.mean(0) - noise)**2).sum())
