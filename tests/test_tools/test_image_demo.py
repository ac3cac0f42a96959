# Copyright (c) mmcalidet contributors. All rights reserved.
"""tools/demo/image_demo.py: detections under a prior, and a comparison."""
import copy
import importlib.util
import json
import os.path as osp
import re
import shutil
import struct
import sys
import zlib

import mmcv
import pytest
import torch
from mmdet.datasets import CocoDataset
from mmdet.registry import MODELS
from mmdet.utils import register_all_modules
from mmengine.runner import save_checkpoint
from PIL import Image

from mmcalidet.priors import default_prior_path, load_prior, save_prior
from mmcalidet.priors.edit import apply_edits
from testing import PROJECT_ROOT, data_root, get_config, run_tool_in_process

TOOL = 'tools/demo/image_demo.py'
CONFIG = 'calidet/calidet_dino_tiny_coco-mini.py'
CLASSES = list(CocoDataset.METAINFO['classes'])
IMAGE = '000000000139.jpg'


@pytest.fixture(scope='module')
def checkpoint(tmp_path_factory):
    """A random-weight tiny CaliDINO with COCO's class names."""
    register_all_modules()
    torch.manual_seed(0)
    model = MODELS.build(copy.deepcopy(get_config(CONFIG).model))
    model.init_weights()
    path = str(tmp_path_factory.mktemp('demo') / 'tiny_calidino.pth')
    save_checkpoint(
        dict(
            state_dict=model.state_dict(),
            meta=dict(dataset_meta=dict(classes=CLASSES))), path)
    return path


def demo_args(checkpoint, *args):
    image = osp.join(data_root(), 'coco-mini', 'images', 'val2017', IMAGE)
    return (image, osp.join(PROJECT_ROOT, 'configs',
                            CONFIG), checkpoint, *args)


@pytest.mark.slow
def test_demo_draws_detections_and_a_comparison(checkpoint, tmp_path,
                                                run_tool):
    base = load_prior(default_prior_path('coco2017_train'))
    site = save_prior(
        tmp_path / 'site.json',
        apply_edits(base, CLASSES, ['person|*=0.0', 'chair|*=1.0']), CLASSES)
    out = tmp_path / 'out'
    res = run_tool(
        TOOL,
        *demo_args(checkpoint, '--prior',
                   site, '--compare-prior', 'coco2017_train', '--out-dir',
                   str(out), '--score-thr', '0.4'))
    assert res.returncode == 0, res.stderr
    assert f'{IMAGE}: ' in res.stdout and 'detections >= 0.4;' in \
        res.stdout and 'under --compare-prior' in res.stdout
    image = mmcv.imread(demo_args(checkpoint)[0])
    vis = mmcv.imread(str(out / 'vis' / IMAGE))
    assert vis.shape == image.shape and (vis != image).any()
    with open(out / 'preds' / (IMAGE[:-4] + '.json')) as f:
        preds = json.load(f)
    assert len(preds['scores']) == len(preds['labels']) == len(
        preds['bboxes']) > 0
    compare = mmcv.imread(str(out / 'compare' / (IMAGE[:-4] + '.png')))
    height, width = image.shape[:2]
    assert compare.shape[0] > height and compare.shape[1] > 2 * width
    # the left panel is the --prior one: the same drawing as vis/
    strip = (compare.shape[0] - height) // 2
    left = compare[strip:strip + height, :width]
    assert (left.astype(int) - vis).__abs__().mean() < 3  # JPEG vs PNG


def load_tool():
    spec = importlib.util.spec_from_file_location('image_demo',
                                                  osp.join(PROJECT_ROOT, TOOL))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_demo_rejects_an_unknown_class_before_running(checkpoint, tmp_path):
    bad = save_prior(tmp_path / 'bad.json',
                     load_prior(default_prior_path('coco2017_train')),
                     ['persn'] + CLASSES[1:])
    out = tmp_path / 'out'
    tool = load_tool()
    # run_tool prints a ValueError as one line and exits with 1
    with pytest.raises(
            ValueError,
            match="class 'person' is not in the prior file \\(did you "
            "mean 'persn'"):
        tool.main(
            demo_args(checkpoint, '--compare-prior', bad, '--out-dir',
                      str(out)))
    assert not out.exists()
    with pytest.raises(SystemExit) as exc:
        tool.main(demo_args(checkpoint, '--score-thr', '30'))
    assert exc.value.code == 2


@pytest.mark.slow
def test_demo_refuses_a_checkpoint_of_other_classes(checkpoint, tmp_path):
    """mmdet would load it with random classification layers (only logging
    the size mismatches), and the demo would then fail on a class index."""
    state = torch.load(checkpoint)['state_dict']
    state = {
        k: v[:20] if 'cls_branches' in k else v
        for k, v in state.items()
    }
    state['prior'] = torch.eye(20)
    path = str(tmp_path / 'classes20.pth')
    save_checkpoint(
        dict(state_dict=state, meta=dict(dataset_meta=dict(
            classes=CLASSES[:20]))), path)
    res = run_tool_in_process(TOOL,
                              *demo_args(path, '--out-dir',
                                         str(tmp_path / 'o')))
    assert res.returncode == 1
    assert 'Traceback' not in res.stderr
    # one line naming the checkpoint and both class counts
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith(f'image_demo.py: error: checkpoint {path} '), last
    assert re.search(r'\b20 classes\b.*\b80\b', last), last
    assert not (tmp_path / 'o').exists()


