# Copyright (c) mmcalidet contributors. All rights reserved.
"""What the page's buttons do, without gradio: each handler takes the
page's values and returns what its outputs show, or raises a
``ValueError`` whose one line the page shows (:func:`error_text`).

:class:`PageActions` ties a :class:`~.session.PriorSession` to the panel
drawer and to the folder the edited priors are written to.
"""
import os.path as osp
import tempfile
import uuid
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np

from ..priors.prior import Prior
from .compare import changed_detections, count_above
from .edit import apply_page_edits, difference_figure, read_edits, write_prior
from .session import TRAIN_PRIOR, PriorSession
from .site_ap import ap_figure, ap_rows, site_ap

#: the prior choices beside the session's named priors
UPLOADED, EDITED = 'uploaded JSON', 'edited (the Edit tab)'


def error_text(exc: BaseException) -> str:
    """An exception as the page's one error line (never a traceback)."""
    text = ' '.join(str(exc).split()) or type(exc).__name__
    if not isinstance(exc, ValueError):
        text = f'{type(exc).__name__}: {text}'
    return f'Error: {text}'


class PageActions:
    """The page's logic on one detector.

    Args:
        session (PriorSession): the detector and its priors.
        drawer: draws a prediction (:class:`~.compare.PanelDrawer`).
        out_dir (str, optional): where edited priors are written (default
            a temporary folder).
        max_site_images (int): the most site images evaluated.
        data_root (str, optional): the config's data folder, where the
            demo's val sites are found (the site tab's examples).
    """

    def __init__(self,
                 session: PriorSession,
                 drawer,
                 out_dir: Optional[str] = None,
                 max_site_images: int = 500,
                 data_root: Optional[str] = None) -> None:
        self.session = session
        self.drawer = drawer
        self.out_dir = out_dir or tempfile.mkdtemp(prefix='prior_app_')
        self.max_site_images = int(max_site_images)
        self.data_root = data_root

    @property
    def choices(self) -> List[str]:
        """The priors a user picks from."""
        return [*self.session.named, UPLOADED, EDITED]

    def default_choice(self) -> str:
        """The prior first shown beside E_t: a site's statistics or a
        bundled prior when there is one, else E0."""
        named = list(self.session.named)
        return named[2] if len(named) > 2 else named[1]

    # priors -----------------------------------------------------------
    def choose(self, choice: str, prior_file: Optional[str],
               edited: Optional[Prior]) -> Prior:
        """The prior a choice names.

        Raises:
            ValueError: no file uploaded or no edit applied for those
                choices, or the prior's own one-line error.
        """
        if choice == UPLOADED:
            if not prior_file:
                raise ValueError('no prior file uploaded: upload a prior '
                                 'JSON (as tools/misc/edit_prior.py writes)')
            return self.session.resolve(
                prior_file, name=osp.basename(prior_file))
        if choice == EDITED:
            if edited is None:
                raise ValueError('no edited prior yet: apply an edit in the '
                                 'Edit tab first')
            return edited
        if choice not in self.session.named:
            raise ValueError(f'unknown prior {choice!r}')
        return self.session.named[choice]

    def check_upload(self, prior_file: Optional[str]) -> str:
        """The status line of an uploaded prior file (read at once)."""
        prior = self.choose(UPLOADED, prior_file, None)
        support = 'with' if prior.has_support else 'without'
        return (f'read {prior.name}: {prior.num_classes} classes, {support} '
                'a measured support')

    # detect -------------------------------------------------------------
    def detect(self, image: Optional[str], choice: str,
               prior_file: Optional[str], edited: Optional[Prior],
               score_thr: float) -> Dict[str, Any]:
        """Detect an image under E_t and under the chosen prior.

        Returns:
            dict: ``preds`` (the two predictions), ``image`` (its path),
            ``prior`` (the chosen prior's name) and what :meth:`draw`
            returns for them.
        """
        path = self.session.check_image(image)
        prior = self.choose(choice, prior_file, edited)
        preds = [
            self.session.detect([path], p)[0]
            for p in (self.session.train_prior, prior)
        ]
        out = dict(preds=preds, image=path, prior=prior.name)
        out.update(self.draw(out, score_thr))
        return out

    def draw(self, shown: Dict[str, Any], score_thr: float) -> Dict:
        """The two panels, their labels, the changed detections and the
        status line of a :meth:`detect` result at a score threshold."""
        import mmcv
        img = mmcv.imread(shown['image'], channel_order='rgb')
        name = osp.basename(shown['image'])
        preds, prior = shown['preds'], shown['prior']
        panels = [self.drawer.draw(img, p, score_thr, name) for p in preds]
        counts = [count_above(p, score_thr) for p in preds]
        labels = [
            f'{n}: {c} detections >= {score_thr:.2f}'
            for n, c in zip((TRAIN_PRIOR, prior), counts)
        ]
        rows = changed_detections(preds[0], preds[1], self.session.classes,
                                  score_thr)
        status = (f'{name}: {labels[0]}; {labels[1]}; {len(rows)} changed '
                  'detections listed')
        return dict(panels=panels, labels=labels, rows=rows, status=status)

    def api_detect(self,
                   image: Optional[str],
                   prior: str,
                   prior_file: Optional[str] = None,
                   score_thr: float = 0.0) -> Dict[str, Any]:
        """The ``/detect`` endpoint: detections of one image under one
        prior, as JSON.

        Args:
            image (str): the image file.
            prior (str): ``E_t``, ``E0``, a bundled prior's name, a site
                prior's name or a prior file on the server.
            prior_file (str, optional): an uploaded prior file (used
                instead of ``prior``).
            score_thr (float): keep detections scoring at least this.

        Returns:
            dict: ``bboxes``, ``scores``, ``labels``, ``classes`` (see
            :meth:`~.session.PriorSession.detections`) and ``prior``.
        """
        path = self.session.check_image(image)
        if prior_file:
            value = self.session.resolve(
                prior_file, name=osp.basename(prior_file))
        else:
            value = self.session.resolve(prior or TRAIN_PRIOR)
        score_thr = float(score_thr or 0.0)
        if not 0.0 <= score_thr <= 1.0:
            raise ValueError(f'score_thr must lie in [0, 1], got {score_thr}')
        pred = self.session.detect([path], value)[0]
        return dict(self.session.detections(pred, score_thr), prior=value.name)

    # edit ---------------------------------------------------------------
    def pair_value(self, base_choice: str, prior_file: Optional[str],
                   edited: Optional[Prior], class_i: str,
                   class_j: str) -> float:
        """P(i | j) in the base prior (what the slider starts at)."""
        base = self.choose(base_choice, prior_file, edited)
        classes = self.session.classes
        if class_i not in classes or class_j not in classes:
            raise ValueError(f'unknown class {class_i!r} or {class_j!r}')
        return float(base.matrix[classes.index(class_i),
                                 classes.index(class_j)])

    def apply_edits(self, base_choice: str, prior_file: Optional[str],
                    edited: Optional[Prior], edits_text: str,
                    absent: Sequence[str]) -> Dict[str, Any]:
        """Apply the edits box and the absent classes to the base prior.

        Returns:
            dict: ``prior`` (the edited prior), ``figure`` (E - E_t),
            ``file`` (its JSON, as edit_prior.py writes it) and
            ``status``.
        """
        base = self.choose(base_choice, prior_file, edited)
        prior, line = apply_page_edits(base, read_edits(edits_text),
                                       list(absent or ()))
        folder = osp.join(self.out_dir, uuid.uuid4().hex[:8])
        path = write_prior(prior, folder)
        figure = difference_figure(prior, self.session.train_prior)
        return dict(
            prior=prior,
            figure=figure,
            file=path,
            status=f'{line}; wrote {osp.basename(path)}')

    # site AP --------------------------------------------------------------
    def site(
        self,
        site: str,
        choice: str,
        prior_file: Optional[str],
        edited: Optional[Prior],
        progress: Optional[Callable[[float, str],
                                    None]] = None) -> Dict[str, Any]:
        """A site's AP under E_t and under the chosen prior.

        Returns:
            dict: ``figure`` (the per-class differences), ``rows`` (the
            per-class table) and ``status``.
        """
        prior = self.choose(choice, prior_file, edited)
        report = site_ap(self.session, site, prior, self.max_site_images,
                         progress)
        status = (f'{report["num_images"]} site images: AP under E_t '
                  f'{100 * report["ap_train"]:.1f}, under {prior.name} '
                  f'{100 * report["ap_prior"]:.1f}')
        if report['skipped']:
            status += (f'; {len(report["skipped"])} images skipped (e.g. '
                       f'{report["skipped"][0]})')
        if np.isnan(report['ap_train']):
            status += '; no ground truth of the model\'s classes'
        return dict(
            figure=ap_figure(report),
            rows=ap_rows(report),
            status=status,
            report=report)
