# Copyright (c) mmcalidet contributors. All rights reserved.
"""Site-simulated training: a batch drawn from a simulated deployment site,
paired with that site's statistics as its prior.

A deployment site is a population whose class relations differ from the
training set's. The paper's edge sampling never shows the calibrator such a
population: its dense priors are E_t (the whole set) or E_b of a random
batch, which are both estimates of E_t. Here a share of the batches come
from a *simulated site*, a subpopulation of the training set defined by
its labels only:

- ``('with', c)``: the images that show class ``c``;
- ``('without', c)``: the images that do not;
- ``('tilt', seed)``: a random tilt of the class mixture, the images
  re-sampled with weight ``exp(sum of z_c over the image's classes)``,
  ``z ~ N(0, tilt_std^2)`` per class.

The batch's images all come from the site and each carries the site's
statistics E_site (over all its images) as ``site_prior``, so the prior
always describes the population the batch was drawn from. The
``SiteEdgeSampler`` gives E_site as one more mode beside the paper's E_x,
E_b and E_t (a batch of the whole set gets E_t in that mode: the whole set
is its population).

Three parts, composed in a config::

    train_dataloader = dict(
        dataset=dict(type='SiteSimulatedDataset', dataset=<the dataset>),
        batch_sampler=dict(type='SiteBatchSampler', site_prob=0.5))
    model = dict(data_preprocessor=dict(batch_augments=[
        dict(type='SiteEdgeSampler',
             mode_probs=dict(sample=1, batch=1, dataset=1, site=1))]))
"""
from typing import Dict, Iterator, List, Optional, Tuple, Union

import numpy as np
from mmdet.registry import DATA_SAMPLERS, DATASETS, MODELS
from mmengine.dist import get_dist_info
from torch.utils.data import BatchSampler, Dataset, Sampler

from mmcalidet.models.data_preprocessors import EdgeSampler
from mmcalidet.models.data_preprocessors.edge_modes import (MODES,
                                                            log_uniform_size)
from mmcalidet.priors import batch_prior
from mmcalidet.utils.validation import check_int
from projects.context_shift.context_shift.simulated_sites import (
    SITE_KINDS, SimulatedSites, SiteKey, dataset_label_lists)


