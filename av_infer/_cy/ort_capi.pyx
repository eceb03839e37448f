# cython: language_level=3, boundscheck=False, wraparound=False
"""ONNX Runtime through its C API: the cpu device's segment launches without the Python binding.

Why: a segment launch through ``onnxruntime``'s Python binding (``run_with_iobinding``)
costs ~23 k instructions of binding work around the run itself (argument conversion,
``RunOptions`` and ``IOBinding`` unwrapping, status-to-exception translation); a killed run
costs 0.25-0.30 ms of C++ exception unwinding and message formatting in that binding
(``ort_segments.measure_kill_cost``). The run itself is the same C++ call. Here the launch
is one ``RunWithBinding`` call through ORT's C function table with the GIL released, and a
terminated run comes back as a status, not a thrown exception (docs/cpu_engine.md, "The C API
path").

Where the library comes from: the ``onnxruntime`` wheel ships ``capi/libonnxruntime.so.<v>``
beside its Python binding (same release, same kernels); it is ``dlopen``-ed from there (or
from ``AV_INFER_ORT_LIB``), nothing is linked at build time and nothing new is installed.
The binding carries its own copy of ORT statically, so the two never share state: sessions
made here live in this library's environment only.

The function table: ``OrtGetApiBase()->GetApi(API_VERSION)`` returns ORT's ``OrtApi``, a
struct of function pointers that ORT only ever appends to (its ABI promise), so a table
version older than the library's is valid. This file does not include ORT's header: it
declares the few entries it calls by their position in that struct (``_IDX`` below, with
the signature of each written here), checked at load against behaviour (``load()`` makes a
status and reads its code and message back, and the version string must equal the Python
package's).

Guarantees: every ORT object made here is released by its owner's ``__dealloc__``; no ORT
call is made without a loaded table (``load()`` raises ``OrtCApiUnavailable`` with the
reason); an ORT error becomes ``OrtRunError`` (``Terminated`` when the run was stopped by
``RunOptions.terminate``) carrying ORT's own message.
"""

from libc.stdint cimport int64_t, uint32_t
from posix.resource cimport PRIO_PROCESS, setpriority
from posix.types cimport id_t
from libc.stdlib cimport free, malloc
from posix.dlfcn cimport RTLD_LOCAL, RTLD_NOW, dlerror, dlopen, dlsym


cdef extern from "<pthread.h>" nogil:
    ctypedef struct pthread_mutex_t:
        pass
    int pthread_mutex_init(pthread_mutex_t*, const void*)
    int pthread_mutex_destroy(pthread_mutex_t*)
    int pthread_mutex_lock(pthread_mutex_t*)
    int pthread_mutex_unlock(pthread_mutex_t*)

import os

import numpy as np

cdef extern from *:
    """
    #include <stdint.h>
    #include <stddef.h>
    typedef struct AviOrtStatus AviOrtStatus;
    typedef struct { const void* (*GetApi)(uint32_t); const char* (*GetVersionString)(void); }
        AviOrtApiBase;
    typedef const AviOrtApiBase* (*AviGetApiBase)(void);
    static void* const* avi_ort_api = NULL;
    #define AVI_F(i, T) ((T)(avi_ort_api[(i)]))
    """
    ctypedef struct AviOrtStatus
    ctypedef struct AviOrtApiBase:
        const void* (*GetApi)(uint32_t) noexcept nogil
        const char* (*GetVersionString)() noexcept nogil
    ctypedef const AviOrtApiBase* (*AviGetApiBase)() noexcept nogil
    void* const* avi_ort_api


