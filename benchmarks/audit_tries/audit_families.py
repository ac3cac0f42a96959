# Copyright (c) mmcalidet contributors. All rights reserved.
"""The tries of ``benchmarks/audit_hostile_inputs.py`` through the library's
public API: each family is a function ``run(audit, tmp)`` that makes its
inputs under ``tmp`` and calls :meth:`Audit.api` once per try. The tools'
families are in ``audit_tool_tries.py`` (this folder)."""
import glob
import json
import os
import os.path as osp
from functools import lru_cache

import numpy as np
import torch

from testing import data_root, random_prior

NAN, INF = float('nan'), float('inf')
K3 = ['cat', 'dog', 'person']
IMAGES = sorted(
    glob.glob(
        osp.join(data_root(), 'coco-mini', 'images', 'val2017', '*.jpg')))
DINO = 'calidet/calidet_dino_tiny_coco-mini.py'
FCOS = 'calidet/calidet_fcos_tiny_coco-mini.py'


def same(a, b, atol=1e-5) -> bool:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if b.ndim == 0:
        b = np.broadcast_to(b, a.shape)
    return a.shape == b.shape and bool(np.allclose(a, b, atol=atol))


def with_nan(matrix, where=(0, 1), value=NAN):
    out = np.array(matrix, dtype=np.float64)
    out[where] = value
    return out


# --- Prior construction and files ---------------------------------------


def prior_family(audit, tmp):
    from mmcalidet.priors import Prior
    os.makedirs(tmp, exist_ok=True)
    fam = 'Prior'
    good = random_prior(0, 3)
    _prior_bad_matrix_tries(audit, fam, good)
    _prior_valid_matrix_tries(audit, fam, good)
    _prior_class_name_tries(audit, fam, good)
    ok_support, ok_shares = np.array([10., 4., 7.]), np.array([.1, .5, .9])
    _prior_support_tries(audit, fam, good, ok_support, ok_shares)
    named = Prior(good, K3, ok_support, ok_shares)
    perm = ['person', 'cat', 'dog']
    idx = [K3.index(c) for c in perm]
    _prior_reorder_tries(audit, fam, good, named, perm, idx, ok_support)
    npy3 = _prior_file_tries(audit, fam, tmp, good)
    _prior_valid_file_tries(audit, fam, tmp, good, named, perm, idx,
                            ok_support, ok_shares, npy3)


def _prior_bad_matrix_tries(audit, fam, good):
    """Prior and Prior.load refuse the matrices that are not a prior."""
    from mmcalidet.priors import Prior
    bad_matrices = [
        ('1-D (3,)', np.full(3, 0.5), r'square|K x K|shape'),
        ('3-D (2, 3, 3)', np.stack([good, good]), r'square|K x K|shape'),
        ('non-square 3 x 4', np.ones((3, 4)), r'square|K x K'),
        ('empty 0 x 0', np.zeros((0, 0)), r'empty|K|square|at least'),
        ('empty (0,)', np.zeros(0), r'empty|square|K'),
        ('scalar 0.5', 0.5, r'square|K x K|shape'),
        ('ragged list', [[1, 0.5], [0.5]], r'square|ragged|array|number'),
        ('strings', np.full((3, 3), 'a'), r'number|numeric|float'),
        ('object None', np.full((3, 3), None), r'number|numeric|non-finite'),
        ('complex', good.astype(complex), r'number|real|complex|float'),
        ('NaN off-diagonal', with_nan(good), r'non-finite|nan'),
        ('NaN diagonal', with_nan(good, (1, 1)), r'non-finite|nan'),
        ('inf', with_nan(good, (0, 2), INF), r'non-finite|inf'),
        ('-inf', with_nan(good, (2, 0), -INF), r'non-finite|inf'),
        ('entry -0.1', with_nan(good, (0, 1), -0.1), r'\[0, 1\]'),
        ('entry 1.5', with_nan(good, (0, 1), 1.5), r'\[0, 1\]'),
        ('entry 1e300', with_nan(good, (0, 1), 1e300), r'\[0, 1\]'),
        ('diagonal 0.5', with_nan(good, (2, 2), 0.5), r'diagonal'),
        ('tensor with NaN', torch.from_numpy(with_nan(good)), r'non-finite'),
        ('int entries 2', np.full((3, 3), 2), r'\[0, 1\]'),
        ('list with None', [[1, None, 0], [0, 1, 0],
                            [0, 0, 1]], r'number|non-finite|float'),
        ('dict without matrix', dict(classes=K3), r'matrix'),
        ('dict of NaN matrix',
         dict(matrix=with_nan(good).tolist(),
              classes=K3), r'non-finite|numeric'),
    ]
    for name, matrix, match in bad_matrices:
        audit.api(
            fam,
            f'Prior(matrix {name})',
            lambda m=matrix: Prior(m),
            match=match)
    for name, matrix, match in bad_matrices[:6] + bad_matrices[10:18]:
        audit.api(
            fam,
            f'Prior.load(matrix {name})',
            lambda m=matrix: Prior.load(m),
            match=match)


