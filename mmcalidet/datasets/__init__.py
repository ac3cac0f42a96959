# Copyright (c) mmcalidet contributors. All rights reserved.
from .transforms import *  # noqa: F401,F403