# -- the entries of ORT's OrtApi this module calls, by position (0-based) -----------------
# Positions in the struct's declaration order (ORT's include/onnxruntime/core/session/
# onnxruntime_c_api.h at API version 13; the struct is append-only, so every later library
# has each entry at the same position). API_VERSION: the table version requested.
cdef enum:
    API_VERSION = 13
    I_CreateStatus = 0
    I_GetErrorCode = 1
    I_GetErrorMessage = 2
    I_CreateEnv = 3
    I_CreateSessionFromArray = 8
    I_CreateSessionOptions = 10
    I_SetSessionExecutionMode = 13
    I_SetSessionLogSeverityLevel = 22
    I_SetSessionGraphOptimizationLevel = 23
    I_SetIntraOpNumThreads = 24
    I_SetInterOpNumThreads = 25
    I_CreateRunOptions = 39
    I_RunOptionsSetTerminate = 46
    I_RunOptionsUnsetTerminate = 47
    I_CreateTensorWithDataAsOrtValue = 49
    I_CreateCpuMemoryInfo = 69
    I_ReleaseStatus = 93
    I_ReleaseMemoryInfo = 94
    I_ReleaseSession = 95
    I_ReleaseValue = 96
    I_ReleaseRunOptions = 97
    I_ReleaseSessionOptions = 100
    I_AddSessionConfigEntry = 130
    I_RunWithBinding = 133
    I_CreateIoBinding = 134
    I_ReleaseIoBinding = 135
    I_BindInput = 136
    I_BindOutput = 137

# ORT's enums, the values used here (ORT_LOGGING_LEVEL_ERROR, ORT_SEQUENTIAL,
# ORT_ENABLE_BASIC / ORT_ENABLE_ALL, OrtArenaAllocator, OrtMemTypeDefault)
cdef enum:
    LOG_ERROR = 3
    SEQUENTIAL = 0
    OPT_BASIC = 1
    OPT_ALL = 99
    ARENA_ALLOCATOR = 1
    MEM_DEFAULT = 0

# the signatures, ORT objects as opaque pointers (enums are C ints)
ctypedef AviOrtStatus* (*f_create_status)(int, const char*) noexcept nogil
ctypedef int (*f_error_code)(const AviOrtStatus*) noexcept nogil
ctypedef const char* (*f_error_message)(const AviOrtStatus*) noexcept nogil
ctypedef AviOrtStatus* (*f_create_env)(int, const char*, void**) noexcept nogil
ctypedef AviOrtStatus* (*f_session_from_array)(const void*, const void*, size_t, const void*,
                                               void**) noexcept nogil
ctypedef AviOrtStatus* (*f_out)(void**) noexcept nogil
ctypedef AviOrtStatus* (*f_set_int)(void*, int) noexcept nogil
ctypedef AviOrtStatus* (*f_obj)(void*) noexcept nogil
ctypedef AviOrtStatus* (*f_tensor)(const void*, void*, size_t, const int64_t*, size_t, int,
                                   void**) noexcept nogil
ctypedef AviOrtStatus* (*f_cpu_info)(int, int, void**) noexcept nogil
ctypedef void (*f_release)(void*) noexcept nogil
ctypedef void (*f_release_status)(AviOrtStatus*) noexcept nogil
ctypedef AviOrtStatus* (*f_config)(void*, const char*, const char*) noexcept nogil
ctypedef AviOrtStatus* (*f_io_binding)(void*, void**) noexcept nogil
ctypedef AviOrtStatus* (*f_bind)(void*, const char*, const void*) noexcept nogil
ctypedef AviOrtStatus* (*f_run_binding)(void*, const void*, const void*) noexcept nogil

cdef void* _env = NULL  # ORT environment of this library: made once, never released
cdef void* _cpu_info = NULL  # the CPU memory description every bound tensor uses
cdef object _loaded = None  # (path, version) once loaded; an exception once refused
cdef object _refused = None

#: ONNX element types by numpy dtype (ONNXTensorElementDataType; native byte order)
_ONNX_TYPES = {np.dtype(k): v for k, v in {
    "float32": 1, "uint8": 2, "int8": 3, "uint16": 4, "int16": 5, "int32": 6, "int64": 7,
    "bool": 9, "float16": 10, "float64": 11, "uint32": 12, "uint64": 13,
}.items()}