def _prior_valid_matrix_tries(audit, fam, good):
    """Prior keeps the valid matrices of every type and layout."""
    from mmcalidet.priors import Prior

    def keeps(matrix):
        return lambda p: same(p.matrix, matrix) and p.num_classes == len(
            matrix) or 'wrong: the matrix changed'

    valid_matrices = [
        ('1 x 1 [[1]]', np.ones((1, 1))),
        ('list of lists', good.tolist()),
        ('float32', good.astype(np.float32)),
        ('float16', np.eye(3, dtype=np.float16)),
        ('int eye', np.eye(3, dtype=int)),
        ('tensor', torch.from_numpy(good)),
        ('Fortran order', np.asfortranarray(good)),
        ('non-contiguous', np.repeat(good, 2, axis=1)[:, ::2]),
    ]
    for name, matrix in valid_matrices:
        audit.api(
            fam,
            f'Prior(matrix {name})',
            lambda m=matrix: Prior(m),
            'accept',
            check=keeps(np.asarray(matrix, np.float64)))
    audit.api(
        fam,
        'Prior(diagonal 0.5, reset_diagonal=True)',
        lambda: Prior(with_nan(good, (2, 2), 0.5), reset_diagonal=True),
        'accept',
        check=lambda p: same(np.diag(p.matrix), 1) and same(
            p.matrix[0, 1], good[0, 1]) or 'wrong')
    audit.api(
        fam,
        'Prior(K=3, num_classes=4)',
        lambda: Prior(good, num_classes=4),
        match=r'K|4')


def _prior_class_name_tries(audit, fam, good):
    """Prior refuses the bad class names and keeps the valid ones."""
    from mmcalidet.priors import Prior
    bad_names = [
        ('a set', {'cat', 'dog', 'person'}, 'ordered'),
        ('a frozenset', frozenset(K3), 'ordered'),
        ('dict keys', dict.fromkeys(K3).keys(), 'ordered'),
        ('a dict', dict.fromkeys(K3), 'ordered'),
        ('duplicates', ['cat', 'cat', 'dog'], r'duplicate|twice|cat'),
        ('2 names', ['cat', 'dog'], r'2 class names'),
        ('4 names', K3 + ['cow'], r'4 class names'),
        ('ints', [1, 2, 3], r'str|name'),
        ('None inside', ['cat', None, 'dog'], r'str|name'),
        ('an empty name', ['cat', '', 'dog'], r'empty|name'),
        ('one string "abc"', 'abc', r'str|sequence|name'),
        ('bytes', [b'cat', b'dog', b'person'], r'str|name'),
        ('a number', 3, r'sequence|name|str'),
    ]
    for name, names, match in bad_names:
        audit.api(
            fam,
            f'Prior(classes {name})',
            lambda n=names: Prior(good, n),
            match=match)
    for name, names in (('a tuple', tuple(K3)), ('an array', np.array(K3)),
                        ('a generator', (n for n in K3)),
                        ('unicode', ['猫', 'dög', 'per son'])):
        expected = tuple(
            str(n)
            for n in (K3 if name != 'unicode' else ['猫', 'dög', 'per son']))
        audit.api(
            fam,
            f'Prior(classes {name})',
            lambda n=names: Prior(good, n),
            'accept',
            check=lambda p, e=expected: p.classes == e or 'wrong order')


