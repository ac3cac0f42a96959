# Copyright (c) mmcalidet contributors. All rights reserved.
"""The EdgeSampler's modes and draws (paper Sec. 3.2): which statistics a
mode gives every sample of a mini-batch, the draw of the mode and of the
noise, the noisy priors and, with ``support``, each prior's support; the
``'sim_site'`` mode's bank of recent training images and its simulated
sites.

:class:`EdgeModesMixin` is what :class:`~.edge_sampler.EdgeSampler` (the
batch augment that attaches the draws to the data samples) inherits; a
subclass adds a mode by naming it in ``KNOWN_MODES`` and drawing it in
:meth:`EdgeModesMixin._distinct_priors`.
"""
from typing import Dict, List, Optional, Tuple

import numpy as np

from ...priors import batch_prior, counts_to_prior, label_lists_prior
from ..layers.support_ops import label_support

#: mode name -> the statistics it gives every sample of the mini-batch
MODES = {
    'sample': 'E_x, each sample its own',
    'batch': 'E_b over the mini-batch (see `batch_scope`)',
    'dataset': 'E_t, the prior file',
    'group': 'E_b over consecutive groups of `group_size` samples',
    'sim_site': 'E_b(n) of a simulated site (experimental)',
}


class EdgeModesMixin:
    """The modes and draws of an :class:`~.edge_sampler.EdgeSampler`.

    It reads what the sampler sets: ``num_classes`` (K), ``modes`` and
    ``probs`` (:meth:`_check_mode_probs`), ``noise_std``, ``group_size``,
    ``dataset_prior`` (E_t) and the number of images it was measured on
    (``_dataset_images``), the own generator ``_rng`` (or ``None``), the
    ``'sim_site'`` mode's ``site_support``, ``site_tilt_std`` and
    ``site_bank_size``, and the bank's ``_site_bank``, ``_site_bank_next``
    and ``_site_bank_len``.
    """

    #: the modes ``mode_probs`` may name (a subclass adds its own)
    KNOWN_MODES = MODES

    @classmethod
    def _check_mode_probs(
            cls,
            mode_probs: Optional[Dict[str, float]]) -> Tuple[tuple, tuple]:
        if mode_probs is None:
            mode_probs = dict(sample=1.0, batch=1.0, dataset=1.0)
        unknown = set(mode_probs) - set(cls.KNOWN_MODES)
        if unknown:
            raise ValueError(
                f'{cls.__name__}: unknown mode(s) {sorted(unknown)}; choose '
                f'from {list(cls.KNOWN_MODES)}')
        weights = {k: float(v) for k, v in mode_probs.items() if v}
        if any(v < 0 or not np.isfinite(v) for v in weights.values()) or \
                not weights:
            raise ValueError('EdgeSampler: mode_probs must be finite, '
                             f'non-negative, not all zero: {mode_probs}')
        total = sum(weights.values())
        modes = tuple(weights)
        return modes, tuple(weights[m] / total for m in modes)

    def _draw(self) -> Tuple[str, int]:
        """Draw the mode and the seed of the noise."""
        if self._rng is not None:
            mode = self._rng.choice(len(self.modes), p=self.probs)
            noise_seed = self._rng.integers(2**32)
        else:
            mode = np.random.choice(len(self.modes), p=self.probs)
            noise_seed = np.random.randint(2**32, dtype=np.int64)
        return self.modes[int(mode)], int(noise_seed)

    def _distinct_priors(
            self,
            mode: str,
            label_lists: List[np.ndarray]) -> Tuple[np.ndarray, np.ndarray]:
        """The noiseless priors of a mode and the index of each sample's.

        Args:
            mode (str): one of :data:`MODES`.
            label_lists (list[np.ndarray]): class indices per image.

        Returns:
            tuple[np.ndarray, np.ndarray]: (G, K, K) priors and (N,) indices
            into them.
        """
        num = len(label_lists)
        if mode == 'sample':
            return label_lists_prior(label_lists, self.num_classes), \
                np.arange(num)
        if mode == 'group':
            index = np.arange(num) // self.group_size
            priors = np.stack([
                batch_prior(
                    self.num_classes, label_lists[g * self.group_size:(g + 1) *
                                                  self.group_size])
                for g in range(int(index[-1]) + 1)
            ]) if num else np.zeros((0, self.num_classes, self.num_classes))
            return priors, index
        prior = batch_prior(self.num_classes, label_lists) \
            if mode == 'batch' else self.dataset_prior
        return prior[None], np.zeros(num, dtype=np.int64)

    def sample_priors(self, mode: str, label_lists: List[np.ndarray],
                      noise_seed: int) -> np.ndarray:
        """Priors of a mode for a batch: statistics + noise, clipped,
        diagonal 1.

        Args:
            mode (str): one of :data:`MODES`.
            label_lists (list[np.ndarray]): class indices per image.
            noise_seed (int): seed of the noise.

        Returns:
            np.ndarray: (N, K, K) float64.
        """
        if mode == 'sim_site':
            priors = self._site_prior(noise_seed)[None]
            index = np.zeros(len(label_lists), dtype=np.int64)
        else:
            priors, index = self._distinct_priors(mode, label_lists)
        if self.noise_std > 0:
            noise = np.random.default_rng(noise_seed).normal(
                0.0, self.noise_std, size=priors.shape)
            priors = np.clip(priors + noise, 0.0, 1.0)
        else:
            priors = priors.copy()
        diag = np.arange(self.num_classes)
        priors[:, diag, diag] = 1.0
        return priors[index]

    def _add_to_site_bank(self, label_lists: List[np.ndarray]) -> None:
        """Keep the classes of the last ``site_bank_size`` images."""
        if self._site_bank is None:
            self._site_bank = np.zeros((self.site_bank_size, self.num_classes),
                                       dtype=np.float64)
        for lab in label_lists:
            row = self._site_bank[self._site_bank_next]
            row[:] = 0.0
            row[np.asarray(lab, dtype=np.int64)] = 1.0
            self._site_bank_next = \
                (self._site_bank_next + 1) % self.site_bank_size
            self._site_bank_len = min(self._site_bank_len + 1,
                                      self.site_bank_size)

    def _site_presence(self, seed: int) -> np.ndarray:
        """A simulated site's (n, K) class presence: n (log-uniform in
        ``site_support``) images drawn with replacement from the bank, each
        weighted ``exp(sum of t over its classes)``, with a per-class tilt
        t ~ N(0, site_tilt_std^2). A function of ``seed`` and the bank."""
        if not self._site_bank_len:
            raise ValueError('EdgeSampler: the "sim_site" mode has no '
                             'training images to draw from yet')
        rng = np.random.default_rng([seed, 49])
        num = log_uniform_size(rng, *self.site_support)
        tilt = rng.normal(0.0, self.site_tilt_std, size=self.num_classes)
        bank = self._site_bank[:self._site_bank_len]
        logits = bank @ tilt
        weights = np.exp(logits - logits.max())
        pick = rng.choice(len(bank), size=num, p=weights / weights.sum())
        return bank[pick]

    def site_label_lists(self, seed: int) -> List[np.ndarray]:
        """The label sets of the site drawn with ``seed`` (see
        :meth:`_site_presence`).

        Args:
            seed (int): the draw's seed.

        Returns:
            list[np.ndarray]: the site's n label sets.
        """
        return [np.flatnonzero(row) for row in self._site_presence(seed)]

    def _site_prior(self, seed: int) -> np.ndarray:
        """E_b(n) of the site drawn with ``seed`` (K x K)."""
        presence = self._site_presence(seed)
        return counts_to_prior(presence.T @ presence, presence.sum(0))

    def sample_support(
            self, mode: str, label_lists: List[np.ndarray],
            noise_seed: int) -> Optional[Tuple[np.ndarray, np.ndarray]]:
        """The support (n) and class shares (p) of each sample's prior.

        Args:
            mode (str): a mode of :data:`MODES` (another mode: ``None``).
            label_lists (list[np.ndarray]): class indices per image.
            noise_seed (int): the draw's seed (the ``'sim_site'`` mode's
                site).

        Returns:
            tuple[np.ndarray, np.ndarray] | None: (N, K) n and (N, K) p.
        """
        k, num = self.num_classes, len(label_lists)

        if mode == 'sample':
            groups = [[lab] for lab in label_lists]
        elif mode == 'group':
            groups = [
                label_lists[g:g + self.group_size]
                for g in range(0, num, self.group_size)
            ]
            groups = [grp for grp in groups for _ in grp]
        elif mode == 'batch':
            groups = [label_lists] * num
        elif mode in ('sim_site', 'dataset'):
            site = mode == 'sim_site'
            presence = self._site_presence(noise_seed) if site \
                else self._site_bank[:self._site_bank_len]
            size = len(presence) if site else \
                (self._dataset_images or len(presence))
            share = presence.mean(0) if len(presence) else np.zeros(k)
            return np.full((num, k), float(size)), np.tile(share, (num, 1))
        else:
            return None
        pairs = [label_support(grp, k) for grp in groups]
        if not pairs:
            return np.zeros((0, k)), np.zeros((0, k))
        return np.stack([a for a, _ in pairs]), np.stack([b for _, b in pairs])


def log_uniform_size(rng: np.random.Generator, low: int, high: int) -> int:
    """A site's number of images, log-uniform in ``[low, high]`` (the
    ``'sim_site'`` mode's support n).

    Args:
        rng (np.random.Generator): the generator drawn from (one draw).
        low (int): the smallest size (>= 1).
        high (int): the largest size.

    Returns:
        int: the size, rounded, within the range.
    """
    log_n = rng.uniform(np.log(low), np.log(high))
    return int(np.clip(np.round(np.exp(log_n)), low, high))
