# cython: language_level=3
"""Array checks of the request path through numpy's C API.

Why: the CPU device checks every input of every request against its arena region
(``LaneEngine.write_inputs``: a C-contiguous array of the region's shape and dtype is
read in place). Written as Python (``v.shape == dst.shape and v.dtype == dst.dtype and
v.flags.c_contiguous``), that is six attribute reads, two tuples, a flags object and a
dtype comparison per input, about 1.5 k instructions on a request of one input; here it
is a few C reads. Same answer as that expression for every value
(tests/devices/test_ndcheck.py).

The checks are ``cpdef`` (``ndcheck.pxd``): compiled modules that cimport them call C
functions; Python calls them as before.
"""

cimport numpy as cnp

cnp.import_array()


cpdef bint exact_array(v, cnp.ndarray dst):
    """``v`` is a numpy array (a subclass too) of ``dst``'s shape and dtype, and
    C-contiguous: ``isinstance(v, np.ndarray) and v.shape == dst.shape and
    v.dtype == dst.dtype and v.flags.c_contiguous``."""
    cdef cnp.ndarray a
    cdef int i, nd
    if not isinstance(v, cnp.ndarray):
        return False
    a = v
    nd = cnp.PyArray_NDIM(a)
    if nd != cnp.PyArray_NDIM(dst):
        return False
    for i in range(nd):
        if cnp.PyArray_DIMS(a)[i] != cnp.PyArray_DIMS(dst)[i]:
            return False
    if not cnp.PyArray_EquivTypes(a.descr, dst.descr):
        return False
    return cnp.PyArray_IS_C_CONTIGUOUS(a)


cpdef int spec_match(v, tuple shape, dt):
    """How ``v`` matches a model input of ``shape`` (a tuple of ints) and dtype ``dt`` (an
    ``np.dtype``): 2 if it is a numpy array (a subclass too) of that shape and dtype and
    C-contiguous, 1 if it is one but not C-contiguous, 0 otherwise (not an array, another
    shape or dtype; also a ``shape`` holding other than Python ints: the caller's own check
    decides those). The admission's check of every input (``inputs.validate_inputs``)
    without attribute reads, tuples or a flags object; the same answer as
    ``isinstance(v, np.ndarray) and v.shape == shape and v.dtype == dt`` (then
    ``v.flags.c_contiguous``) for every value (tests/devices/test_ndcheck.py)."""
    cdef cnp.ndarray a
    cdef Py_ssize_t i, nd
    if shape is None:
        raise TypeError("shape must be a tuple")
    if not isinstance(v, cnp.ndarray):
        return 0
    a = v
    nd = cnp.PyArray_NDIM(a)
    if nd != len(shape):
        return 0
    for i in range(nd):
        d = shape[i]
        if type(d) is not int or cnp.PyArray_DIMS(a)[i] != <cnp.npy_intp>d:
            return 0
    if not isinstance(dt, cnp.dtype) or not cnp.PyArray_EquivTypes(a.descr, <cnp.dtype>dt):
        return 0
    return 2 if cnp.PyArray_IS_C_CONTIGUOUS(a) else 1


cpdef copy_into(cnp.ndarray dst, cnp.ndarray src):
    """``dst[...] = src`` for arrays of the same shape and dtype (what the cpu lanes copy a
    small input into its arena region with), as one ``PyArray_CopyInto`` call."""
    if cnp.PyArray_CopyInto(dst, src) < 0:
        raise RuntimeError("PyArray_CopyInto failed")  # numpy has set the error


cpdef cnp.ndarray fresh_copy(cnp.ndarray v):
    """``v.copy()``: a new C-ordered array with ``v``'s contents (an arena view handed to
    the caller), without the method call."""
    return cnp.PyArray_NewCopy(v, cnp.NPY_CORDER)
