# Copyright (c) mmcalidet contributors. All rights reserved.
"""The prior page (``tools/demo/prior_app.py``): detect under a prior, edit
it in words, a site's AP, and the ``/detect`` API (see
docs/user_guides/inject_prior.md).

The logic runs without gradio (:mod:`.session`, :mod:`.compare`,
:mod:`.edit`, :mod:`.site_ap`, :mod:`.handlers`, :mod:`.model_files`);
only :mod:`.page` imports it, when a page is built (``pip install
mmcalidet[app]``).
"""
from .handlers import EDITED, UPLOADED, PageActions, error_text
from .session import FLAT_PRIOR, TRAIN_PRIOR, PriorSession, prior_key

__all__ = [
    'PriorSession', 'PageActions', 'prior_key', 'error_text', 'TRAIN_PRIOR',
    'FLAT_PRIOR', 'UPLOADED', 'EDITED'
]
