# Copyright (c) mmcalidet contributors. All rights reserved.
"""The tools refuse bad arguments before a detector pass or a cache build
(prior names and files, output paths, seeds, subset sizes), in one line,
and a refusal leaves no out-dir or log behind; a failed cache build
removes its partial folder; an unwritable output is named by itself, not
by its temporary file."""
import errno
import json
import os
import os.path as osp

import numpy as np
import pytest
import torch
from mmdet.structures import DetDataSample

from mmcalidet.decoder_cache import DecoderCacheWriter
from mmcalidet.decoder_cache import writer as writer_module
from mmcalidet.priors import flat_prior
from mmcalidet.utils.file_io import (atomic_write, check_writable_dir,
                                     check_writable_file)
from testing import PROJECT_ROOT, run_tool_in_process

CONFIG = osp.join(PROJECT_ROOT, 'configs', 'calidet',
                  'calidet_dino_tiny_coco-mini.py')
TOOLS = 'tools/analysis_tools/'
#: a folder no file can be made in, even by root
UNWRITABLE = '/proc/mmcalidet-out'


def refusal(script, *args, cwd, status=1) -> str:
    """Run a tool in-process; return its one-line error."""
    result = run_tool_in_process(script, *args, cwd=str(cwd))
    assert result.returncode == status, result.stderr + result.stdout
    lines = result.stderr.strip().splitlines()
    assert 'Traceback' not in result.stderr, result.stderr
    return lines[-1]


@pytest.fixture
def work(tmp_path):
    """A working folder holding a (fake) checkpoint only."""
    (tmp_path / 'x.pth').write_bytes(b'weights')
    return tmp_path


def left(folder) -> list:
    return sorted(os.listdir(folder))


# --- shared checks --------------------------------------------------------


def test_output_paths_are_checked_without_leaving_anything(tmp_path):
    (tmp_path / 'file').write_text('x')
    assert check_writable_dir(str(tmp_path / 'new' / 'out')) == \
        str(tmp_path / 'new' / 'out')
    check_writable_file(str(tmp_path / 'new' / 'p.json'))
    with pytest.raises(ValueError, match='is a file, not a folder'):
        check_writable_dir(str(tmp_path / 'file'), '--out-dir')
    with pytest.raises(ValueError, match='is a file, not a folder'):
        check_writable_dir(str(tmp_path / 'file' / 'sub'), '--out-dir')
    with pytest.raises(ValueError, match='is a folder, not a file'):
        check_writable_file(str(tmp_path), '--out')
    with pytest.raises(
            ValueError, match=f'--out {UNWRITABLE}/p.json cannot '
            'be written'):
        check_writable_file(f'{UNWRITABLE}/p.json', '--out')
    assert left(tmp_path) == ['file']


def test_an_unwritable_output_is_named_by_itself(tmp_path):
    target = f'{UNWRITABLE}/p.json'
    with pytest.raises(OSError) as exc:
        with atomic_write(target) as f:
            f.write('{}')
    assert f'cannot write {target}' in str(exc.value)
    assert '.incomplete-' not in str(exc.value)
    with pytest.raises(OSError, match='it is a folder'):
        with atomic_write(str(tmp_path)) as f:
            f.write('{}')
    assert left(tmp_path) == []


# --- eval_priors.py -------------------------------------------------------


@pytest.mark.parametrize('args, problem', [
    (['--priors', 'E_t', 'E_zzz'], "unknown prior 'E_zzz'"),
    (['--priors', 'E_t', 'site=/missing.json'], "prior 'site': "),
    (['--priors', 'E_t', 'E_t'], "prior 'E_t' is given twice"),
    (['--out-dir', 'a_file'], '--out-dir a_file is a file, not a folder'),
])
def test_eval_priors_refuses_before_the_detector_pass(work, args, problem):
    (work / 'a_file').write_text('kept')
    before = left(work)
    line = refusal(
        TOOLS + 'eval_priors.py',
        CONFIG,
        'x.pth',
        *(['--out-dir', 'out'] if '--out-dir' not in args else []),
        *args,
        cwd=work)
    assert problem in line
    assert left(work) == before  # no out-dir, no eval.log


@pytest.mark.parametrize('script, extra', [
    ('eval_priors.py', []),
    ('self_calibrate.py', []),
])
def test_a_late_refusal_leaves_no_out_dir_or_log(work, script, extra):
    # the checkpoint is refused once the run has made out/ and eval.log
    line = refusal(
        TOOLS + script,
        CONFIG,
        'missing.pth',
        '--out-dir',
        'work_dirs/out',
        *extra,
        cwd=work)
    assert 'missing.pth' in line
    assert left(work) == ['x.pth']


# --- self_calibrate.py ----------------------------------------------------


def test_self_calibrate_refuses_sizes_seeds_and_outputs_first(work):
    line = refusal(
        TOOLS + 'self_calibrate.py',
        CONFIG,
        'x.pth',
        '--sizes',
        '64',
        '--max-images',
        '2',
        '--out-dir',
        'out',
        cwd=work)
    assert line.endswith('no subset of 64 images among 2 (--max-images 2)')
    line = refusal(
        TOOLS + 'self_calibrate.py',
        CONFIG,
        'x.pth',
        '--sizes',
        '8',
        '--num-images',
        '4',
        '--out-dir',
        'out',
        cwd=work)
    assert 'among 4 (--num-images 4)' in line
    line = refusal(
        TOOLS + 'self_calibrate.py',
        CONFIG,
        'x.pth',
        '--save-prior',
        f'{UNWRITABLE}/p.json',
        '--out-dir',
        'out',
        cwd=work)
    assert '--save-prior' in line and 'cannot be written' in line
    line = refusal(
        TOOLS + 'self_calibrate.py',
        CONFIG,
        'x.pth',
        '--seed',
        str(2**32),
        cwd=work,
        status=2)
    assert 'argument --seed: an integer in [0, 4294967295]' in line
    assert left(work) == ['x.pth']


