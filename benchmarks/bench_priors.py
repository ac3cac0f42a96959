# Copyright (c) mmcalidet contributors. All rights reserved.
"""Speed of the relation statistics on COCO train2017 (117k label sets).

Prints, in one run:
1. E_t from label sets already in memory: the Cython core vs a vectorised
   numpy dense-matrix baseline (N x K indicator matrix, C = D^T D), and
   their ratio (targets: >= 10x, <= 10 ms). The baseline is timed with
   BLAS at its default threads and, if ``threadpoolctl`` is installed, at
   one thread; the faster counts.
2. E_t from 117k Python lists through the public ``batch_prior`` (the
   Cython list reader, which reads ints through CPython's public C API
   only) vs the same numpy baseline with its flattening of the lists
   (``np.fromiter`` over ``itertools.chain``) included (target: >= 10x;
   required: >= ``--min-speedup``, 5x).
3. compute_prior on the tarball vs just streaming it (``tar -xzOf``), as a
   ratio (target <= 2.5x): in-process (read + count + write, what the tool
   does after start-up) and the whole CLI process (interpreter start and
   imports included). ``--no-tarball`` skips it.

The last line is the result for the Python lists (2.): both times, the
ratio and PASS or FAIL against ``--min-speedup``; the exit status is 1 on
FAIL.

Usage::

    .venv/bin/python benchmarks/bench_priors.py [--data ../shared/datasets] \
        [--repeat 5] [--min-speedup 5] [--no-tarball]
"""
import argparse
import itertools
import os
import os.path as osp
import subprocess
import sys
import tempfile
import time

import numpy as np

os.environ.setdefault('MMCALIDET_LIGHT', '1')  # priors only

from mmcalidet.priors import batch_prior, counts_to_prior, save_prior
from mmcalidet.priors.dataset_prior import prior_from_source
from mmcalidet.priors.statistics import counts_from_flat

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))


def best_of(fn, repeat):
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return min(times), out


def best_of_baseline(fn, repeat):
    """:func:`best_of` for the numpy baseline, at its best: with BLAS at its
    default threads and, when ``threadpoolctl`` is installed, at one thread
    too, keeping the faster (on a loaded machine oversubscribed BLAS threads
    can make the matmul ten times slower, which would flatter the ratio).

    Returns:
        tuple: ``(seconds, output, blas_threads)``, ``blas_threads`` a label
        of the setting that won ('default' or '1').
    """
    seconds, out = best_of(fn, repeat)
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return seconds, out, 'default'
    with threadpool_limits(limits=1, user_api='blas'):
        seconds_1, out_1 = best_of(fn, repeat)
    if seconds_1 < seconds:
        return seconds_1, out_1, '1'
    return seconds, out, 'default'


def numpy_dense_prior(labels, offsets, num_classes):
    """Vectorised numpy baseline: dense N x K indicator, C = D^T D."""
    n = offsets.size - 1
    rows = np.repeat(np.arange(n), np.diff(offsets))
    dense = np.zeros((n, num_classes), dtype=np.float32)
    dense[rows, labels] = 1.0
    cooc = dense.T @ dense
    counts = dense.sum(0)
    return counts_to_prior(cooc.astype(np.float64), counts)


