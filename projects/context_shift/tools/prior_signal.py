# Copyright (c) mmcalidet contributors. All rights reserved.
"""How much label information the training priors carry in fractional
entries: the mechanism behind the site-prior failures (issue #49).

For a folder made by ``make_data.py``, draw the training priors of each
mode the EdgeSampler uses, from the train split's labels:

- ``E_x``: one image's statistics;
- ``E_b(n)``: a random batch of n images, n = 1, 2, 4, 8, 32, 128, 256;
- ``E_t + noise``: the training prior with the sampler's Gaussian noise
  (clipped to [0, 1], diagonal 1);
- ``E_sim``: a simulated site's statistics (a tilt of the class mixture,
  :class:`SimulatedSites`), and the folder's val sites (``E_<site>``).

and report per mode, over the off-diagonal entries:

- *fractional*: the share that is not exactly 0, 0.5 or 1;
- *informative*: of the fractional entries, the share whose label-derived
  value (the statistics before any noise) differs from the label-free
  prior E_t by more than ``--delta``. The noise is unrelated to the labels,
  so E_t + noise is fractional but carries none; an absent class's column
  is exactly 0.5 and never fractional;
- *predictive*: whether those entries say something about the images the
  prior calibrates in training (each mode's draw paired with its images:
  E_x its image, E_b(n) its batch, E_t + noise a random batch of 4, a
  tilted site (15 % of the images) a random batch as the ``sim_site`` mode
  gives it and 4 of its own images as a site batch, a pair-tilted site 4
  of its own images, a val site its own images): the mean log-likelihood
  gain over E_t, in millinats, of whether class i is in an image that shows
  class j, read from the fractional entries E[i, j] (probabilities
  clipped to [0.02, 0.98]). Relation reading can only be learnt from a
  mode where it is above 0.

E_x and E_b are measured without the sampler's noise: the question is what
the labels make of them. Example::

    python projects/context_shift/tools/prior_signal.py data/context_shift \\
        [--plot prior_signal.png]
"""
import argparse
import os.path as osp
import sys
from typing import Dict, List, Optional, Sequence

import numpy as np

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.dirname(
    osp.abspath(__file__)))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from mmcalidet.priors import batch_prior, load_prior, sample_prior  # noqa
from mmcalidet.priors.label_io import read_coco_labels  # noqa
from mmcalidet.utils.validation import check_float, check_int  # noqa

#: the batch sizes of the E_b rows
BATCH_SIZES = (1, 2, 4, 8, 32, 128, 256)
#: the values a label-only entry takes without a fraction
EXACT = (0.0, 0.5, 1.0)


def fractional(values: np.ndarray, atol: float = 1e-9) -> np.ndarray:
    """Whether each value is other than exactly 0, 0.5 or 1.

    Args:
        values (np.ndarray): prior entries.
        atol (float): tolerance of "exactly".

    Returns:
        np.ndarray: bool, the shape of ``values``.
    """
    values = np.asarray(values, dtype=np.float64)
    return np.all([np.abs(values - v) > atol for v in EXACT], axis=0)


def measure(noised: np.ndarray, labelled: np.ndarray, e_t: np.ndarray,
            delta: float) -> Dict[str, float]:
    """The shares of one mode.

    Args:
        noised (np.ndarray): (R, K, K) the priors as the calibrator sees
            them.
        labelled (np.ndarray): (R, K, K) their label-derived part (the same
            without noise).
        e_t (np.ndarray): (K, K) the label-free reference.
        delta (float): how far from E_t an entry must be to count as
            carrying label information.

    Returns:
        dict: ``priors`` (R), ``fractional`` (share of off-diagonal entries),
        ``informative`` (share of the fractional ones; NaN without any) and
        ``mae`` (mean |labelled - E_t| off the diagonal).
    """
    noised = np.asarray(noised, dtype=np.float64)
    labelled = np.asarray(labelled, dtype=np.float64)
    if noised.shape != labelled.shape or noised.ndim != 3:
        raise ValueError(f'priors must be (R, K, K) of one shape, got '
                         f'{noised.shape} and {labelled.shape}')
    off = ~np.eye(noised.shape[-1], dtype=bool)
    frac = fractional(noised[:, off])
    info = frac & (np.abs(labelled - e_t)[:, off] > delta)
    return dict(
        priors=len(noised),
        fractional=float(frac.mean()),
        informative=float(info.sum() / frac.sum()) if frac.any() else
        float('nan'),
        mae=float(np.abs(labelled - e_t)[:, off].mean()))