@DATASETS.register_module()
class SiteSimulatedDataset(Dataset):
    """A dataset whose items may come from a simulated site.

    An ``int`` index is the wrapped dataset's item; a ``(index, site)``
    pair (what :class:`SiteBatchSampler` yields) is that item with the
    site's statistics as ``site_prior`` (K x K float32) and its key as
    ``site`` in the data sample's metainfo. A site is defined by its key,
    so every data-loading worker gives the same statistics.

    Args:
        dataset (Dataset | dict): the training set, or its config.
        num_classes (int, optional): K; default: the number of the
            dataset's ``classes``.
        site_support (tuple[int, int], optional): measure each site's
            prior on n of its images, n log-uniform in this range (see
            :meth:`site_statistics`); default: on all of them.
        **site_cfg: :class:`SimulatedSites` options (``kinds``,
            ``min_images``, ``tilt_std``, ``tilt_fraction``).
    """

    def __init__(self,
                 dataset: Union[Dataset, Dict],
                 num_classes: Optional[int] = None,
                 site_support: Optional[Tuple[int, int]] = None,
                 **site_cfg) -> None:
        self.dataset = DATASETS.build(dataset) if isinstance(dataset,
                                                             dict) else dataset
        if site_support is not None:
            if len(site_support) != 2:
                raise ValueError('SiteSimulatedDataset: site_support must be '
                                 f'(lo, hi), got {site_support}')
            lo = check_int('SiteSimulatedDataset: site_support[0]',
                           site_support[0], low=1)
            hi = check_int('SiteSimulatedDataset: site_support[1]',
                           site_support[1], low=lo)
            site_support = (lo, hi)
        self.site_support = site_support
        self._last_site: Optional[Tuple[SiteKey, Dict]] = None
        if num_classes is None:
            classes = self.metainfo.get('classes')
            if not classes:
                raise ValueError('SiteSimulatedDataset: give num_classes; '
                                 'the dataset names no classes')
            num_classes = len(classes)
        self.sites = SimulatedSites(
            dataset_label_lists(self.dataset), num_classes, **site_cfg)

    @property
    def metainfo(self) -> Dict:
        """The wrapped dataset's metainfo."""
        return dict(getattr(self.dataset, 'metainfo', {}) or {})

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, item: Union[int, Tuple[int, SiteKey]]) -> Dict:
        if isinstance(item, (tuple, list)):
            index, key = item
            data = self.dataset[int(index)]
            data['data_samples'].set_metainfo(self.site_metainfo(key))
            return data
        return self.dataset[item]

    def site_metainfo(self, key: SiteKey) -> Dict:
        """What a site's items carry: ``site_prior``, ``site`` (its key),
        ``site_size`` and ``site_shares`` (of the images the prior was
        measured on); kept for the last site asked, whose batch asks again
        for each of its items."""
        key = (str(key[0]), int(key[1]))
        if self._last_site is None or self._last_site[0] != key:
            prior, measured = self.site_statistics(key)
            self._last_site = (key,
                               dict(
                                   site_prior=prior,
                                   site=f'{key[0]} {key[1]}',
                                   site_size=len(measured),
                                   site_shares=self.sites.presence[measured]
                                   .mean(0)))
        return dict(self._last_site[1])

    def site_statistics(self, key: SiteKey) -> Tuple[np.ndarray, np.ndarray]:
        """A site's prior and the images it was measured on: all the
        site's images, or with ``site_support`` n of them (n log-uniform in
        that range, with replacement where the site is smaller), a function
        of the key.

        Args:
            key (tuple[str, int]): the site.

        Returns:
            tuple[np.ndarray, np.ndarray]: (K, K) float32 prior, the
            indices it was measured on.
        """
        members = self.sites.members(key)
        if self.site_support is None:
            return self.sites.statistics(key), members
        rng = np.random.default_rng(
            [SITE_KINDS.index(str(key[0])), int(key[1]), 7])
        num = log_uniform_size(rng, *self.site_support)
        chosen = np.sort(
            rng.choice(members, size=num, replace=len(members) < num))
        prior = batch_prior(self.sites.num_classes,
                            [self.sites.label_lists[i] for i in chosen])
        return prior.astype(np.float32), chosen


