# cython: language_level=3
"""C types for ``inputs.py`` (Cython's pure-Python mode; av_infer/_cy/compiled.py):
``validate_inputs`` runs on every submit, so it is a C function the compiled admission
(``admission.pxd``) calls directly; Python callers call it as before."""

from av_infer._cy.ndcheck cimport spec_match

cpdef dict validate_inputs(model, spec, inputs, bint borrow=*)
cdef object _np_dtype(dtype)
