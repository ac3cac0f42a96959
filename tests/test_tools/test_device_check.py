# Copyright (c) mmcalidet contributors. All rights reserved.
"""benchmarks/device_check.py runs on any machine: without CUDA it says so,
skips the CUDA parts and checks the CPU ones."""
import json

import pytest
import torch

from testing import run_tool

pytestmark = pytest.mark.slow


def test_device_check_runs_small(tmp_path):
    out = tmp_path / 'check.json'
    proc = run_tool('benchmarks/device_check.py', '--size', '64',
                    '--train-steps', '1', '--iters', '2', '--out', str(out),
                    threads=1)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    checks = result['checks']
    device = 'cuda' if torch.cuda.is_available() else 'cpu'
    if device == 'cpu':
        # no CPU-vs-CUDA parity without CUDA, and it says why
        assert set(checks) == {'cpu_forward', 'training_cpu', 'inference_cpu'}
        assert 'CUDA is not available' in proc.stdout
    else:
        assert set(checks) == {'parity', 'training_cuda', 'inference_cuda'}
    assert all(c['ok'] for c in checks.values())
    assert checks[f'inference_{device}']['num_detections'] > 0
    for kind in ('predict', 'train'):
        assert result['throughput'][f'{kind}_{device}_images_per_s'] > 0
    # the printed summary is the file's
    for name in checks:
        assert f'{name}: ok' in proc.stdout
