# Copyright (c) mmcalidet contributors. All rights reserved.
from .file_io import atomic_write, check_readable_file
from .version_check import check_dependency_versions

__all__ = ['atomic_write', 'check_readable_file', 'check_dependency_versions']
