# Copyright (c) mmcalidet contributors. All rights reserved.
"""The prior page's logic without gradio: V' once per prior, the changed
detections, the edits in words (edit_prior.py's writer), a site's AP
(the library's COCO metrics), the demo model's files and one-line
errors."""
import json
import os.path as osp
import runpy

import numpy as np
import pytest
import torch

from mmcalidet.app import PageActions, error_text
from mmcalidet.app.compare import changed_detections
from mmcalidet.app.edit import apply_page_edits
from mmcalidet.app.model_files import demo_model
from mmcalidet.app.site_ap import load_site, per_class_ap
from mmcalidet.evaluation import CocoEvaluator
from testing import PROJECT_ROOT, data_root
from testing.app_model import coco_mini_val_image


def califormer_calls(session):
    calls = []
    handle = session.model.bbox_head.califormer.register_forward_hook(
        lambda *args: calls.append(1))
    return calls, handle


def test_vprime_is_computed_once_per_prior(app_actions, edited_prior_file):
    from mmcalidet.apis import inference_detector
    session = app_actions.session
    img = session.check_image(coco_mini_val_image())
    edited = session.resolve(edited_prior_file)
    calls, handle = califormer_calls(session)
    try:
        first = [
            session.detect([img], p)[0]
            for p in (session.train_prior, edited, session.train_prior, edited)
        ]
    finally:
        handle.remove()
    # at most one pass per prior (none for one already cached), none per
    # image or per switch
    assert len(calls) <= 2
    for a, b in zip(first[:2], first[2:]):
        assert torch.equal(a.pred_instances.scores, b.pred_instances.scores)
    # the cached V' gives what a call's own prior computes afresh
    with torch.no_grad():
        direct = inference_detector(session.model, img, prior=edited)
    np.testing.assert_allclose(
        first[1].pred_instances.scores.numpy(),
        direct.pred_instances.scores.numpy(),
        atol=1e-6)


def test_the_changed_detections_keep_the_boxes(app_actions, edited_prior_file):
    session = app_actions.session
    img = session.check_image(coco_mini_val_image())
    a, b = (
        session.detect([img], p)[0]
        for p in (session.train_prior, session.resolve(edited_prior_file)))
    boxes = [{tuple(x)
              for x in p.pred_instances.bboxes.numpy().round(2)}
             for p in (a, b)]
    assert boxes[0] == boxes[1]
    rows = changed_detections(a, b, session.classes, 0.3)
    assert 0 < len(rows) <= 10
    changes = [abs(r[-1]) for r in rows]
    assert changes == sorted(changes, reverse=True) and changes[0] > 0
    assert changed_detections(a, a, session.classes, 0.3) == []


def test_edits_are_edit_prior_py_s_and_drop_a_changed_support(
        app_actions, tmp_path):
    base = app_actions.session.named['coco2017_train']
    assert base.has_support
    out = app_actions.apply_edits('coco2017_train', None, None,
                                  'person|bicycle=0.95\n# a comment\n',
                                  ['car'])
    assert 'not kept: num_images, images_per_class' in out['status']
    ref = str(tmp_path / 'ref.json')
    # the same edits through the tool: the same file
    import sys
    argv = sys.argv
    sys.argv = [
        'edit_prior.py',
        osp.join(PROJECT_ROOT, 'mmcalidet/data/priors/coco2017_train.json'),
        '--set', 'person|bicycle=0.95', '--set', 'car|*=0', '--out', ref
    ]
    try:
        with pytest.raises(SystemExit) as done:
            runpy.run_path(
                osp.join(PROJECT_ROOT, 'tools/misc/edit_prior.py'),
                run_name='__main__')
    finally:
        sys.argv = argv
    assert done.value.code == 0
    with open(out['file']) as f, open(ref) as g:
        page, tool = json.load(f), json.load(g)
    assert page.pop('base') == 'coco2017_train'  # as the page names it
    assert tool.pop('base') == 'coco2017_train.json'
    # the page writes the model's spelling of the names (sports_ball)
    assert [c.replace('_', ' ') for c in page.pop('classes')] == \
        tool.pop('classes')
    assert page == tool
    car = base.classes.index('car')
    others = np.arange(len(base.classes)) != car
    assert (out['prior'].matrix[car, others] == 0).all()
    assert not out['prior'].has_support
    # edits that change nothing keep the prior, its support too
    same, line = apply_page_edits(
        base, [f'person|bicycle={float(base.matrix[0, 1])!r}'])
    assert same is base and 'kept' in line


@pytest.mark.parametrize('edit, problem', [('persn|car=0.1', 'persn'),
                                           ('person|car=2', '[0, 1]'),
                                           ('person car', 'must read')])