def _prior_support_tries(audit, fam, good, ok_support, ok_shares):
    """Prior refuses the bad supports and marginals, keeps the valid."""
    from mmcalidet.priors import Prior
    bad_supports = [
        ('support without marginals', (ok_support, None), 'marginals|both'),
        ('marginals without support', (None, ok_shares), 'support|both'),
        ('negative support', (-ok_support, ok_shares), '>= 0|negative'),
        ('NaN support', (with_nan(ok_support, 0), ok_shares), 'finite'),
        ('inf support', (with_nan(ok_support, 0, INF), ok_shares), 'finite'),
        ('marginals 1.5', (ok_support, with_nan(ok_shares, 1,
                                                1.5)), r'\[0, 1\]'),
        ('NaN marginals', (ok_support, with_nan(ok_shares, 1)), 'finite'),
        ('negative marginals', (ok_support, -ok_shares), r'\[0, 1\]'),
        ('support of K=2', (ok_support[:2], ok_shares), r'\(3,\)|K|shape'),
        ('marginals 3 x 3', (ok_support, np.full((3, 3),
                                                 .5)), r'\(3,\)|K|shape'),
        ('string support', (np.array(['a'] * 3), ok_shares), r'number'),
    ]
    for name, (sup, mar), match in bad_supports:
        audit.api(
            fam,
            f'Prior({name})',
            lambda s=sup, m=mar: Prior(good, K3, s, m),
            match=match)
    audit.api(
        fam,
        'Prior(support, marginals) valid',
        lambda: Prior(good, K3, ok_support, ok_shares),
        'accept',
        check=lambda p: p.has_support and same(p.support, ok_support) and same(
            p.marginals, ok_shares) or 'wrong support')
    audit.api(
        fam,
        'Prior(one number as support)',
        lambda: Prior(good, K3, 12, ok_shares),
        'accept',
        check=lambda p: same(p.support, np.full(3, 12.0)) or 'wrong')


def _prior_reorder_tries(audit, fam, good, named, perm, idx, ok_support):
    """reorder permutes by name and refuses the names that do not match."""
    from mmcalidet.priors import Prior
    audit.api(
        fam,
        'reorder(a permutation)',
        lambda: named.reorder(perm),
        'accept',
        check=lambda p: same(p.matrix, good[np.ix_(idx, idx)]) and same(
            p.support, ok_support[idx]) and p.classes == tuple(perm) or
        'wrong permutation')
    audit.api(
        fam,
        'reorder(names up to case and _)',
        lambda: Prior(good, ['traffic light', 'dog', 'cat']).reorder(
            ['Cat', 'traffic_light', 'Dog']),
        'accept',
        check=lambda p: same(p.matrix[0, 1], good[2, 0]) or 'wrong')
    for name, names, match in (
        ('an unknown name', ['cat', 'dog', 'cow'], 'cow'),
        ('a duplicate', ['cat', 'cat', 'dog'], r'cat|duplicate|twice'),
        ('a set', set(K3), 'ordered'),
        ('2 names', ['cat', 'dog'], r'K|2|person'),
        ('4 names', K3 + ['cow'], r'K|4|cow'),
    ):
        audit.api(
            fam,
            f'reorder({name})',
            lambda n=names: named.reorder(n),
            match=match)
    audit.api(
        fam,
        'reorder(a name two classes match up to case)',
        lambda: Prior(good, ['Cat', 'cat', 'dog']).reorder(
            ['CAT', 'dog', 'cAt']),
        match=r'CAT|cAt|ambiguous')
    audit.api(
        fam,
        'unnamed prior reorder(2 names)',
        lambda: Prior(good).reorder(['a', 'b']),
        match='K=3')


def _prior_file_tries(audit, fam, tmp, good):
    """Prior.load refuses the bad files; returns the written K=3 .npy."""
    from mmcalidet.priors import Prior

    def write(name, text, mode='w'):
        path = osp.join(tmp, name)
        with open(path, mode) as f:
            f.write(text)
        return path

    entry = dict(matrix=good.tolist(), classes=K3)
    files = _prior_broken_files(tmp, write, entry, good) + _prior_count_files(
        tmp, write, entry)
    npy3 = osp.join(tmp, 'k3.npy')
    np.save(npy3, good)
    np.save(osp.join(tmp, 'vec.npy'), np.ones(3))
    files.append(('a 1-D .npy', osp.join(tmp, 'vec.npy'), r'square|K x K'))
    files.append(('a corrupt .npy', write('bad.npy',
                                          'not npy'), r'npy|read|load|format'))
    for name, path, match in files:
        audit.api(
            fam,
            f'Prior.load({name})',
            lambda p=path: Prior.load(p),
            match=match)
    audit.api(
        fam,
        'Prior.load(K=3 .npy, num_classes=4)',
        lambda: Prior.load(npy3, num_classes=4),
        match=r'K=3|4')
    audit.api(
        fam,
        'Prior.load(names, classes with an unknown one)',
        lambda: Prior.load(entry, classes=['cat', 'dog', 'cow']),
        match='cow')

    return npy3