@DATA_SAMPLERS.register_module()
class SiteBatchSampler(BatchSampler):
    """Batches of the wrapped sampler, a share of them replaced by a batch
    of one simulated site.

    With probability ``site_prob`` a batch draws a site of the
    :class:`SiteSimulatedDataset` and ``batch_size`` of its images
    (without replacement, or with it when the site is smaller), else it is
    the next ``batch_size`` indices of ``sampler`` (mmengine's
    ``DefaultSampler`` or ``InfiniteSampler``, whose shuffling it keeps).

    Args:
        sampler (Sampler): the index sampler; its ``dataset`` must be a
            :class:`SiteSimulatedDataset`.
        batch_size (int): images per batch.
        drop_last (bool): drop the last short batch of a finite sampler.
        site_prob (float): the share of site batches.
        seed (int, optional): seed of the site draws; default: the
            sampler's ``seed`` (the run's, the same on every rank), each
            rank drawing its own sites from ``seed + rank``.
    """

    def __init__(self,
                 sampler: Sampler,
                 batch_size: int,
                 drop_last: bool = False,
                 site_prob: float = 0.5,
                 seed: Optional[int] = None) -> None:
        super().__init__(sampler, batch_size, drop_last)
        dataset = getattr(sampler, 'dataset', None)
        if not isinstance(dataset, SiteSimulatedDataset):
            raise TypeError(
                'SiteBatchSampler needs the dataset wrapped in '
                'SiteSimulatedDataset, got '
                f'{type(dataset).__name__ if dataset is not None else None}')
        if not 0 <= site_prob <= 1:
            raise ValueError(
                f'SiteBatchSampler: site_prob must be in [0, 1], got '
                f'{site_prob}')
        self.sites = dataset.sites
        self.site_prob = float(site_prob)
        if seed is None:
            seed = getattr(sampler, 'seed', 0) or 0
        rank, _ = get_dist_info()
        self.seed = int(seed) + rank
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Draw other sites in another epoch (mmengine calls it)."""
        self.epoch = int(epoch)
        if hasattr(self.sampler, 'set_epoch'):
            self.sampler.set_epoch(epoch)

    def site_batch(self, rng: np.random.Generator) -> List[Tuple]:
        """One batch of a site drawn from ``rng``."""
        key = self.sites.draw_key(rng)
        members = self.sites.members(key)
        chosen = rng.choice(
            members,
            size=self.batch_size,
            replace=len(members) < self.batch_size)
        return [(int(i), key) for i in chosen]

    def __iter__(self) -> Iterator[List]:
        rng = np.random.default_rng([self.seed, self.epoch])
        batch = []
        for index in self.sampler:
            batch.append(int(index))
            if len(batch) == self.batch_size:
                yield self.site_batch(rng) \
                    if rng.random() < self.site_prob else batch
                batch = []
        if batch and not self.drop_last:
            yield batch


@MODELS.register_module()
class SiteEdgeSampler(EdgeSampler):
    """The EdgeSampler with one more mode, ``'site'``: the statistics of
    the population the batch was drawn from, i.e. a site batch's
    ``site_prior`` (from :class:`SiteSimulatedDataset`) and E_t for a batch
    of the whole training set.

    Args:
        **kwargs: :class:`~mmcalidet.models.data_preprocessors.EdgeSampler`
            arguments; ``mode_probs`` may name ``'site'``. Only the
            ``'local'`` batch scope (each rank's batch is one site).
    """

    KNOWN_MODES = dict(
        MODES, site='E_site of the simulated site the batch comes from')
    NEED_PRIOR = ('dataset', 'site')

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        if self.batch_scope != 'local':
            raise ValueError('SiteEdgeSampler: only batch_scope="local" '
                             '(each rank draws its own site)')
        #: per sample of the batch: its ``site``, ``site_prior``,
        #: ``site_size`` and ``site_shares`` (``None`` outside a site)
        self._sites: List[Tuple] = []

    def forward(self, inputs, data_samples):
        """The EdgeSampler's, reading each sample's site, ``site_prior``
        and its support."""
        self._sites = [
            tuple(
                ds.metainfo.get(name)
                for name in ('site', 'site_prior', 'site_size', 'site_shares'))
            for ds in data_samples
        ]
        return super().forward(inputs, data_samples)

    def sample_support(self, mode, label_lists, noise_seed):
        """The EdgeSampler's, and for the ``'site'`` mode the site's size
        and class shares (the whole set's for a batch of the whole set)."""
        if mode != 'site':
            return super().sample_support(mode, label_lists, noise_seed)
        whole_n, whole_p = super().sample_support('dataset', label_lists,
                                                  noise_seed)
        n = np.array(whole_n, dtype=np.float64)
        p = np.array(whole_p, dtype=np.float64)
        for k, (_, _, size, shares) in enumerate(self._sites):
            if size is not None:
                n[k] = float(size)
                p[k] = np.asarray(shares, dtype=np.float64)
        return n, p

    def _distinct_priors(
            self, mode: str,
            label_lists: List[np.ndarray]) -> Tuple[np.ndarray, np.ndarray]:
        if mode != 'site':
            return super()._distinct_priors(mode, label_lists)
        # one prior (and one noise draw) per site in the batch
        priors, index, seen = [], [], {}
        for site, site_prior, _, _ in self._sites:
            if site not in seen:
                seen[site] = len(priors)
                priors.append(
                    self.dataset_prior if site_prior is
                    None else np.asarray(site_prior, dtype=np.float64))
            index.append(seen[site])
        return np.stack(priors), np.asarray(index, dtype=np.int64)