#: what ORT's message says when ``RunOptions.terminate`` stopped a run
KILL_TEXT = "terminate flag"


class OrtCApiUnavailable(RuntimeError):
    """The C API path cannot be used here (library missing, too old, another release than
    the Python package, or refused at load); the message says which."""


class OrtRunError(RuntimeError):
    """ONNX Runtime returned an error status; the message is ORT's own."""


class Terminated(OrtRunError):
    """The run was stopped by its ``RunOptions.terminate`` (the cpu device's kill)."""


cdef inline void _release_status(AviOrtStatus* st) noexcept nogil:
    (<f_release_status>avi_ort_api[I_ReleaseStatus])(st)


cdef str _take_message(AviOrtStatus* st):
    """ORT's message of ``st`` (released)."""
    cdef const char* m = (<f_error_message>avi_ort_api[I_GetErrorMessage])(st)
    cdef int code = (<f_error_code>avi_ort_api[I_GetErrorCode])(st)
    msg = (<bytes>m).decode("utf-8", "replace") if m != NULL else ""
    _release_status(st)
    return f"[ONNXRuntimeError] : {code} : {msg}"


cdef int _check(AviOrtStatus* st, str what) except -1:
    if st != NULL:
        msg = _take_message(st)
        if KILL_TEXT in msg:
            raise Terminated(msg)
        raise OrtRunError(f"{what}: {msg}" if what else msg)
    return 0


