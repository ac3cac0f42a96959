# Copyright (c) mmcalidet contributors. All rights reserved.
"""The evaluation tables of seeded, untrained tiny detectors of every head
kind, written to a JSON file or compared with one: a refactoring that
leaves the tables unchanged (within a float tolerance) passes. Example::

    python tools/misc/check_tables.py --out tables.json
    # ... change the code ...
    python tools/misc/check_tables.py --compare tables.json

Per detector (``configs/calidet/calidet_<name>_tiny_coco-mini.py``, its
plain baseline ``<name>_tiny_coco-mini.py`` where there is one, weights
seeded by ``--seed``, the first ``--max-images`` coco-mini validation
images at 128 x 128 on the CPU) it computes, as the tools do
(:class:`~mmcalidet.evaluation.EvalSetup`,
:mod:`~mmcalidet.evaluation.protocol`):

* the injection table (flip(E_x), E0, E_t, E_v, E_b, E_x; the baseline
  and its post-hoc corrections);
* the sites table and the sweep table of two sites (the first and the
  second half of the images; E_site split-half and in-sample, 20
  bootstrap resamples);
* a digest of every prediction set the tables scored (the number of
  detections; the sums of their scores, of their box coordinates and of
  each score times its label + 1): untrained detectors score near zero AP,
  their detections differ where any re-scoring does.

The arithmetic is pinned (:data:`ARITHMETIC`, set before torch loads: the
tool starts itself again with it when it is not set): torch's own kernels,
MKL's (conditional numerical reproducibility) and oneDNN's at AVX2, one
thread. Without it another CPU's MKL picks other kernels, and the
untrained RTMDet's near-tied scores then keep other boxes (8.9 % off a box
sum, one detection more); with it the DINO's, Deformable DETR's and Faster
R-CNN's tables agree between an Intel Xeon and an AMD EPYC VM, the RTMDet's
do not (a box sum 7.7 % off): compare an RTMDet record on the machine that
wrote it. Timings are left out; the torch version and the arithmetic are
recorded. With
``--compare FILE`` the tool recomputes and exits 1 naming the first value
that differs; 0 when every one agrees. Integers, strings and booleans agree
when equal; floats when within a relative :data:`REL_TOL` (1e-6, absolute
:data:`ABS_TOL` near zero): two CPUs of the same capability pick other
oneDNN/MKL kernels and move the last bits (a relative 1e-8 was seen), far
below any real change (an AP moved by 1e-4, one detection more).
``tests/data/check_tables.json`` holds the tables recorded with the
split-half site tables; where the code's tables did not change (the
injection table), they are those recorded before the head-kind adapters.
"""
import argparse
import json
import logging
import math
import os
import os.path as osp
import sys
import tempfile
from typing import Any, Dict, Iterator, List, Optional, Tuple

#: environment variables read when torch, MKL and oneDNN load: the same
#: kernels on every x86-64 CPU with AVX2
ARITHMETIC = {
    'ATEN_CPU_CAPABILITY': 'avx2',
    'MKL_CBWR': 'AVX2',
    'ONEDNN_MAX_CPU_ISA': 'AVX2',
}
if __name__ == '__main__' and any(
        os.environ.get(k) != v for k, v in ARITHMETIC.items()):
    # torch is not loaded yet in a new interpreter, but may be in one that
    # runs this file (a forked test helper): start again with them
    os.environ.update(ARITHMETIC)
    os.execv(sys.executable, [sys.executable, osp.abspath(__file__)] +
             sys.argv[1:])

import numpy as np  # noqa: E402
import torch  # noqa: E402

from mmcalidet.utils.cli import positive_int, run_tool  # noqa: E402

#: the checkout (or an installed package's .mim folder): configs/ is here
ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))

#: detector name -> does it have a plain baseline config (DAB-DETR's tables
#: are not in the default set: its shared classifier was not re-scored
#: before the head-kind adapters)
DETECTORS = {
    'dino': True,
    'deformable-detr': True,
    'dab-detr': False,
    'rtmdet': True,
    'faster-rcnn': True,
}
#: --cfg-options of every detector: small images; few boxes into the NMS
#: (random weights score every box alike) and no score threshold (an
#: untrained head scores below it: nothing would be re-scored)
OPTIONS = {
    'test_dataloader.dataset.pipeline.1.scale': (128, 128),
}
EXTRA_OPTIONS = {
    'rtmdet': {
        'model.test_cfg.nms_pre': 100,
        'model.test_cfg.max_per_img': 20,
        'model.test_cfg.score_thr': 0.0
    },
    'faster-rcnn': {
        'model.test_cfg.rpn.nms_pre': 100,
        'model.test_cfg.rpn.max_per_img': 20,
        'model.test_cfg.rcnn.score_thr': 0.0
    },
}
#: row keys that are timings, not results
TIMING_KEYS = ('seconds', )
#: floats agree within this relative difference (or :data:`ABS_TOL`)
REL_TOL = 1e-6
#: ... or this absolute one, for values near zero
ABS_TOL = 1e-9
#: bootstrap resamples of the sites' and sweep's intervals
RESAMPLES = 20


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description='Compute (or compare) the evaluation tables of seeded '
        'tiny detectors of every head kind')
    out = parser.add_mutually_exclusive_group(required=True)
    out.add_argument('--out', help='write the tables to this JSON file')
    out.add_argument(
        '--compare',
        metavar='FILE',
        help='recompute and compare with this JSON file (exit 1 naming '
        'the first number that differs)')
    parser.add_argument(
        '--detectors',
        nargs='+',
        choices=sorted(DETECTORS),
        help='detectors to run (default: those of --compare, else all but '
        'dab-detr)')
    parser.add_argument(
        '--max-images', type=positive_int, default=8, help='images')
    parser.add_argument(
        '--seed', type=int, default=0, help='torch seed of the weights')
    return parser.parse_args(argv)


