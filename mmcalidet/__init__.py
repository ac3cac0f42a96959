# Copyright (c) mmcalidet contributors. All rights reserved.
"""mmcalidet: run-time calibratable DETR-family detectors for MMDetection.

Importing the package registers its modules (models, losses, batch
augments) into mmdet's registries, so configs only need::

    custom_imports = dict(imports=['mmcalidet'], allow_failed_imports=False)

Tools that only handle priors (statistics, prior files) set
``MMCALIDET_LIGHT=1`` before importing: the package then skips importing
torch/mmdet and registering models, which saves seconds of start-up.
Importing ``mmcalidet.models`` registers them in any case.
"""
import os

from .version import __version__, version_info

if os.environ.get('MMCALIDET_LIGHT', '0') != '1':
    from .utils.version_check import check_dependency_versions
    check_dependency_versions()
    from .utils.external_config_index import cache_external_config_index
    cache_external_config_index()  # mmdet:: bases: one index read
    from .utils.checkpoint import (register_checkpoint_loader,
                                   register_checkpoint_safe_globals)
    register_checkpoint_safe_globals()
    register_checkpoint_loader()
    from . import datasets, engine, models  # noqa: F401  (registration)

from . import priors  # noqa: E402,F401

__all__ = ['__version__', 'version_info']