def _prior_broken_files(tmp, write, entry, good):
    """(name, path, match) of the files of bad JSON, matrix or names."""
    return [
        ('a missing file', osp.join(tmp, 'missing.json'), r'not found|no '
         r'such|missing'),
        ('an empty file', write('empty.json', ''), r'empty|json'),
        ('corrupt JSON', write('corrupt.json',
                               '{"matrix": [[1, 0'), r'json|parse|read'),
        ('a JSON list', write('list.json', '[1, 2]'), r'dict|object|matrix'),
        ('a JSON string', write('str.json', '"x"'), r'dict|object|matrix'),
        ('no matrix key', write('nomat.json',
                                json.dumps(dict(classes=K3))), 'matrix'),
        ('NaN literal',
         write('nan.json',
               json.dumps(dict(entry, matrix=with_nan(good).tolist()))),
         r'non-finite|nan'),
        ('string entries',
         write('strs.json',
               json.dumps(dict(entry, matrix=[['a'] * 3] * 3))), r'number'),
        ('classes of K=2',
         write('k2.json', json.dumps(dict(entry,
                                          classes=K3[:2]))), r'2 class names'),
        ('duplicated classes',
         write('dup.json',
               json.dumps(dict(entry, classes=['cat', 'cat',
                                               'dog']))), r'duplicate|twice'),
    ]


def _prior_count_files(tmp, write, entry):
    """(name, path, match) of the files of bad counts, formats or names."""
    return [
        ('images_per_class of an unknown class',
         write(
             'ipc.json',
             json.dumps(
                 dict(
                     entry,
                     num_images=10,
                     images_per_class=dict(cat=1, dog=1, person=1,
                                           cow=3)))), r'cow|unknown'),
        ('images_per_class over num_images',
         write(
             'over.json',
             json.dumps(
                 dict(
                     entry,
                     num_images=2,
                     images_per_class=dict(cat=5, dog=1, person=1)))),
         r'more|exceed|num_images|\[0, 1\]'),
        ('negative num_images',
         write(
             'neg.json',
             json.dumps(
                 dict(
                     entry,
                     num_images=-3,
                     images_per_class=dict(cat=0, dog=0, person=0)))),
         r'num_images|>= 0|negative'),
        ('num_images "ten"',
         write(
             'ten.json',
             json.dumps(
                 dict(
                     entry,
                     num_images='ten',
                     images_per_class=dict(cat=1, dog=1, person=1)))),
         r'num_images|number|integer'),
        ('binary junk .json', write('junk.json', b'\x00\xff\x10',
                                    'wb'), r'json|read|utf|decode'),
        ('a .txt file', write('p.txt', 'hello'), r'json|npy|format|\.txt'),
        ('a folder', tmp, r'folder|directory|not a (regular )?file'),
        ('unknown shipped name', 'coco2099_train', r'coco2099|not found|'
         r'unknown'),
    ]


def _prior_valid_file_tries(audit, fam, tmp, good, named, perm, idx,
                            ok_support, ok_shares, npy3):
    """The valid files: round trips checked against the written values."""
    from mmcalidet.priors import Prior
    saved = osp.join(tmp, 'saved.json')
    audit.api(
        fam,
        'save and load with a support',
        lambda: Prior.load(named.save(saved)),
        'accept',
        check=lambda p: same(p.matrix, good, 1e-9) and p.classes == tuple(
            K3) and same(p.support, ok_support) and same(
                p.marginals, ok_shares) or 'wrong round trip')
    audit.api(
        fam,
        'load with classes= (reorder by name)',
        lambda: Prior.load(saved, classes=perm),
        'accept',
        check=lambda p: same(p.matrix, good[np.ix_(idx, idx)], 1e-9) or
        'wrong order')
    audit.api(
        fam,
        '.npy round trip',
        lambda: Prior.load(npy3),
        'accept',
        check=lambda p: same(p.matrix, good) or 'wrong')
    audit.api(
        fam,
        'shipped coco2017_train',
        lambda: Prior.load('coco2017_train'),
        'accept',
        check=lambda p: p.num_classes == 80 and same(np.diag(p.matrix), 1) and
        p.has_support or 'wrong')
    for name, target, match in (
        ('/proc/x.json', '/proc/mmcalidet-x.json', r'/proc|cannot|write'),
        ('a folder', tmp, r'folder|directory'),
        ('a file as folder', osp.join(saved, 'x.json'), r'cannot|not a '
         r'folder|write'),
    ):
        audit.api(
            fam,
            f'save to {name}',
            lambda t=target: named.save(t),
            match=match,
            folder=tmp)
    audit.api(
        fam,
        'save an unnamed prior as JSON',
        lambda: Prior(good).save(osp.join(tmp, 'unnamed.json')),
        match='class names',
        folder=tmp)
    for decimals, match in ((-1, 'decimals'), (1.5, 'decimals'), ('2',
                                                                  'decimals')):
        audit.api(
            fam,
            f'save(decimals={decimals!r})',
            lambda d=decimals: named.save(
                osp.join(tmp, 'dec.json'), decimals=d),
            match=match,
            folder=tmp)