# --- fit_site_prior.py ----------------------------------------------------


def test_fit_site_prior_refuses_its_outputs_and_seed_first(work):
    line = refusal(
        TOOLS + 'fit_site_prior.py',
        CONFIG,
        'x.pth',
        '--out',
        f'{UNWRITABLE}/x.json',
        '--out-dir',
        'out',
        cwd=work)
    assert f'--out {UNWRITABLE}/x.json cannot be written' in line
    line = refusal(
        TOOLS + 'fit_site_prior.py',
        CONFIG,
        'x.pth',
        '--out',
        'p.json',
        '--seed',
        '-1',
        cwd=work,
        status=2)
    assert 'argument --seed' in line
    assert left(work) == ['x.pth']


def test_fit_site_prior_refuses_duplicated_ids_and_bad_boxes(work):
    images = work / 'images'
    images.mkdir()
    for problem, data in (
        ('duplicated image id 7',
         dict(
             images=[
                 dict(id=7, file_name='a.jpg'),
                 dict(id=7, file_name='b.jpg')
             ],
             annotations=[],
             categories=[dict(id=1, name='cat')])),
        ('negative "bbox"',
         dict(
             images=[dict(id=7, file_name='a.jpg')],
             annotations=[
                 dict(id=1, image_id=7, category_id=1, bbox=[0, 0, -4, 4])
             ],
             categories=[dict(id=1, name='cat')])),
    ):
        (work / 'site.json').write_text(json.dumps(data))
        line = refusal(
            TOOLS + 'fit_site_prior.py',
            CONFIG,
            'x.pth',
            '--site-ann',
            'site.json',
            '--site-img-dir',
            'images',
            '--out',
            'p.json',
            '--out-dir',
            'out',
            cwd=work)
        assert problem in line and 'site.json' in line
        assert left(work) == ['images', 'site.json', 'x.pth']


# --- compute_prior.py -----------------------------------------------------


def test_compute_prior_refuses_a_file_of_no_images_and_bad_outputs(work):
    (work / 'ann.json').write_text(
        json.dumps(
            dict(images=[], annotations=[], categories=[dict(id=1,
                                                             name='a')])))
    line = refusal(
        TOOLS + 'compute_prior.py', 'ann.json', '--out', 'p.json', cwd=work)
    assert 'ann.json holds no images' in line
    line = refusal(
        TOOLS + 'compute_prior.py',
        'ann.json',
        '--out',
        f'{UNWRITABLE}/p.json',
        cwd=work)
    assert 'cannot be written' in line
    assert left(work) == ['ann.json', 'x.pth']


# --- cache_decoder_outputs.py ----------------------------------------------


def test_cache_decoder_outputs_refuses_a_file_as_its_folder(work):
    (work / 'cache').write_text('a file')
    line = refusal(
        TOOLS + 'cache_decoder_outputs.py',
        CONFIG,
        'x.pth',
        '--out',
        'cache',
        cwd=work)
    assert '--out cache is a file, not a folder' in line
    line = refusal(
        TOOLS + 'cache_decoder_outputs.py',
        CONFIG,
        'x.pth',
        '--out',
        'c2',
        '--seed',
        str(2**32),
        cwd=work,
        status=2)
    assert 'argument --seed' in line
    assert left(work) == ['cache', 'x.pth']
    assert (work / 'cache').read_text() == 'a file'


def test_a_failed_rename_removes_the_partial_folder(tmp_path, monkeypatch):
    writer = DecoderCacheWriter(str(tmp_path / 'cache'))
    sample = DetDataSample(metainfo=dict(img_id=0, img_shape=(8, 8)))
    writer.add(
        torch.zeros(2, 1, 3, 4), torch.full((2, 1, 3, 4), 0.5), [sample], 0)

    def refused_rename(src, dst):
        raise OSError(errno.EACCES, 'Permission denied')

    monkeypatch.setattr(writer_module.os, 'rename', refused_rename)
    with pytest.raises(OSError, match='Permission denied'):
        writer.commit()
    assert left(tmp_path) == []
    with pytest.raises(ValueError, match='is a file, not a folder'):
        (tmp_path / 'file').write_text('x')
        DecoderCacheWriter(str(tmp_path / 'file'))
    assert left(tmp_path) == ['file']


# --- make_data.py and tools/test.py ---------------------------------------


def test_make_data_refuses_a_seed_numpy_cannot_take(tmp_path):
    line = refusal(
        'projects/context_shift/tools/make_data.py',
        '--out',
        'data',
        '--seed',
        str(2**32),
        cwd=tmp_path,
        status=2)
    assert 'argument --seed: an integer in [0, 4294967295]' in line
    assert left(tmp_path) == []


def test_test_py_refuses_a_prior_of_another_k_before_work_dir(work):
    np.save(work / 'k3.npy', flat_prior(3))
    line = refusal(
        'tools/test.py',
        CONFIG,
        'x.pth',
        '--prior',
        'k3.npy',
        '--work-dir',
        'wd',
        cwd=work)
    assert '--prior: k3.npy has K=3 classes, the model of the config has ' \
        '80' in line
    assert left(work) == ['k3.npy', 'x.pth']
