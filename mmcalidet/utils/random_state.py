# Copyright (c) mmcalidet contributors. All rights reserved.
"""Run a step with its own random numbers, leaving the caller's as found."""
import contextlib
import random
from typing import Iterator

import numpy as np
import torch


@contextlib.contextmanager
def preserved_random_state() -> Iterator[None]:
    """Save the states of ``random``, numpy and torch (CPU and CUDA) and
    restore them on exit.

    A decoder cache made inside a training run (its dataset's ``source``)
    then does not move the run's generators: a run that makes the cache
    and one that reuses it initialise and train alike.
    """
    states = (random.getstate(), np.random.get_state(),
              torch.random.get_rng_state())
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() \
        else None
    try:
        yield
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.random.set_rng_state(states[2])
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