# --- the post-hoc corrections -------------------------------------------


def corrections_family(audit, tmp):
    fam = 'corrections'
    ref = random_prior(1, 3)
    freq = [0.1, 0.2, 0.3]
    _correction_e_ref_tries(audit, fam, ref, freq)
    _correction_argument_tries(audit, fam, ref, freq)
    _correction_call_tries(audit, fam, ref, freq)


def _correction_e_ref_tries(audit, fam, ref, freq):
    """The corrections refuse the E_ref that are not a prior."""
    from mmcalidet.evaluation.baselines import (CooccurrenceRescoring,
                                                PriorReweighting,
                                                build_correction)
    bad_refs = [
        ('NaN E_ref', with_nan(ref), 'non-finite'),
        ('inf E_ref', with_nan(ref, (1, 2), INF), 'non-finite'),
        ('E_ref 1.5', np.full((3, 3), 1.5), r'\[0, 1\]'),
        ('E_ref -0.2', with_nan(ref, (0, 2), -0.2), r'\[0, 1\]'),
        ('E_ref 3 x 4', np.ones((3, 4)), 'square'),
        ('E_ref 1-D', np.ones(3), 'square'),
        ('E_ref strings', np.full((3, 3), 'x'), 'number'),
        ('E_ref None', None, r'prior|None|array|matrix'),
    ]
    for name, bad, match in bad_refs:
        audit.api(
            fam,
            f'PriorReweighting({name})',
            lambda b=bad: PriorReweighting(b, freq),
            match=match)
        audit.api(
            fam,
            f'CooccurrenceRescoring({name})',
            lambda b=bad: CooccurrenceRescoring(b),
            match=match)
        audit.api(
            fam,
            f"build_correction('cooccurrence', {name})",
            lambda b=bad: build_correction('cooccurrence', b),
            match=match)


def _correction_argument_tries(audit, fam, ref, freq):
    """The corrections refuse bad class frequencies, names and options."""
    from mmcalidet.evaluation.baselines import (CooccurrenceRescoring,
                                                PriorReweighting,
                                                build_correction)
    for name, bad, match in (
        ('NaN', [NAN, .2, .3], 'non-finite'),
        ('0', [0., .2, .3], r'\(0, 1\)'),
        ('1', [1., .2, .3], r'\(0, 1\)'),
        ('1.5', [1.5, .2, .3], r'\(0, 1\)'),
        ('negative', [-.1, .2, .3], r'\(0, 1\)'),
        ('K=2', [.1, .2], r'\(3,\)'),
        ('2-D', [[.1, .2, .3]], r'\(3,\)'),
        ('None', None, r'class_freq|class frequencies'),
        ('strings', ['a', 'b', 'c'], r'class_freq|number'),
    ):
        audit.api(
            fam,
            f'PriorReweighting(class_freq {name})',
            lambda b=bad: PriorReweighting(ref, b),
            match=match)
        audit.api(
            fam,
            f"build_correction('reweight', class_freq {name})",
            lambda b=bad: build_correction(
                'reweight', ref, None
                if b is None else np.asarray(b, dtype=object)
                if isinstance(b[0], str) else np.asarray(b)),
            match=match)
    audit.api(
        fam,
        "build_correction('bogus')",
        lambda: build_correction('bogus', ref),
        match='bogus')
    for name, kwargs, match in (('beta NaN', dict(beta=NAN),
                                 'beta'), ('eps 0', dict(eps=0), 'eps'),
                                ('eps 0.9', dict(eps=0.9), 'eps')):
        audit.api(
            fam,
            f'CooccurrenceRescoring({name})',
            lambda k=kwargs: CooccurrenceRescoring(ref, **k),
            match=match)
    audit.api(
        fam,
        'PriorReweighting(eps NaN)',
        lambda: PriorReweighting(ref, freq, eps=NAN),
        match='eps')


