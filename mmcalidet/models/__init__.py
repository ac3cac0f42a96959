# Copyright (c) mmcalidet contributors. All rights reserved.
from . import head_kinds  # noqa: F401
from .data_preprocessors import *  # noqa: F401,F403
from .dense_heads import *  # noqa: F401,F403
from .detectors import *  # noqa: F401,F403
from .layers import *  # noqa: F401,F403
from .losses import *  # noqa: F401,F403
from .non_finite import NonFiniteError  # noqa: F401
from .roi_heads import *  # noqa: F401,F403
