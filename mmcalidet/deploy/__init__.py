# Copyright (c) mmcalidet contributors. All rights reserved.
"""Deployment with the prior as an input: ONNX export of a calibratable
detector (``export``: the prior folded, the file written; the modules it
traces in ``export_wrappers`` and ``two_stage_export``, what it stores for
the runtime in ``export_meta``), ONNX Runtime inference with run-time
priors (``runtime``) and the export's check against PyTorch (``verify``).

onnx and onnxruntime are the optional ``deploy`` extra
(``pip install -e .[deploy]``); they are imported when used."""
from .export import export_onnx, fold_prior
from .export_meta import read_export_meta
from .export_wrappers import ExportWrapper
from .runtime import OnnxDetector
from .verify import verify_onnx

__all__ = [
    'ExportWrapper', 'export_onnx', 'fold_prior', 'read_export_meta',
    'OnnxDetector', 'verify_onnx'
]
