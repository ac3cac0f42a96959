# cython: boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False
# Copyright (c) mmcalidet contributors. All rights reserved.
# The CPU deformable attention kernel (_deform_attn_kernel.pxi), compiled with
# AVX2 and FMA (setup.py adds -mavx2 -mfma; built on x86-64 only).
include "_deform_attn_kernel.pxi"