def _correction_call_tries(audit, fam, ref, freq):
    """The corrections refuse bad logits and priors, move as they should."""
    from mmcalidet.evaluation.baselines import (CooccurrenceRescoring,
                                                PriorReweighting)
    from mmcalidet.priors import Prior, flat_prior
    logits = torch.randn(2, 5, 3, generator=torch.Generator().manual_seed(0))
    corrs = dict(
        reweight=PriorReweighting(ref, freq),
        cooccurrence=CooccurrenceRescoring(ref))
    for cname, corr in corrs.items():
        for name, priors, match in (
            ('K=4 prior', flat_prior(4), r'K=3'),
            ('NaN prior', with_nan(ref), 'non-finite'),
            ('prior 1.5', np.full((3, 3), 1.5), r'\[0, 1\]'),
            ('stack of 3 for batch 2', np.stack([ref] * 3), r'2|3|batch'),
            ('1-D prior', np.ones(3), r'shape|K'),
        ):
            audit.api(
                fam,
                f'{cname}(logits, {name})',
                lambda c=corr, p=priors: c(logits, p),
                match=match)
        audit.api(
            fam,
            f'{cname}(logits of K=4, E_ref)',
            lambda c=corr: c(torch.randn(2, 5, 4), ref),
            match=r'K|4|3|shape')
        audit.api(
            fam,
            f'{cname}(logits, E_ref) is the identity',
            lambda c=corr: c(logits, ref),
            'accept',
            check=lambda out: same(out, logits) or 'wrong: moved at E_ref')
        other = random_prior(5, 3)
        audit.api(
            fam,
            f'{cname}: a stack equals per-image calls',
            lambda c=corr:
            (c(logits, np.stack([ref, other])),
             torch.cat([c(logits[:1], ref),
                        c(logits[1:], other)])),
            'accept',
            check=lambda r: same(*r) or 'wrong: the stack differs')
        audit.api(
            fam,
            f'{cname}: a Prior equals its matrix',
            lambda c=corr: (c(logits, Prior(other, K3)), c(logits, other)),
            'accept',
            check=lambda r: same(*r) or 'wrong')
        audit.api(
            fam,
            f'{cname}: another prior moves the scores',
            lambda c=corr: c(logits, other),
            'accept',
            check=lambda out: bool(torch.isfinite(out).all()) and not same(
                out, logits) or 'wrong: nothing moved')


# --- the compiled kernel's num_threads (in a child: a crash is a signal) --


def _in_child(fn, timeout=60):
    """``fn()`` in a forked child: ('ok', result repr) / ('raised', type,
    message) / ('crash', signal) / ('hang', None)."""
    import pickle
    import time
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        os.close(read)
        try:
            out = ('ok', fn())
        except BaseException as exc:  # noqa: B902
            out = ('raised', type(exc).__name__, str(exc))
        with os.fdopen(write, 'wb') as f:
            pickle.dump(out, f)
        os._exit(0)
    os.close(write)
    start = time.time()
    while time.time() - start < timeout:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.02)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        os.close(read)
        return ('hang', None)
    with os.fdopen(read, 'rb') as f:
        data = f.read()
    if os.WIFSIGNALED(status):
        return ('crash', os.WTERMSIG(status))
    return pickle.loads(data) if data else ('crash', status)