class PredictionDigests:
    """Record a digest of every prediction set an evaluator scores."""

    def __init__(self, evaluator) -> None:
        self.digests: List[Dict[str, Any]] = []
        for name in ('evaluate', 'evaluate_ap'):
            original = getattr(evaluator, name)
            setattr(evaluator, name, self._recording(name, original))

    def _recording(self, name: str, original):

        def call(img_ids, results, *args, **kwargs):
            self.digests.append(self.digest(name, img_ids, results))
            return original(img_ids, results, *args, **kwargs)

        return call

    @staticmethod
    def digest(name: str, img_ids, results) -> Dict[str, Any]:
        """The number of detections and three sums over them, floats that
        another CPU's last bits move by far less than :data:`REL_TOL`."""
        count = 0
        sums = dict(score_sum=0.0, bbox_sum=0.0, label_score_sum=0.0)
        for res in results:
            scores, bboxes, labels = (_numpy(res.get(field))
                                      for field in ('scores', 'bboxes',
                                                    'labels'))
            count += int(len(scores))
            sums['score_sum'] += float(scores.sum())
            sums['bbox_sum'] += float(bboxes.sum())
            sums['label_score_sum'] += float((scores * (labels + 1)).sum())
        return dict(
            call=name, images=len(img_ids), detections=count, **sums)


def _numpy(value) -> np.ndarray:
    """``value`` (a tensor or an array-like) as a float64 array."""
    if torch.is_tensor(value):
        value = value.detach().cpu().numpy()
    return np.asarray(value, dtype=np.float64)


def _rows(rows) -> List[Dict]:
    return [{
        k: v
        for k, v in row.items() if k not in TIMING_KEYS
    } for row in rows]


def save_checkpoint_of(config: str, seed: int, folder: str) -> str:
    """A seeded, untrained detector's checkpoint: the detector of
    ``configs/<config>`` as :func:`mmcalidet.apis.init_detector` builds it
    without a checkpoint, its weights initialised after
    ``torch.manual_seed(seed)``, in training mode."""
    from mmengine.config import Config
    from mmengine.runner import save_checkpoint

    from mmcalidet.apis import init_detector
    cfg = Config.fromfile(osp.join(ROOT, 'configs', config))
    torch.manual_seed(seed)
    model = init_detector(cfg, None, device='cpu').train()
    path = osp.join(folder, osp.basename(config)[:-3] + '.pth')
    save_checkpoint(dict(state_dict=model.state_dict()), path)
    return path


def build_setup(name: str, max_images: int, seed: int, folder: str):
    """The :class:`~mmcalidet.evaluation.EvalSetup` of one detector and
    its baseline, their seeded checkpoints saved in ``folder``."""
    from mmcalidet.evaluation.methods import EvalSetup
    configs = [f'calidet/calidet_{name}_tiny_coco-mini.py']
    if DETECTORS[name]:
        configs.append(f'calidet/{name}_tiny_coco-mini.py')
    paths = []
    for config in configs:
        paths += [
            osp.join(ROOT, 'configs', config),
            save_checkpoint_of(config, seed, folder)
        ]
    baseline = paths[2:] or [None, None]
    return EvalSetup(
        paths[0],
        paths[1],
        baseline_config=baseline[0],
        baseline_checkpoint=baseline[1],
        max_images=max_images,
        device='cpu',
        cfg_options=dict(OPTIONS, **EXTRA_OPTIONS.get(name, {})),
        progress=False,
        report=lambda line: None)


