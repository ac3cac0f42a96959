# Copyright (c) mmcalidet contributors. All rights reserved.
# Light helpers only: importing torch/mmengine here would defeat
# MMCALIDET_LIGHT (see mmcalidet/__init__.py). The checkpoint allow-list
# lives in mmcalidet.utils.checkpoint and is registered by the package.
from .file_io import atomic_write, check_readable_file, load_json
from .version_check import check_dependency_versions

__all__ = [
    'atomic_write', 'check_readable_file', 'load_json',
    'check_dependency_versions'
]
