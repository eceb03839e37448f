# cython: language_level=3
"""C types for ``admission.py`` (Cython's pure-Python mode, as sched/scheduler.pxd; the
list of compiled modules: av_infer/_cy/compiled.py): ``Admission`` becomes a ``cdef
class`` whose ``submit`` is a C method, the driver is the compiled ``Driver`` (``post`` a
C call), the request and its timings are built with their C constructors, the input
checks are the compiled ``validate_inputs``, the registry's look-up its C ``resolve``, and the request's times are C doubles."""

cimport cython

from av_infer.inputs cimport validate_inputs
from av_infer.registry cimport ModelRegistry
from av_infer.request_options cimport RequestOptions, check_client, parse_priority
from av_infer.sched.driver cimport Driver
from av_infer.sched.request cimport Request, Timings


@cython.final
cdef class Admission:
    cdef public ModelRegistry reg
    cdef public Driver driver
    cdef public bint closed
    cdef object _now
    cdef object _on_utility
    cdef object _on_quality
    cdef object _ids

    cpdef submit(self, model, inputs, RequestOptions opts, bint caller_runs)
    @cython.locals(received=double, arrival=double, deadline=double, hard=double)
    cdef tuple _build(self, model, inputs, RequestOptions opts)

