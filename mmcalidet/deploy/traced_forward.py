# Copyright (c) mmcalidet contributors. All rights reserved.
"""What every traced forward of the ONNX export holds: the detector, the
graph's input size and whether the prior (and its support) are graph
inputs."""
from typing import Optional, Tuple

from torch import Tensor, nn


class TracedForward(nn.Module):
    """The base of the export's wrappers (a DETR's, a one-stage and a
    two-stage detector's).

    Args:
        model (nn.Module): the detector (eval mode).
        input_shape (tuple[int, int]): ``(H, W)`` of the graph's input.
        prior_input (bool): the prior is the graph's second input; else
            the model's own (deployment or folded) prior applies.
        support_input (bool): the prior's support and class shares are
            the third and fourth inputs (a support-aware CaliFormer; a row
            of zeros: no support).
    """

    def __init__(self,
                 model: nn.Module,
                 input_shape: Tuple[int, int],
                 prior_input: bool,
                 support_input: bool = False) -> None:
        super().__init__()
        self.model = model
        self.input_shape = tuple(int(v) for v in input_shape)
        self.prior_input = prior_input
        self.support_input = support_input
        # the model's mode: torch.onnx.export restores the wrapper's mode
        # afterwards, recursively (a new module's would be training)
        self.training = model.training

    def cali_vectors(self,
                     head: nn.Module,
                     prior: Optional[Tensor],
                     support: Optional[Tensor] = None,
                     marginals: Optional[Tensor] = None) -> Optional[Tensor]:
        """V' for a head that takes it per call: the prior input's (with
        its support inputs), else the model's deployment prior's (a
        constant of the graph), else ``None`` (a plain detector)."""
        if self.prior_input and self.support_input:
            return head.get_cali_vectors(prior, support, marginals)
        if self.prior_input:
            return head.get_cali_vectors(prior)
        if hasattr(self.model, 'deployment_cali_vectors'):
            return self.model.deployment_cali_vectors()
        return None