def library_path() -> str:
    """Where the ``libonnxruntime`` this module loads lives: ``AV_INFER_ORT_LIB`` if set,
    else the one the ``onnxruntime`` wheel ships in its ``capi`` folder (OrtCApiUnavailable
    when there is none)."""
    p = os.environ.get("AV_INFER_ORT_LIB")
    if p:
        return p
    import importlib.util

    spec = importlib.util.find_spec("onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        raise OrtCApiUnavailable("the onnxruntime package is not installed")
    for loc in spec.submodule_search_locations:
        capi = os.path.join(loc, "capi")
        names = sorted(n for n in os.listdir(capi) if n.startswith("libonnxruntime.so"))
        if names:
            return os.path.join(capi, names[len(names) - 1])
    raise OrtCApiUnavailable(
        "no libonnxruntime.so in the onnxruntime package's capi folder (set AV_INFER_ORT_LIB "
        "to a libonnxruntime of the same release as the Python package)")


def load() -> tuple:
    """Load the library and its function table once: ``(path, version)``. Raises
    OrtCApiUnavailable with the reason (again on every call) when it cannot be used."""
    global _loaded, _refused, _env, _cpu_info, avi_ort_api
    if _loaded is not None:
        return _loaded
    if _refused is not None:
        raise OrtCApiUnavailable(_refused)
    try:
        _loaded = _load()
    except OrtCApiUnavailable as e:
        _refused = str(e)
        raise
    return _loaded


cdef tuple _load():
    global _env, _cpu_info, avi_ort_api
    import onnxruntime

    path = library_path()
    cdef bytes bpath = path.encode()
    cdef void* lib = dlopen(bpath, RTLD_NOW | RTLD_LOCAL)
    cdef const char* err
    if lib == NULL:
        err = dlerror()
        raise OrtCApiUnavailable(
            f"{path}: dlopen failed: {(<bytes>err).decode() if err != NULL else 'unknown'}")
    cdef void* sym = dlsym(lib, b"OrtGetApiBase")
    if sym == NULL:
        raise OrtCApiUnavailable(f"{path}: no OrtGetApiBase (not an ONNX Runtime library)")
    cdef const AviOrtApiBase* base = (<AviGetApiBase>sym)()
    cdef const char* v = base.GetVersionString()
    version = (<bytes>v).decode() if v != NULL else "?"
    if version != onnxruntime.__version__:
        # another release could compute other numbers than the oracle the checks use
        raise OrtCApiUnavailable(
            f"{path} is ONNX Runtime {version}, the Python package is "
            f"{onnxruntime.__version__}: the C API path needs the same release")
    cdef const void* api = base.GetApi(API_VERSION)
    if api == NULL:
        raise OrtCApiUnavailable(f"{path} refuses C API version {API_VERSION}")
    avi_ort_api = <void* const*>api
    # the table's layout, checked by behaviour: a status made by entry 0 reads back through
    # entries 1 and 2 (a shifted table would not round-trip)
    cdef AviOrtStatus* st = (<f_create_status>avi_ort_api[I_CreateStatus])(2, b"avi-probe")
    if st == NULL:
        avi_ort_api = NULL
        raise OrtCApiUnavailable(f"{path}: CreateStatus returned nothing")
    cdef int code = (<f_error_code>avi_ort_api[I_GetErrorCode])(st)
    cdef const char* m = (<f_error_message>avi_ort_api[I_GetErrorMessage])(st)
    ok = code == 2 and m != NULL and (<bytes>m) == b"avi-probe"
    _release_status(st)
    if not ok:
        avi_ort_api = NULL
        raise OrtCApiUnavailable(f"{path}: the C API table does not have the expected layout")
    try:
        _check((<f_create_env>avi_ort_api[I_CreateEnv])(LOG_ERROR, b"av_infer", &_env),
               "CreateEnv")
        _check((<f_cpu_info>avi_ort_api[I_CreateCpuMemoryInfo])(
            ARENA_ALLOCATOR, MEM_DEFAULT, &_cpu_info), "CreateCpuMemoryInfo")
    except OrtRunError as e:
        avi_ort_api = NULL
        raise OrtCApiUnavailable(f"{path}: {e}") from e
    return (path, version)


def available() -> str | None:
    """None when the C API path can be used, else why not."""
    try:
        load()
    except OrtCApiUnavailable as e:
        return str(e)
    return None


cdef class Session:
    """One ORT session made from serialized model bytes with the options every av_infer ORT
    session uses (``model.segments.ort_options``: ``threads`` intra-op threads, one
    inter-op thread, sequential, no spinning, errors-only logging; optimization ``level``
    "all" or "basic")."""

    cdef void* ptr
    cdef readonly int threads

    def __cinit__(self, bytes model, int threads=1, str level="all"):
        load()
        if level not in ("all", "basic"):
            raise ValueError(f"level must be 'all' or 'basic', got {level!r}")
        self.threads = threads
        cdef void* so = NULL
        _check((<f_out>avi_ort_api[I_CreateSessionOptions])(&so), "CreateSessionOptions")
        try:
            _check((<f_set_int>avi_ort_api[I_SetIntraOpNumThreads])(so, threads), "threads")
            _check((<f_set_int>avi_ort_api[I_SetInterOpNumThreads])(so, 1), "threads")
            _check((<f_set_int>avi_ort_api[I_SetSessionExecutionMode])(so, SEQUENTIAL),
                   "execution mode")
            _check((<f_set_int>avi_ort_api[I_SetSessionGraphOptimizationLevel])(
                so, OPT_ALL if level == "all" else OPT_BASIC), "optimization level")
            _check((<f_config>avi_ort_api[I_AddSessionConfigEntry])(
                so, b"session.intra_op.allow_spinning", b"0"), "config")
            _check((<f_config>avi_ort_api[I_AddSessionConfigEntry])(
                so, b"session.inter_op.allow_spinning", b"0"), "config")
            _check((<f_set_int>avi_ort_api[I_SetSessionLogSeverityLevel])(so, LOG_ERROR),
                   "log level")
            _check((<f_session_from_array>avi_ort_api[I_CreateSessionFromArray])(
                _env, <const char*>model, len(model), so, &self.ptr), "")
        finally:
            (<f_release>avi_ort_api[I_ReleaseSessionOptions])(so)

    def __dealloc__(self):
        if self.ptr != NULL and avi_ort_api != NULL:
            (<f_release>avi_ort_api[I_ReleaseSession])(self.ptr)
            self.ptr = NULL


cdef class RunOptions:
    """A launch's run options: setting ``terminate`` (from any thread) stops the run at ORT's
    next kernel boundary; it stays set (sticky) until set back to False.

    ``nice_next_run(tid, run, back, killed)``: the next run (only) lowers thread ``tid``
    to nice ``run`` once the GIL is released, to ``killed`` where ``terminate`` is set by
    then, and gives it ``back`` as soon as ORT returns, before the GIL is taken back: a BE
    run niced while ORT runs never holds the GIL at its low priority, where other processes
    would take its core while every Python thread waits for it (docs/cpu_engine.md "Beside
    other processes"). ``lower_in_run()`` (a kill, after ``terminate``): the thread of a
    run armed so drops to ``killed`` if, and only if, it is still inside ORT: the run's
    renices and this one are ordered by a mutex held only around each ``setpriority``, so a
    kill landing as the run returns never leaves the thread at ``killed``."""

    cdef void* ptr
    cdef bint _terminate
    cdef id_t _nice_tid
    cdef int _run_nice
    cdef int _back_nice
    cdef int _killed_nice
    cdef id_t _in_run  # the armed run's thread while it is inside ORT, else 0 (under _nm)
    cdef bint _lowered  # lower_in_run() came before the armed run entered ORT (under _nm)
    cdef pthread_mutex_t _nm

    def __cinit__(self):
        pthread_mutex_init(&self._nm, NULL)
        load()
        _check((<f_out>avi_ort_api[I_CreateRunOptions])(&self.ptr), "CreateRunOptions")

    def __dealloc__(self):
        if self.ptr != NULL and avi_ort_api != NULL:
            (<f_release>avi_ort_api[I_ReleaseRunOptions])(self.ptr)
            self.ptr = NULL
        pthread_mutex_destroy(&self._nm)

    @property
    def terminate(self) -> bool:
        return self._terminate

    @terminate.setter
    def terminate(self, value):
        cdef bint v = bool(value)
        cdef AviOrtStatus* st
        # an atomic flag store inside ORT: called with the GIL held (releasing it here
        # would make the RT arrival that kills a BE run wait to take it back)
        if v:
            st = (<f_obj>avi_ort_api[I_RunOptionsSetTerminate])(self.ptr)
        else:
            st = (<f_obj>avi_ort_api[I_RunOptionsUnsetTerminate])(self.ptr)
        _check(st, "terminate")
        self._terminate = v

    @property
    def armed_nice(self):
        """The nice the next run will take (``nice_next_run``), None where not armed."""
        return self._run_nice if self._nice_tid > 0 else None

    def nice_next_run(self, long long tid, int run, int back, int killed) -> None:
        """Arm the next run's renice of thread ``tid`` (class docstring); ``tid`` <= 0
        disarms. The run disarms it: each run is armed by the thread about to make it."""
        self._nice_tid = <id_t>tid if tid > 0 else 0
        self._run_nice, self._back_nice, self._killed_nice = run, back, killed
        self._lowered = False

    def lower_in_run(self) -> bool:
        """Drop the thread of the armed run inside ORT now to its ``killed`` nice (a kill,
        after ``terminate``; or a preempted run the lane keeps); False where no armed run
        is inside ORT: one that has not entered yet enters at ``killed`` (the flag this
        leaves, cleared by the next ``nice_next_run``), one that has returned has its
        priority back."""
        cdef bint done = False
        with nogil:
            pthread_mutex_lock(&self._nm)
            if self._in_run > 0:
                setpriority(PRIO_PROCESS, self._in_run, self._killed_nice)
                done = True
            else:
                self._lowered = True
            pthread_mutex_unlock(&self._nm)
        return done


cdef class BoundSegment:
    """One segment bound to its tensors: ``fn(run_options)`` runs it with the GIL released
    (ORT reads and writes the bound memory in place). The caller keeps every bound array
    alive while the segment may run. Re-binding a name replaces its tensor."""

    cdef Session sess
    cdef void* binding
    cdef readonly tuple inputs
    cdef readonly tuple outputs

    def __cinit__(self, Session sess, tuple inputs, tuple outputs):
        self.sess = sess
        self.inputs, self.outputs = inputs, outputs
        _check((<f_io_binding>avi_ort_api[I_CreateIoBinding])(sess.ptr, &self.binding),
               "CreateIoBinding")

    def __dealloc__(self):
        if self.binding != NULL and avi_ort_api != NULL:
            (<f_release>avi_ort_api[I_ReleaseIoBinding])(self.binding)
            self.binding = NULL

    cdef int _bind(self, str name, object dtype, object shape, size_t ptr,
                   bint output) except -1:
        dt = np.dtype(dtype)
        t = _ONNX_TYPES.get(dt)
        if t is None:
            raise OrtRunError(f"tensor {name!r}: dtype {dtype} has no C API binding here")
        cdef Py_ssize_t nd = len(shape), i
        cdef int64_t* dims = <int64_t*>malloc(max(nd, 1) * sizeof(int64_t))
        cdef size_t n = 1
        cdef void* value = NULL
        cdef bytes bname = name.encode()
        cdef size_t item = dt.itemsize
        cdef AviOrtStatus* st
        if dims == NULL:
            raise MemoryError()
        try:
            for i in range(nd):
                dims[i] = int(shape[i])
                n *= <size_t>dims[i]
            st = (<f_tensor>avi_ort_api[I_CreateTensorWithDataAsOrtValue])(
                _cpu_info, <void*>ptr, n * item, dims, nd, <int>t, &value)
            if st != NULL:  # (the message is built only for an error: rebinds are per request)
                _check(st, f"tensor {name!r}")
            try:
                st = (<f_bind>avi_ort_api[I_BindOutput if output else I_BindInput])(
                    self.binding, bname, value)
                if st != NULL:
                    _check(st, f"bind {name!r}")
            finally:
                (<f_release>avi_ort_api[I_ReleaseValue])(value)
        finally:
            free(dims)
        return 0

    def bind_input(self, str name, dtype, shape, ptr) -> None:
        self._bind(name, dtype, shape, <size_t>ptr, False)

    def bind_output(self, str name, dtype, shape, ptr) -> None:
        self._bind(name, dtype, shape, <size_t>ptr, True)

    def __call__(self, RunOptions ro not None):
        cdef AviOrtStatus* st
        cdef void* s = self.sess.ptr
        cdef void* b = self.binding
        cdef void* r = ro.ptr
        cdef id_t tid = ro._nice_tid
        ro._nice_tid = 0  # armed for this run only
        with nogil:
            if tid > 0:
                pthread_mutex_lock(&ro._nm)
                ro._in_run = tid
                # refused (never: lowering one's own priority): the run keeps its priority;
                # a kill or a park before this point found no run to lower
                setpriority(PRIO_PROCESS, tid,
                            ro._killed_nice if ro._terminate or ro._lowered
                            else ro._run_nice)
                pthread_mutex_unlock(&ro._nm)
            st = (<f_run_binding>avi_ort_api[I_RunWithBinding])(s, r, b)
            if tid > 0:
                pthread_mutex_lock(&ro._nm)
                ro._in_run = 0
                setpriority(PRIO_PROCESS, tid, ro._back_nice)  # refused: the lane renices again
                pthread_mutex_unlock(&ro._nm)
        if st != NULL:
            _check(st, "")