def predictive_gain(priors: np.ndarray,
                    images: Sequence[Sequence[np.ndarray]],
                    e_t: np.ndarray,
                    clip: float = 0.02) -> Dict[str, float]:
    """How much the fractional entries of priors tell about the images
    they calibrate, beyond E_t.

    For each prior and each of its images, every entry ``E[i, j]`` with
    class j in the image, i != j, and ``E[i, j]`` fractional predicts
    whether class i is in the image too; the gain is ``log P_E(y_i) - log
    P_Et(y_i)`` with both probabilities clipped to ``[clip, 1 - clip]``.

    Args:
        priors (np.ndarray): (R, K, K) the priors as the calibrator sees
            them.
        images (Sequence[Sequence[np.ndarray]]): per prior, the class
            indices of each image it calibrates.
        e_t (np.ndarray): (K, K) the label-free reference.
        clip (float): probability clipping.

    Returns:
        dict: ``predictive`` (mean gain per counted entry, in millinats;
        NaN without any) and ``counted`` (counted entries per image).
    """
    clip = check_float('clip', clip, low=0, high=0.5, high_open=True)
    priors = np.asarray(priors, dtype=np.float64)
    if len(priors) != len(images):
        raise ValueError(f'{len(priors)} priors but images for '
                         f'{len(images)}')
    k = priors.shape[-1]
    off = ~np.eye(k, dtype=bool)
    ref = np.clip(e_t, clip, 1 - clip)
    total, counted, num_images = 0.0, 0, 0
    for prior, group in zip(priors, images):
        mask = fractional(prior) & off
        prob = np.clip(prior, clip, 1 - clip)
        for labels in group:
            num_images += 1
            present = np.zeros(k, dtype=bool)
            present[np.asarray(labels, dtype=np.int64)] = True
            use = mask & present[None, :]  # rows i, columns j in the image
            if not use.any():
                continue
            y = np.broadcast_to(present[:, None], (k, k))
            gain = np.where(y, np.log(prob) - np.log(ref),
                            np.log1p(-prob) - np.log1p(-ref))
            total += float(gain[use].sum())
            counted += int(use.sum())
    return dict(
        predictive=1000 * total / counted if counted else float('nan'),
        counted=counted / max(num_images, 1))


def add_noise(priors: np.ndarray, noise_std: float,
              rng: np.random.Generator) -> np.ndarray:
    """The EdgeSampler's noise: N(0, sigma^2) per entry, clipped to [0, 1],
    diagonal 1."""
    out = np.clip(priors + rng.normal(0.0, noise_std, priors.shape), 0, 1)
    diag = np.arange(priors.shape[-1])
    out[:, diag, diag] = 1.0
    return out


def prior_signal(label_lists: Sequence[np.ndarray],
                 num_classes: int,
                 site_priors: Optional[Dict[str, np.ndarray]] = None,
                 site_images: Optional[Dict[str, Sequence[np.ndarray]]] = None,
                 draws: int = 64,
                 noise_std: float = 0.16,
                 delta: float = 0.05,
                 seed: int = 0) -> List[Dict]:
    """Measure every mode (see the module docstring).

    Args:
        label_lists (Sequence[np.ndarray]): class indices per training
            image.
        num_classes (int): K.
        site_priors (dict, optional): name -> (K, K) site statistics to
            measure as they are (e.g. the folder's val sites).
        site_images (dict, optional): name -> the class indices of each of
            that site's images (its *predictive* pairing).
        draws (int): priors drawn per mode.
        noise_std (float): sigma of the sampler's noise on E_t.
        delta (float): see :func:`measure`.
        seed (int): seed of the draws.

    Returns:
        list[dict]: one row per mode: ``mode`` and :func:`measure`'s keys.
    """
    num = len(label_lists)
    if not num:
        raise ValueError('prior_signal needs training images, got none')
    draws = check_int('draws', draws, low=1)
    noise_std = check_float('noise_std', noise_std, low=0)
    delta = check_float('delta', delta, low=0)
    rng = np.random.default_rng(seed)
    e_t = batch_prior(num_classes, label_lists)
    rows = []

    def add(mode, noised, images, labelled=None):
        labelled = noised if labelled is None else labelled
        rows.append(
            dict(
                mode=mode,
                **measure(noised, labelled, e_t, delta),
                **predictive_gain(noised, images, e_t)))

    def batch(size=4):
        return [
            label_lists[k]
            for k in rng.choice(num, size=min(size, num), replace=False)
        ]

    picked = rng.integers(num, size=draws)
    add('E_x',
        np.stack([sample_prior(num_classes, label_lists[k])
                  for k in picked]), [[label_lists[k]] for k in picked])
    for n in BATCH_SIZES:
        if n > num:
            continue
        batches = [batch(n) for _ in range(draws)]
        add(f'E_b({n})',
            np.stack([batch_prior(num_classes, b) for b in batches]),
            batches)
    plain = np.repeat(e_t[None], draws, axis=0)
    add('E_t + noise', add_noise(plain, noise_std, rng),
        [batch() for _ in range(draws)], plain)
    from projects.context_shift.context_shift.simulated_sites import \
        SimulatedSites
    sites = SimulatedSites(
        label_lists, num_classes, kinds=('tilt', 'pairs'), min_images=1,
        tilt_fraction=0.15, pair_strength=16.0)
    tilted = [('tilt', int(s)) for s in rng.integers(2**31, size=draws)]
    add('E_sim (tilted site), a random batch',
        np.stack([sites.statistics(key) for key in tilted]),
        [batch() for _ in range(draws)])
    add('E_sim (tilted site), its own batch',
        np.stack([sites.statistics(key) for key in tilted]), [[
            label_lists[k]
            for k in rng.choice(sites.members(key), size=4, replace=False)
        ] for key in tilted])
    if len(sites.seen_pairs):
        paired = [('pairs', int(s)) for s in rng.integers(2**31, size=draws)]
        add('E_pairs (pair-tilted site), its own batch',
            np.stack([sites.statistics(key) for key in paired]), [[
                label_lists[k] for k in rng.choice(
                    sites.members(key), size=4, replace=False)
            ] for key in paired])
    for name, prior in (site_priors or {}).items():
        own = list((site_images or {}).get(name, []))
        add(name, np.asarray(prior, dtype=np.float64)[None], [own])
    return rows