def test_a_bad_edit_is_one_line(app_actions, edit, problem):
    with pytest.raises(ValueError) as err:
        app_actions.apply_edits('E_t', None, None, edit, [])
    line = error_text(err.value)
    assert '\n' not in line and problem in line


def test_bad_inputs_are_one_line(app_actions, tmp_path):
    img = coco_mini_val_image()
    cases = []
    bad_prior = tmp_path / 'k3.json'
    bad_prior.write_text(json.dumps({'matrix': np.eye(3).tolist()}))
    cases.append(((img, 'uploaded JSON', str(bad_prior)), 'K=3'))
    broken = tmp_path / 'broken.jpg'
    broken.write_bytes(b'not an image')
    cases.append(((str(broken), 'E0', None), 'not an image'))
    cases.append(((None, 'E0', None), 'no image'))
    cases.append(((img, 'uploaded JSON', None), 'no prior file'))
    cases.append(((img, 'edited (the Edit tab)', None), 'no edited prior'))
    for (image, choice, prior_file), problem in cases:
        with pytest.raises(ValueError) as err:
            app_actions.detect(image, choice, prior_file, None, 0.3)
        line = error_text(err.value)
        assert '\n' not in line and problem in line, line


def test_the_pixel_limit(app_actions):
    actions = PageActions(app_actions.session, app_actions.drawer)
    limit = actions.session.max_pixels
    try:
        actions.session.max_pixels = 100
        with pytest.raises(ValueError, match='pixels'):
            actions.detect(coco_mini_val_image(), 'E0', None, None, 0.3)
    finally:
        actions.session.max_pixels = limit


def test_a_site_ap_is_the_library_s(app_actions, tmp_path):
    session = app_actions.session
    ref = osp.join(data_root(), 'coco-mini', 'reference',
                   'instances_val2017_coco-mini.json')
    with open(ref) as f:
        coco = json.load(f)
    keep = {img['id'] for img in coco['images'][:3]}
    site = dict(
        coco,
        images=[i for i in coco['images'] if i['id'] in keep],
        annotations=[a for a in coco['annotations'] if a['image_id'] in keep])
    folder = tmp_path / 'site'
    (folder / 'images').mkdir(parents=True)
    for img in site['images']:
        src = osp.join(data_root(), 'coco-mini', 'images', 'val2017',
                       img['file_name'])
        (folder / 'images' / img['file_name']).symlink_to(src)
    (folder / 'site.json').write_text(json.dumps(site))
    seen = []
    out = app_actions.site(
        str(folder), 'E0', None, None, lambda f, text: seen.append(f))
    report = out['report']
    assert report['num_images'] == 3 and seen[-1] == 1.0
    assert seen == sorted(seen)
    present = {
        c['name'].replace(' ', '_')
        for c in site['categories']
        if c['id'] in {a['category_id']
                       for a in site['annotations']}
    }
    assert set(report['per_class']) == present
    # the overall AP is the library's, and the mean of the per-class APs
    preds = session.detect(
        [str(folder / 'images' / i['file_name']) for i in site['images']],
        session.train_prior)
    ids = sorted(keep)
    api, _ = load_site(str(folder / 'site.json'), session.classes)
    results = [p.pred_instances for p in preds]
    overall = CocoEvaluator(api, session.classes).evaluate_ap(ids, results)
    assert report['ap_train'] == pytest.approx(overall, abs=1e-9)
    _, per_class = per_class_ap(api, session.classes, ids, results)
    assert np.mean(list(per_class.values())) == pytest.approx(
        overall, abs=1e-6)
    assert len(out['rows']) == len(present)
    with pytest.raises(ValueError, match='site not found'):
        app_actions.site(str(tmp_path / 'nowhere'), 'E0', None, None)


def test_without_a_demo_model_one_line_says_run_make_demo(tmp_path):
    with pytest.raises(ValueError) as err:
        demo_model(str(tmp_path / 'calidet'))
    assert 'make demo' in str(err.value) and '\n' not in str(err.value)
    (tmp_path / 'calidet').mkdir()
    (tmp_path / 'calidet' / 'x.py').write_text('')
    (tmp_path / 'calidet' / 'iter_10.pth').write_text('')
    (tmp_path / 'calidet' / 'iter_9.pth').write_text('')
    config, ckpt = demo_model(str(tmp_path / 'calidet'))
    assert ckpt.endswith('iter_10.pth') and config.endswith('x.py')


@pytest.mark.slow  # a tool run as a subprocess
def test_the_tool_without_a_demo_model(run_tool, tmp_path):
    out = run_tool('tools/demo/prior_app.py', '--demo-work-dir',
                   str(tmp_path / 'none'))
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and 'run `make demo` first' in lines[0], lines