def setup_tables(setup) -> Dict[str, Any]:
    """The tables of an evaluation setup: injection, two sites (the
    images' halves) and their sweep, and the predictions' digests."""
    from mmcalidet.evaluation import cache_evaluator, protocol
    from mmcalidet.evaluation.partitions import site_priors
    digests = PredictionDigests(setup.evaluator)
    evaluate = cache_evaluator(setup.evaluator)
    methods, train = setup.methods, setup.train_prior
    injection = protocol.injection(
        methods, evaluate, train, classes=setup.classes, progress=False)
    num = len(setup.cache)
    groups = ['a'] * (num // 2) + ['b'] * (num - num // 2)
    priors = site_priors(setup.cache.gt_label_lists(), groups,
                         len(setup.classes))
    partitions = {
        site: np.flatnonzero(np.asarray(groups) == site)
        for site in priors
    }
    sites = protocol.sites(
        methods,
        setup.evaluator,
        train,
        partitions,
        priors,
        resamples=RESAMPLES)
    sweep = protocol.sweep(
        methods,
        setup.evaluator,
        train,
        partitions,
        priors,
        resamples=RESAMPLES)
    return dict(
        methods=[m.name for m in methods],
        images=num,
        injection=_rows(injection.rows),
        orders=injection.extras['orders'],
        sites=_rows(sites.rows),
        sweep=_rows(sweep.rows),
        predictions=digests.digests)


def detector_tables(name: str, max_images: int, seed: int,
                    folder: str) -> Dict[str, Any]:
    """The tables of one detector (and its baseline), what the libraries
    print left out."""
    from mmcalidet.utils.log_level import library_output_to, mmengine_log_level
    with library_output_to(os.devnull), \
            mmengine_log_level(at_least=logging.ERROR):
        return setup_tables(build_setup(name, max_images, seed, folder))


def compute(names: List[str], max_images: int, seed: int) -> Dict[str, Any]:
    """The tables of ``names`` (:data:`DETECTORS` keys)."""
    from mmengine.logging import MMLogger
    torch.set_num_threads(1)  # the same arithmetic whatever the machine
    # mmengine's logger made now writes to the console, not to a stream
    # the quiet blocks close
    MMLogger.get_current_instance()
    tables: Dict[str, Any] = dict(
        format=1,
        max_images=max_images,
        seed=seed,
        arithmetic=arithmetic(),
        detectors={})
    with tempfile.TemporaryDirectory() as folder:
        for name in names:
            print(f'{name} ...', flush=True)
            tables['detectors'][name] = detector_tables(
                name, max_images, seed, folder)
    return tables


def arithmetic() -> Dict[str, str]:
    """What the numbers' last bits depend on beside the code: torch's
    version and the CPU kernels it picks."""
    return dict(
        torch=torch.__version__,
        cpu=str(torch.backends.cpu.get_cpu_capability()),
        **{k: os.environ.get(k, '')
           for k in ARITHMETIC})


def flatten(value: Any, path: str = '') -> Iterator[Tuple[str, Any]]:
    """``(path, leaf)`` of a JSON value, in order."""
    if isinstance(value, dict):
        yield path + '{}', sorted(value)
        for key in value:
            yield from flatten(value[key], f'{path}.{key}' if path else key)
    elif isinstance(value, list):
        yield path + '[]', len(value)
        for i, item in enumerate(value):
            yield from flatten(item, f'{path}[{i}]')
    else:
        yield path, value


def same(a: Any, b: Any) -> bool:
    """Do two JSON leaves agree? Floats within :data:`REL_TOL` (or
    :data:`ABS_TOL`; NaN agrees with NaN), anything else when equal and of
    one type."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return math.isclose(a, b, rel_tol=REL_TOL, abs_tol=ABS_TOL)
    return a == b


def first_difference(before: Dict, now: Dict) -> Optional[str]:
    """The first leaf (path, values) that differs (:func:`same`), or
    ``None``."""
    for (path_a, a), (path_b, b) in zip(flatten(before), flatten(now)):
        if path_a != path_b:
            return f'{path_a}: the tables have another layout ({path_b})'
        if not same(a, b):
            return f'{path_a}: {a!r} before, {b!r} now'
    return None


def canonical(tables: Dict) -> Dict:
    """``tables`` as JSON reads it back (tuples as lists, ...)."""
    return json.loads(json.dumps(tables))


def main(argv=None) -> int:
    args = parse_args(argv)
    before = None
    if args.compare:
        with open(args.compare) as f:
            before = json.load(f)
        names = args.detectors or list(before['detectors'])
        max_images, seed = before['max_images'], before['seed']
    else:
        names = args.detectors or [n for n in DETECTORS if n != 'dab-detr']
        max_images, seed = args.max_images, args.seed
    tables = canonical(compute(names, max_images, seed))
    if before is None:
        os.makedirs(osp.dirname(osp.abspath(args.out)), exist_ok=True)
        with open(args.out, 'w') as f:
            json.dump(tables, f, indent=1)
            f.write('\n')
        count = sum(1 for _ in flatten(tables))
        print(f'wrote {args.out} ({count} values of {len(names)} detectors)')
        return 0
    before = dict(
        before, detectors={n: before['detectors'].get(n)
                           for n in names})
    diff = first_difference(before, tables)
    if diff is not None:
        print(f'tables differ: {diff}', file=sys.stderr)
        return 1
    count = sum(1 for _ in flatten(tables))
    print(f'tables agree: {count} values of {len(names)} detectors '
          f'({", ".join(names)}) as in {args.compare}')
    return 0


if __name__ == '__main__':
    run_tool(main)