def markdown(rows: List[Dict]) -> str:
    """The rows as a Markdown table."""
    lines = [
        '| mode | priors | fractional | informative (of fractional) | '
        'mean abs(E - E_t) | predictive (millinats per entry) | '
        'entries per image |', '|---|---|---|---|---|---|---|'
    ]
    for r in rows:
        info = '-' if np.isnan(r['informative']) else \
            f'{r["informative"]:.0%}'
        pred = '-' if np.isnan(r['predictive']) else \
            f'{r["predictive"]:+.1f}'
        lines.append(f'| {r["mode"]} | {r["priors"]} | '
                     f'{r["fractional"]:.0%} | {info} | {r["mae"]:.3f} | '
                     f'{pred} | {r["counted"]:.1f} |')
    return '\n'.join(lines)


def plot(rows: List[Dict], path: str) -> None:
    """Bar chart of the two shares per mode (matplotlib, Agg)."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    x = np.arange(len(rows))
    fig, ax = plt.subplots(figsize=(max(6, 0.8 * len(rows)), 3.5))
    ax.bar(x - 0.2, [r['fractional'] for r in rows], 0.4,
           label='fractional (of off-diagonal)')
    ax.bar(x + 0.2, [np.nan_to_num(r['informative']) for r in rows], 0.4,
           label='informative (of fractional)')
    ax.set_xticks(x)
    ax.set_xticklabels([r['mode'] for r in rows], rotation=45, ha='right')
    ax.set_ylim(0, 1)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('data', help='a folder made by make_data.py')
    parser.add_argument('--draws', type=int, default=64,
                        help='priors drawn per mode')
    parser.add_argument('--noise-std', type=float, default=0.16,
                        help="the EdgeSampler's noise sigma")
    parser.add_argument('--delta', type=float, default=0.05,
                        help='|E - E_t| above which a fractional entry '
                        'carries label information')
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--no-sites', action='store_true',
                        help="leave out the folder's val site priors")
    parser.add_argument('--plot', help='write a PNG bar chart here')
    return parser.parse_args(argv)


def main(argv=None) -> List[Dict]:
    args = parse_args(argv)
    train = osp.join(args.data, 'annotations', 'instances_train.json')
    if not osp.isfile(train):
        raise ValueError(f'{args.data} has no annotations/'
                         'instances_train.json (make it with make_data.py)')
    labels = read_coco_labels(train)
    label_lists = labels.label_lists()
    num_classes = len(labels.classes)
    site_priors, site_images = {}, {}
    if not args.no_sites:
        import json
        meta_path = osp.join(args.data, 'meta.json')
        sites = []
        if osp.isfile(meta_path):
            with open(meta_path) as f:
                sites = list(json.load(f).get('epsilon', {}))
        for site in sites:
            path = osp.join(args.data, 'priors', f'E_{site}.json')
            if site != 'all_sites' and osp.isfile(path):
                name = f'E_{site} (val site)'
                site_priors[name] = load_prior(path)
                ann = osp.join(args.data, 'annotations',
                               f'instances_val_{site}.json')
                if osp.isfile(ann):
                    site_images[name] = read_coco_labels(
                        ann, classes=labels.classes).label_lists()
    rows = prior_signal(label_lists, num_classes, site_priors, site_images,
                        draws=args.draws, noise_std=args.noise_std,
                        delta=args.delta, seed=args.seed)
    print(markdown(rows))
    if args.plot:
        plot(rows, args.plot)
        print(f'wrote {args.plot}')
    return rows


if __name__ == '__main__':
    main()