def kernel_family(audit, tmp):
    from mmcalidet.models.layers import cpu_deform_attn
    fam = 'kernel'
    kernel = cpu_deform_attn.KERNEL
    bs, heads, dims, queries, levels, points = 1, 2, 4, 3, 1, 2
    rng = np.random.default_rng(0)
    value = rng.random((bs, 4, heads, dims), dtype=np.float32)
    shapes = np.array([[2, 2]], np.int64)
    starts = np.array([0], np.int64)
    locations = rng.random((bs, queries, heads, levels, points, 2),
                           dtype=np.float32)
    attention = np.full((bs, queries, heads, levels, points), 0.5, np.float32)

    def forward(threads):
        output = np.zeros((bs, queries, heads, dims), np.float32)
        kernel.deform_attn_forward(value, shapes, starts, locations, attention,
                                   output, threads)
        return output

    def backward(threads):
        grads = (np.zeros_like(value), np.zeros_like(locations),
                 np.zeros_like(attention))
        kernel.deform_attn_backward(
            value, shapes, starts, locations, attention,
            np.ones((bs, queries, heads, dims), np.float32), *grads, threads)
        return grads[0]

    reference = _in_child(lambda: forward(1))
    back = _in_child(lambda: backward(1))
    for threads in (0, -5, -1, 10**6, 1025, 2**31, 1.5, '2', None, NAN):
        for name, fn, ref in (('forward', forward, reference),
                              ('backward', backward, back)):
            outcome = _in_child(lambda f=fn, t=threads: f(t))
            if outcome[0] == 'ok':  # taken: right only if it equals 1 thread
                _kernel_record(audit, fam, f'{name}(num_threads='
                               f'{threads!r}) runs', outcome, ref)
                continue
            _kernel_record(audit, fam, f'{name}(num_threads={threads!r})',
                           outcome, None)
    for threads in (1, 2, 4):
        _kernel_record(audit, fam, f'forward(num_threads={threads})',
                       _in_child(lambda t=threads: forward(t)), reference)
    _kernel_record(audit, fam, 'backward(num_threads=2)',
                   _in_child(lambda: backward(2)), back)
    bad_value = value.astype(np.float64)
    _kernel_record(
        audit, fam, 'forward(float64 value)',
        _in_child(lambda: kernel.deform_attn_forward(
            bad_value, shapes, starts, locations, attention,
            np.zeros((bs, queries, heads, dims), np.float32), 1)), None)
    _kernel_record(
        audit, fam, 'forward(level shapes of 2 levels)',
        _in_child(lambda: kernel.deform_attn_forward(
            value, np.array([[2, 2], [1, 1]], np.int64), starts, locations,
            attention, np.zeros((bs, queries, heads, dims), np.float32), 1)),
        None)


def _kernel_record(audit, fam, name, outcome, reference):
    kind = outcome[0]
    if kind == 'crash':
        audit.record(fam, name, 'refuse' if reference is None else 'accept',
                     'crash', f'the process died (signal {outcome[1]})', 0)
    elif kind == 'hang':
        audit.record(fam, name, 'refuse', 'hang', 'ran past 60 s', 0)
    elif kind == 'raised':
        clean = outcome[1] in ('ValueError', 'TypeError')
        if reference is not None:
            result = 'refused valid'
        else:
            result = 'clean refusal' if clean and '\n' not in outcome[2] \
                else 'traceback'
        audit.record(fam, name, 'refuse' if reference is None else 'accept',
                     result, f'{outcome[1]}: {outcome[2]}', 0)
    elif reference is None:
        audit.record(fam, name, 'refuse', 'silently wrong',
                     'wrong: the kernel ran with it', 0)
    else:
        ok = reference[0] == 'ok' and same(outcome[1], reference[1], 1e-6)
        audit.record(
            fam, name, 'accept', 'correct' if ok else 'silently wrong',
            'equals one thread' if ok else 'wrong: differs from one thread', 0)


# --- the online calibrator and fold_prior --------------------------------


def online_family(audit, tmp):
    from torch import nn

    from mmcalidet.calibration import OnlineSelfCalibrator
    from mmcalidet.deploy import fold_prior
    from mmcalidet.priors import flat_prior
    fam = 'online'
    k = 3
    make = lambda: OnlineSelfCalibrator(init_prior=flat_prior(k))  # noqa
    _online_update_tries(audit, fam, make)
    _online_state_tries(audit, fam, make, k)

    def round_trip():
        cal = make()
        cal.update([dict(scores=[0.9, 0.8], labels=[1, 2])])
        other = make()
        other.load_state_dict(cal.state_dict())
        return cal, other

    audit.api(
        fam,
        'state_dict round trip',
        round_trip,
        'accept',
        check=lambda r: r[1].num_images == 1 and same(r[0].counts, r[1].counts)
        or 'wrong')
    audit.api(
        fam,
        'fold_prior(nn.Linear)',
        lambda: fold_prior(nn.Linear(2, 2), flat_prior(k)),
        match='calibratable')


