# Copyright (c) mmcalidet contributors. All rights reserved.
"""The coco-mini path of docs/user_guides/calibrate.md, run with the
commands as the guide writes them (tiny DINO, cache, calibrator, demo), at
2 training iterations and 4 cached images: a command the guide breaks
(a flag that is gone, a cache the calibrator would make again, a
checkpoint that is not where the next step looks) fails here."""
import os
import os.path as osp
import re
import shlex
from typing import List

import pytest

from testing import PROJECT_ROOT, data_root, run_tool

GUIDE = osp.join(PROJECT_ROOT, 'docs', 'user_guides', 'calibrate.md')
MARK = '<!-- coco-mini-from-scratch -->'
PYTHON = '.venv/bin/python'
SCRIPTS = [
    'tools/train.py', 'tools/analysis_tools/cache_decoder_outputs.py',
    'tools/train.py', 'tools/demo/image_demo.py'
]
FEW_ITERS = [
    '--cfg-options', 'train_cfg.max_iters=2', 'train_cfg.val_begin=1000',
    'default_hooks.checkpoint.interval=2', 'default_hooks.logger.interval=1',
    'randomness.seed=0'
]
NUM_IMAGES = 4


def guide_commands() -> List[List[str]]:
    """The commands of the guide's coco-mini block, split as a shell
    does (comments dropped, continuation lines joined)."""
    with open(GUIDE) as f:
        text = f.read()
    assert MARK in text, f'{GUIDE} lost its {MARK} block'
    block = re.match(r'\s*```bash\n(.*?)```', text.split(MARK, 1)[1], re.S)
    assert block, f'no bash block after {MARK}'
    lines = [
        line for line in block.group(1).replace('\\\n', ' ').splitlines()
        if line.strip() and not line.lstrip().startswith('#')
    ]
    return [shlex.split(line) for line in lines]


def test_guide_commands_are_the_path():
    commands = guide_commands()
    assert [c[:2] for c in commands] == [[PYTHON, s] for s in SCRIPTS]


@pytest.mark.slow
def test_coco_mini_from_scratch_as_the_guide_writes_it(tmp_path):
    work = str(tmp_path / 'work_dirs') + '/'

    def local(arg: str) -> str:
        """The guide's paths, moved to the test's folders; the schedule's
        last checkpoint is the 2nd iteration's here."""
        return arg.replace('work_dirs/', work).replace(
            'iter_400.pth', 'iter_2.pth').replace('../shared/datasets',
                                                  data_root())

    commands = guide_commands()
    assert [c[1] for c in commands] == SCRIPTS
    outputs, meta = [], None
    for step, command in enumerate(commands):
        args = [local(arg) for arg in command[2:]]
        if step == 0:
            args += FEW_ITERS
        elif step == 1:
            args += ['--num-images', str(NUM_IMAGES), '--no-progress']
        elif step == 2:
            args += FEW_ITERS + [
                'train_dataloader.dataset.source.indices='
                f'{list(range(NUM_IMAGES))}'.replace(' ', ''),
                'train_dataloader.dataset.source.progress=False'
            ]
        res = run_tool(command[1], *args, timeout=300)
        output = res.stdout + res.stderr
        assert res.returncode == 0, f'step {step + 1}: ' + \
            shlex.join(command) + '\n' + output[-3000:]
        outputs.append(output)
        if step == 1:
            meta = os.stat(
                osp.join(work, 'dino_tiny_coco-mini', 'decoder_cache_train',
                         'meta.json'))
    # the cache made ahead is the one the calibrator trains on
    assert 'making it again' not in outputs[2]
    after = os.stat(
        osp.join(work, 'dino_tiny_coco-mini', 'decoder_cache_train',
                 'meta.json'))
    assert (after.st_ino, after.st_mtime_ns) == (meta.st_ino,
                                                 meta.st_mtime_ns)
    assert osp.isfile(
        osp.join(work, 'calidet_dino_tiny_coco-mini_cached', 'iter_2.pth'))
    # the demo drew and wrote the detections of its image
    assert re.search(r'000000000139\.jpg: \d+ detections >= ', outputs[3])
    demo = osp.join(work, 'calidet_dino_tiny_coco-mini_cached', 'demo')
    assert osp.isfile(osp.join(demo, 'vis', '000000000139.jpg'))
    assert osp.isfile(osp.join(demo, 'preds', '000000000139.json'))