def numpy_dense_prior_of_lists(label_lists, num_classes):
    """The numpy baseline on Python lists: flatten them (``np.fromiter``
    over ``itertools.chain``, counts from ``map(len)``), then
    :func:`numpy_dense_prior`."""
    n = len(label_lists)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(
        np.fromiter(map(len, label_lists), dtype=np.int64, count=n),
        out=offsets[1:])
    labels = np.fromiter(
        itertools.chain.from_iterable(label_lists),
        dtype=np.int64,
        count=int(offsets[-1]))
    return numpy_dense_prior(labels, offsets, num_classes)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--data', default=os.environ.get(
        'MMCALIDET_DATA', osp.join(osp.dirname(ROOT), 'shared', 'datasets')))
    parser.add_argument('--repeat', type=int, default=5)
    parser.add_argument(
        '--min-speedup',
        type=float,
        default=5.0,
        help='speed-up over the numpy dense baseline required of the '
        'Python-lists path (default: 5)')
    parser.add_argument(
        '--no-tarball',
        action='store_true',
        help='skip the compute_prior vs tar -xzOf timing')
    args = parser.parse_args()
    labels_dir = osp.join(args.data, 'coco2017-labels')
    tarball = osp.join(labels_dir, 'labels_train2017.tar.gz')
    classes = osp.join(labels_dir, 'classes.json')

    _, _, sets = prior_from_source(tarball, classes, progress=False)
    k = len(sets.classes)
    labels, offsets = sets.labels, sets.offsets
    print(f'train2017: {sets.num_images} label sets, {labels.size} labels')

    t_cy, e_cy = best_of(
        lambda: counts_to_prior(*counts_from_flat(labels, offsets, k)),
        args.repeat)
    t_np, e_np, blas = best_of_baseline(
        lambda: numpy_dense_prior(labels, offsets, k), args.repeat)
    assert np.allclose(e_cy, e_np), 'baseline disagrees'
    print(f'[in memory] Cython E_t: {t_cy * 1e3:.2f} ms | numpy dense '
          f'baseline (BLAS threads: {blas}): {t_np * 1e3:.2f} ms | speed-up '
          f'{t_np / t_cy:.1f}x (targets: >= 10x, <= 10 ms)')

    lists = [a.tolist() for a in np.split(labels, offsets[1:-1])]
    t_list, e_list = best_of(lambda: batch_prior(k, lists), args.repeat)
    t_np_list, e_np_list, blas = best_of_baseline(
        lambda: numpy_dense_prior_of_lists(lists, k), args.repeat)
    assert np.allclose(e_list, e_np_list), 'baseline disagrees'
    assert np.array_equal(e_list, e_cy), 'list and flat paths disagree'
    speedup = t_np_list / t_list
    print(f'[Python lists] batch_prior(K, lists), one thread: '
          f'{t_list * 1e3:.2f} ms | numpy dense baseline with flattening '
          f'(BLAS threads: {blas}): {t_np_list * 1e3:.2f} ms | speed-up '
          f'{speedup:.1f}x (target: >= 10x)')
    if not args.no_tarball:
        tarball_timings(tarball, classes, args.repeat)
    passed = speedup >= args.min_speedup
    print(f'RESULT: E_t from {len(lists)} Python label lists (K={k}): '
          f'numpy dense baseline {t_np_list * 1e3:.2f} ms, Cython '
          f'{t_list * 1e3:.2f} ms, {speedup:.1f}x faster (required >= '
          f'{args.min_speedup:g}x): {"PASS" if passed else "FAIL"}')
    return 0 if passed else 1


def tarball_timings(tarball, classes, repeat):
    """compute_prior on the tarball against ``tar -xzOf`` (in process and
    as a CLI process)."""

    def stream():
        subprocess.run(['tar', '-xzOf', tarball], check=True,
                       stdout=subprocess.DEVNULL)

    t_tar, _ = best_of(stream, repeat)
    with tempfile.TemporaryDirectory() as tmp:
        out = osp.join(tmp, 'p.json')

        def in_process():
            prior, _, s = prior_from_source(tarball, classes,
                                            progress=False)
            save_prior(out, prior, s.classes)

        t_tool, _ = best_of(in_process, repeat)

        def cli():
            subprocess.run([
                sys.executable,
                osp.join(ROOT, 'tools/analysis_tools/compute_prior.py'),
                tarball, '--classes', classes, '--out', out, '--no-progress'
            ], check=True, stdout=subprocess.DEVNULL)

        t_cli, _ = best_of(cli, min(repeat, 3))
    print(f'[tarball] tar -xzOf: {t_tar:.3f} s | compute_prior in-process: '
          f'{t_tool:.3f} s ({t_tool / t_tar:.2f}x) | compute_prior CLI '
          f'process: {t_cli:.3f} s ({t_cli / t_tar:.2f}x) (target <= 2.5x)')


if __name__ == '__main__':
    sys.exit(main())