def _online_update_tries(audit, fam, make):
    """update refuses the bad predictions, counts the odd valid ones."""
    for name, preds, match in (
        ("['junk']", ['junk'], 'scores'),
        ('[None]', [None], r'prediction 0|scores'),
        ('2 scores, 1 label', [dict(scores=[.5, .6],
                                    labels=[1])], '2 scores and 1 labels'),
        ('label 7 of K=3', [dict(scores=[.9], labels=[7])], r'label|7'),
        ('label -1', [dict(scores=[.9], labels=[-1])], r'label|-1'),
        ('score 1.5', [dict(scores=[1.5], labels=[1])], r'score|\[0, 1\]'),
        ('float label 1.5', [dict(scores=[.9],
                                  labels=[1.5])], r'label|integer'),
    ):
        audit.api(
            fam,
            f'update({name})',
            lambda p=preds: make().update(p),
            match=match)
    for name, preds, count in (
        ('a NaN score counts as absent (documented)',
         [dict(scores=[NAN], labels=[1])], 0),
        ('a single dict is one image', dict(scores=[.9], labels=[1]), 1),
    ):

        def observed(p=preds):
            cal = make()
            cal.update(p)
            return cal

        audit.api(
            fam,
            f'update: {name}',
            observed,
            'accept',
            check=lambda c, n=count: c.num_images == 1 and same(
                c.counts.sum(), n) or 'wrong counts')


def _online_state_tries(audit, fam, make, k):
    """load_state_dict and the constructor refuse bad states, options."""
    from mmcalidet.calibration import OnlineSelfCalibrator
    from mmcalidet.priors import flat_prior
    state = make().state_dict()
    for name, bad, match in (
        ("{'bogus': 1}", {
            'bogus': 1
        }, 'bogus'),
        ('counts of K=4', dict(state, counts=np.ones(4)), r'counts'),
        ('NaN score_sum', dict(state, score_sum=np.full(k,
                                                        NAN)), 'non-finite'),
        ('num_images -1', dict(state, num_images=-1), 'num_images'),
        ('a list', [1, 2], r'dict|mapping|state'),
    ):
        audit.api(
            fam,
            f'load_state_dict({name})',
            lambda b=bad: make().load_state_dict(b),
            match=match)
    for name, kwargs, match in (
        ('eta NaN', dict(eta=NAN), 'eta'),
        ('momentum 1.5', dict(momentum=1.5), 'momentum'),
        ('score_thr -1', dict(score_thr=-1), 'score_thr'),
        ('update_interval 0', dict(update_interval=0), 'update_interval'),
        ('init_prior NaN', dict(init_prior=with_nan(flat_prior(k))),
         'non-finite'),
        ('no prior, no model', dict(num_classes=None), r'init_prior|model'),
    ):
        args = dict(dict(init_prior=flat_prior(k)), **kwargs)
        if 'num_classes' in kwargs:
            args = {}
        audit.api(
            fam,
            f'OnlineSelfCalibrator({name})',
            lambda a=args: OnlineSelfCalibrator(**a),
            match=match)


# --- the model families (set_prior, inference, checkpoints, ONNX) -------


@lru_cache(maxsize=None)
def prior_moving_model(config: str):
    """A tiny CaliDet of random weights whose scores move with the prior,
    off saturation: route comparisons then compare something (the DETR's
    classifier shrunk and rho lowered, as the random V' is large; the
    FCOS as tests/test_deploy/test_onnx_fcos.py makes it)."""
    from mmcalidet.deploy.export_meta import model_head_kind
    from testing import build_detector
    model = build_detector(config, seed=0).eval()
    head = model.bbox_head
    decoder = hasattr(head, 'num_pred_layer')  # a DETR's head
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        if not decoder:
            for p in head.califormer.parameters():
                p.add_(torch.randn(p.shape, generator=gen) * 0.1)
        for layer in model_head_kind(model).cls_layers(head).values():
            layer.weight.mul_(0.01 if decoder else 1.0)
            layer.bias.fill_(-2.0 if decoder else -3.0)
    head.rho = 0.05 if decoder else 5.0
    model._cali_cache = None
    return model


def scores_of(result):
    return result.pred_instances.scores.numpy()


def same_dets(a, b, atol=1e-4):
    """Two lists of DetDataSamples give the same detections."""
    a = a if isinstance(a, list) else [a]
    b = b if isinstance(b, list) else [b]
    for x, y in zip(a, b):
        px, py = x.pred_instances, y.pred_instances
        if len(px.scores) != len(py.scores):
            return f'wrong: {len(px.scores)} vs {len(py.scores)} detections'
        if not (same(px.scores, py.scores, atol)
                and same(px.bboxes, py.bboxes, 1e-2) and
                (px.labels == py.labels).all()):
            return 'wrong: the detections differ'
    return f'same detections ({sum(len(x.pred_instances.scores) for x in a)})'
