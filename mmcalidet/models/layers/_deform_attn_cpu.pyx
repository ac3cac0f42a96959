# cython: boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False
# Copyright (c) mmcalidet contributors. All rights reserved.
# The CPU deformable attention kernel (_deform_attn_kernel.pxi), compiled for
# the baseline of the CPU architecture.
include "_deform_attn_kernel.pxi"
