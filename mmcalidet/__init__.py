# Copyright (c) mmcalidet contributors. All rights reserved.
"""mmcalidet: run-time calibratable DETR-family detectors for MMDetection.

Importing the package registers its modules (models, losses, batch
augments) into mmdet's registries, so configs only need::

    custom_imports = dict(imports=['mmcalidet'], allow_failed_imports=False)
"""
from .utils.version_check import check_dependency_versions
from .version import __version__, version_info

check_dependency_versions()

from . import datasets, models, priors  # noqa: E402,F401  (registration)

__all__ = ['__version__', 'version_info']