@pytest.fixture
def as_tool(monkeypatch):
    """``sys.argv[0]`` as when the tool runs, for its error lines."""
    monkeypatch.setattr(sys, 'argv', [TOOL])


def png_claiming(path, width: int, height: int) -> str:
    """A tiny PNG (2 x 2 pixels of data) whose header says ``width`` x
    ``height``: what a reader sees before decoding, without making a huge
    image here."""
    Image.new('RGB', (2, 2)).save(path)
    with open(path, 'rb') as f:
        data = bytearray(f.read())
    assert data[12:16] == b'IHDR'
    data[16:24] = struct.pack('>II', width, height)
    data[29:33] = struct.pack('>I', zlib.crc32(bytes(data[12:29])))
    with open(path, 'wb') as f:
        f.write(data)
    return str(path)


def test_demo_refuses_huge_images_before_decoding(checkpoint, tmp_path,
                                                  capsys, monkeypatch,
                                                  as_tool):
    """A 20000 x 20000 image (a 1 MB PNG) would be decoded whole and get
    the process killed for memory: refused from its header, before the
    model is built."""
    huge = png_claiming(tmp_path / 'huge.png', 20000, 20000)
    with monkeypatch.context() as patch:  # the header is as claimed
        patch.setattr(Image, 'MAX_IMAGE_PIXELS', None)
        with Image.open(huge) as image:
            assert image.size == (20000, 20000)
    tool = load_tool()
    out = tmp_path / 'out'
    with pytest.raises(ValueError, match='nothing written'):
        tool.main((huge, *demo_args(checkpoint, '--out-dir', str(out))[1:]))
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f'image_demo.py: error: skipped {huge}: 20000 x 20000 = '
        f'{20000 * 20000} pixels, over --max-pixels {tool.MAX_PIXELS}'
    ], err
    assert not out.exists()
    # the limit is an option: a real 640 x 426 image over 100 pixels
    with pytest.raises(ValueError, match='nothing written'):
        tool.main(demo_args(checkpoint, '--max-pixels', '100', '--out-dir',
                            str(out)))
    assert 'over --max-pixels 100' in capsys.readouterr().err
    assert not out.exists()
    with pytest.raises(SystemExit):
        tool.main(demo_args(checkpoint, '--max-pixels', '0'))


def test_demo_skips_bad_files_and_runs_the_others(checkpoint, tmp_path,
                                                  capsys, as_tool):
    """A file that is not an image, a broken one and a huge one are each
    named and skipped; the good image is still run, then the tool exits
    with 1."""
    folder = tmp_path / 'images'
    folder.mkdir()
    shutil.copy(demo_args(checkpoint)[0], folder / IMAGE)
    (folder / 'notes.jpg').write_text('not an image')
    (folder / 'broken.png').write_bytes(b'\x89PNG\r\n\x1a\n' + b'x' * 40)
    png_claiming(folder / 'huge.png', 20000, 20000)
    (folder / 'README.txt').write_text('not an image file name: ignored')
    out = tmp_path / 'out'
    tool = load_tool()
    assert tool.main((str(folder), *demo_args(
        checkpoint, '--out-dir', str(out), '--cfg-options',
        'test_dataloader.dataset.pipeline.1.scale=(96,96)')[1:])) == 1
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    skipped = [line for line in err if 'error: skipped' in line]
    assert sorted(line.split()[3].rstrip(':') for line in skipped) == [
        str(folder / name) for name in ('broken.png', 'huge.png', 'notes.jpg')
    ], err
    assert err[-1] == 'image_demo.py: error: 3 of 4 image(s) skipped ' \
        '(named above)', err
    assert f'{IMAGE}: ' in captured.out
    assert (out / 'vis' / IMAGE).is_file()
    assert (out / 'preds' / (IMAGE[:-4] + '.json')).is_file()
    assert not (out / 'vis' / 'notes.jpg').exists()


def test_demo_empty_folder_is_an_error(checkpoint, tmp_path, capsys):
    """A folder without images wrote nothing, said "wrote ..." and exited
    with 0."""
    folder = tmp_path / 'empty'
    folder.mkdir()
    (folder / 'notes.txt').write_text('no images here')
    out = tmp_path / 'out'
    with pytest.raises(ValueError, match=r'no images .* found in .*empty: '
                       'nothing written'):
        load_tool().main((str(folder), *demo_args(
            checkpoint, '--out-dir', str(out))[1:]))
    assert 'wrote' not in capsys.readouterr().out
    assert not out.exists()
