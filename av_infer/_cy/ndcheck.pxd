# cython: language_level=3
"""C declarations of ``ndcheck.pyx`` for the compiled modules that cimport them
(``inputs.pxd``, ``devices/cpu_lanes.pxd``)."""

cimport numpy as cnp

cpdef bint exact_array(v, cnp.ndarray dst)
cpdef int spec_match(v, tuple shape, dt)
cpdef copy_into(cnp.ndarray dst, cnp.ndarray src)
cpdef cnp.ndarray fresh_copy(cnp.ndarray v)
