# Copyright (c) mmcalidet contributors. All rights reserved.
"""Inference with a deployment prior (mirrors ``mmdet.apis``).

See docs/user_guides/inject_prior.md.
"""
from .inference import (attach_call_prior, call_prior_fields, config_classes,
                        inference_detector, init_detector, is_calibratable,
                        per_image_priors, resolve_call_priors)
from .inferencer import CaliDetInferencer, prior_changes

__all__ = [
    'init_detector', 'inference_detector', 'CaliDetInferencer',
    'resolve_call_priors', 'per_image_priors', 'is_calibratable',
    'prior_changes', 'config_classes', 'call_prior_fields',
    'attach_call_prior'
]
