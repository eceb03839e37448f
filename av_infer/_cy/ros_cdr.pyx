# cython: language_level=3
"""CDR, the DDS wire form, of the messages the data paths move per frame or request:
``sensor_msgs/Image`` and ``sensor_msgs/CompressedImage`` read, ``av_infer_msgs/TensorList``
written (and read, for a consumer of the outputs), the host's ``InferRequest`` read and
its ``InferResponse`` written (and read, by a remote client), ``vision_msgs``
detections and ``diagnostic_msgs/DiagnosticArray`` written.
ROS-free (bytes in, bytes out), so plain
pytest covers it.

Why: rclpy turns a received message into Python objects field by field (an ``Image``: a
``Header``, a ``Time``, two ``str`` and a 230 KB ``array.array`` copied out of the C
struct the rmw deserialised into), and a published one back the same way. The perception
node needs six scalars, two strings and a view of the pixels from an image, and writes a
header and its output arrays: reading the serialised bytes of a ``raw=True``
subscription and publishing serialised bytes (``Publisher.publish(bytes)``) skips both
conversions and one copy of the pixels each way (docs/ros.md, "ROS path cost").

The form: XCDR version 1 ("plain CDR", what rmw_fastrtps and rmw_cyclonedds put on the
wire for ROS 2 messages), a 4-byte encapsulation header (``00 01``: little-endian, ``00
00``: big-endian; options ``00 00``), then the fields in IDL order, each primitive aligned
to its size (8-byte ones to 8) counted from the byte after the encapsulation header;
strings as a ``uint32`` length that counts the terminating NUL, the bytes and the NUL;
sequences as a ``uint32`` count and the elements (no alignment when there are none, as
Fast CDR writes them). Padding is written as zeros (Fast CDR
leaves whatever was in its buffer; readers ignore it).

Guarantees: a reader checks every length against the buffer and raises ``ValueError``
naming the field instead of reading past it (a raw subscription hands over whatever a
publisher sent); the pixel view it returns is a ``memoryview`` into the caller's bytes (no
copy: the bytes must outlive it). ``tests/cy/test_ros_cdr.py`` holds both directions
against rclpy's own ``serialize_message``/``deserialize_message``.
"""

import sys

cimport cython
cimport numpy as cnp
from cpython.bytes cimport (
    PyBytes_AS_STRING,
    PyBytes_Check,
    PyBytes_FromStringAndSize,
    PyBytes_GET_SIZE,
)
from cpython.list cimport PyList_Check
from cpython.tuple cimport PyTuple_Check, PyTuple_GET_ITEM, PyTuple_GET_SIZE
from cpython.unicode cimport PyUnicode_AsUTF8AndSize, PyUnicode_Check
from libc.stdint cimport int8_t, int32_t, uint8_t, uint32_t, uint64_t
from libc.string cimport memchr, memcpy, memset

#: the encapsulation kinds read and written (XCDR1): CDR_BE, CDR_LE
CDR_BE = b"\x00\x00"
CDR_LE = b"\x00\x01"

cdef bint _HOST_LE = sys.byteorder == "little"


cdef inline uint32_t _bswap32(uint32_t v) noexcept nogil:
    return (v >> 24) | ((v >> 8) & 0xFF00) | ((v << 8) & 0xFF0000) | (v << 24)


cdef class _Reader:
    cdef const uint8_t* p
    cdef Py_ssize_t n, pos   # pos counts from the byte after the encapsulation header
    cdef bint swap
    cdef object what

    cdef int need(self, Py_ssize_t k, str field) except -1:
        if k < 0 or self.pos + k > self.n:
            raise ValueError(f"{self.what}: {field} runs past the message's end "
                             f"({self.n + 4} bytes)")
        return 0

    cdef const uint8_t* take(self, Py_ssize_t k, str field) except NULL:
        """The next ``k``-byte primitive (aligned to ``k``): where it starts; ``pos`` moves
        past it."""
        self.pos = (self.pos + k - 1) & ~(k - 1)
        self.need(k, field)
        self.pos += k
        return self.p + self.pos - k

    cdef uint32_t u32(self, str field) except? 0xFFFFFFFF:
        cdef uint32_t v
        memcpy(&v, self.take(4, field), 4)
        return _bswap32(v) if self.swap else v

    cdef uint64_t u64(self, str field) except? 0xFFFFFFFFFFFFFFFF:
        cdef uint64_t v
        memcpy(&v, self.take(8, field), 8)
        if self.swap:
            v = (<uint64_t>_bswap32(<uint32_t>v) << 32) | _bswap32(<uint32_t>(v >> 32))
        return v

    cdef double f64(self, str field) except? -1.0:
        cdef uint64_t v = self.u64(field)
        cdef double d
        memcpy(&d, &v, 8)
        return d

    cdef uint8_t u8(self, str field) except? 0xFF:
        self.need(1, field)
        self.pos += 1
        return self.p[self.pos - 1]

    cdef str string(self, str field):
        cdef uint32_t k = self.u32(field)
        if k == 0:  # some writers send an empty string without its NUL
            return ""
        self.need(k, field)
        if self.p[self.pos + k - 1] != 0:
            raise ValueError(f"{self.what}: {field} is not NUL-terminated")
        s = (<const char*>self.p + self.pos)[:k - 1].decode("utf-8", "replace")
        self.pos += k
        return s

    cdef Py_ssize_t octets(self, str field) except -1:
        """Skips a ``uint8[]``; returns where its bytes start, counted from the buffer's
        first byte (its end is then ``self.pos + 4``)."""
        cdef uint32_t k = self.u32(field)
        self.need(k, field)
        self.pos += k
        return self.pos - k + 4


cdef _Reader _reader(const uint8_t[::1] buf, str what):
    cdef _Reader r = _Reader.__new__(_Reader)
    if buf.shape[0] < 4:
        raise ValueError(f"{what}: {buf.shape[0]} bytes, no CDR encapsulation header")
    if buf[0] != 0 or buf[1] > 1:
        raise ValueError(f"{what}: encapsulation {buf[0]:02x} {buf[1]:02x} is not XCDR1 "
                         "(00 00 big-endian or 00 01 little-endian)")
    r.p = &buf[4] if buf.shape[0] > 4 else NULL
    r.n = buf.shape[0] - 4
    r.pos = 0
    r.swap = (buf[1] == 1) != _HOST_LE
    r.what = what
    return r


cdef tuple _header(_Reader r):
    """A ``std_msgs/Header``: ``(sec, nanosec, frame_id)``."""
    sec = <int32_t>r.u32("header.stamp.sec")
    return sec, r.u32("header.stamp.nanosec"), r.string("header.frame_id")


def read_image(data):
    """``(sec, nanosec, frame_id, height, width, encoding, is_bigendian, step, pixels)`` of a
    serialised ``sensor_msgs/Image``; ``pixels`` is a ``memoryview`` of ``data``'s bytes
    (no copy). ValueError if ``data`` is not one."""
    cdef const uint8_t[::1] buf = data
    cdef _Reader r = _reader(buf, "sensor_msgs/Image")
    head = _header(r)
    height = r.u32("height")
    width = r.u32("width")
    encoding = r.string("encoding")
    big = r.u8("is_bigendian")
    step = r.u32("step")
    cdef Py_ssize_t start = r.octets("data")
    return head + (height, width, encoding, big, step, memoryview(data)[start:r.pos + 4])


def read_compressed_image(data):
    """``(sec, nanosec, frame_id, format, payload)`` of a serialised
    ``sensor_msgs/CompressedImage``; ``payload`` is a ``memoryview`` of ``data``'s bytes."""
    cdef const uint8_t[::1] buf = data
    cdef _Reader r = _reader(buf, "sensor_msgs/CompressedImage")
    head = _header(r)
    fmt = r.string("format")
    cdef Py_ssize_t start = r.octets("data")
    return head + (fmt, memoryview(data)[start:r.pos + 4])


cdef list _tensors(_Reader r, object view):
    """A ``Tensor[]``: each ``(name, rank, dims, data_type, strides, data)`` as the message
    has them (``dims``/``strides`` tuples, ``data`` a slice of ``view``: no copy)."""
    cdef uint32_t n, k, j
    cdef Py_ssize_t start
    n = r.u32("tensors")
    r.need(<Py_ssize_t>n * 17, "tensors")  # each at least 17 bytes: no huge loop on junk
    tensors = []
    for _ in range(n):
        name = r.string("tensors[].name")
        rank = r.u8("tensors[].shape.rank")
        k = r.u32("tensors[].shape.dims")
        r.need(<Py_ssize_t>k * 4, "tensors[].shape.dims")
        dims = tuple([r.u32("tensors[].shape.dims") for j in range(k)])
        code = <int32_t>r.u32("tensors[].data_type")
        k = r.u32("tensors[].strides")
        if k:
            r.pos = (r.pos + 7) & ~7
            r.need(<Py_ssize_t>k * 8, "tensors[].strides")
        strides = tuple([r.u64("tensors[].strides") for j in range(k)])
        start = r.octets("tensors[].data")
        tensors.append((name, rank, dims, code, strides, view[start:r.pos + 4]))
    return tensors


def read_tensor_list(data):
    """``(sec, nanosec, frame_id, tensors)`` of a serialised ``av_infer_msgs/TensorList``
    (Isaac ROS's layout); each tensor ``(name, rank, dims, data_type, strides, data)`` as
    the message has them (``dims``/``strides`` tuples, ``data`` a ``memoryview`` of
    ``data``'s bytes: no copy), for ``tensor_codec.read_tensor_list_cdr`` to check and view
    as arrays. ValueError if ``data`` is not one (every count is checked against the bytes
    left before a list is built)."""
    cdef const uint8_t[::1] buf = data
    cdef _Reader r = _reader(buf, "av_infer_msgs/TensorList")
    head = _header(r)
    return head + (_tensors(r, memoryview(data)),)


def read_infer_request(data):
    """``(sec, nanosec, frame_id, id, model, client, priority, deadline, drop_late,
    hard_deadline, variant_group, tensors)`` of a serialised ``av_infer_msgs/InferRequest``
    (durations as ``(sec, nanosec)``, ``drop_late`` a bool, tensors as
    :func:`read_tensor_list` gives them: views of ``data``). ValueError if ``data`` is not
    one."""
    cdef const uint8_t[::1] buf = data
    cdef _Reader r = _reader(buf, "av_infer_msgs/InferRequest")
    head = _header(r)
    rid = r.string("id")
    model = r.string("model")
    client = r.string("client")
    priority = <int8_t>r.u8("priority")
    deadline = (<int32_t>r.u32("deadline.sec"), r.u32("deadline.nanosec"))
    drop_late = r.u8("drop_late") != 0
    hard = (<int32_t>r.u32("hard_deadline.sec"), r.u32("hard_deadline.nanosec"))
    group = r.string("variant_group")
    return head + (rid, model, client, priority, deadline, drop_late, hard, group,
                   _tensors(r, memoryview(data)))


def read_infer_response(data):
    """``(sec, nanosec, frame_id, id, status, code, message, model, served_model, kappa,
    quality, timings, tensors)`` of a serialised ``av_infer_msgs/InferResponse``;
    ``timings`` the ``InferTimings`` fields in message order ``(queueing_ms, compute_ms,
    total_ms, preempted, kernels_padded, has_deadline, deadline_met)``, tensors as
    :func:`read_tensor_list` gives them (views of ``data``, not checked here). ValueError if
    ``data`` is not one."""
    cdef const uint8_t[::1] buf = data
    cdef _Reader r = _reader(buf, "av_infer_msgs/InferResponse")
    head = _header(r)
    rid = r.string("id")
    status = r.u8("status")
    code = r.string("code")
    message = r.string("message")
    model = r.string("model")
    served = r.string("served_model")
    kappa = r.f64("kappa")
    quality = r.f64("quality")
    timings = (r.f64("timings.queueing_ms"), r.f64("timings.compute_ms"),
               r.f64("timings.total_ms"), r.u32("timings.preempted"),
               r.u32("timings.kernels_padded"), r.u8("timings.has_deadline") != 0,
               r.u8("timings.deadline_met") != 0)
    return head + (rid, status, code, message, model, served, kappa, quality, timings,
                   _tensors(r, memoryview(data)))


cdef inline Py_ssize_t _al(Py_ssize_t pos, Py_ssize_t a) noexcept nogil:
    return (pos + a - 1) & ~(a - 1)


# The ``_put*`` writers take ``b`` NULL to only move ``pos``: a message's layout is then
# written once (a ``_lay_*`` function) and run twice, to size the buffer and to fill it.

cdef inline Py_ssize_t _put8(char* b, Py_ssize_t pos, uint8_t v) noexcept nogil:
    if b != NULL:
        b[pos] = <char>v
    return pos + 1


cdef inline Py_ssize_t _put32(char* b, Py_ssize_t pos, uint32_t v) noexcept nogil:
    cdef Py_ssize_t q = _al(pos, 4)
    if b != NULL:
        memset(b + pos, 0, q - pos)
        memcpy(b + q, &v, 4)
    return q + 4


cdef inline Py_ssize_t _put64(char* b, Py_ssize_t pos, double v) noexcept nogil:
    cdef Py_ssize_t q = _al(pos, 8)
    if b != NULL:
        memset(b + pos, 0, q - pos)
        memcpy(b + q, &v, 8)
    return q + 8


cdef inline Py_ssize_t _put_str(char* b, Py_ssize_t pos, const char* s,
                                Py_ssize_t k) noexcept nogil:
    pos = _put32(b, pos, <uint32_t>(k + 1))
    if b != NULL:
        memcpy(b + pos, s, k)
        b[pos + k] = 0
    return pos + k + 1


cdef inline Py_ssize_t _size_str(Py_ssize_t pos, Py_ssize_t k) noexcept nogil:
    return _al(pos, 4) + 4 + k + 1


cdef inline void _put_start(char* b, int sec, unsigned int nanosec) noexcept nogil:
    """The encapsulation header (little-endian XCDR1) and a ``builtin_interfaces/Time``."""
    cdef int32_t s32 = sec
    b[0] = 0
    b[1] = 1
    b[2] = 0
    b[3] = 0
    memcpy(b + 4, &s32, 4)
    memcpy(b + 8, &nanosec, 4)


cdef inline Py_ssize_t _size_head(Py_ssize_t frame_len) noexcept nogil:
    """Bytes after the encapsulation header up to the first tensor: the header (stamp,
    frame_id) and the tensor count."""
    return _al(_size_str(8, frame_len), 4) + 4


cdef inline Py_ssize_t _size_tensor(Py_ssize_t pos, Py_ssize_t name_len, Py_ssize_t rank,
                                    Py_ssize_t ns, Py_ssize_t nbytes) noexcept nogil:
    """``pos`` after one ``Tensor``: name, ``shape`` (rank, dims), ``data_type``,
    ``strides`` (8-aligned when there are any), ``data``."""
    pos = _size_str(pos, name_len) + 1
    pos = _al(pos, 4) + 4 + 4 * rank
    pos = _al(pos, 4) + 4
    pos = _al(pos, 4) + 4
    if ns:
        pos = _al(pos, 8) + 8 * ns
    return _al(pos, 4) + 4 + nbytes


cdef object _new_list(Py_ssize_t payload, int sec, unsigned int nanosec, bytes frame_id,
                      Py_ssize_t n, Py_ssize_t* pos):
    """A bytes object for a ``TensorList`` of ``payload`` bytes after the encapsulation
    header, with that header, the message header and the tensor count written; ``pos``:
    where the first tensor goes (counted after the encapsulation header)."""
    out = PyBytes_FromStringAndSize(NULL, payload + 4)
    cdef char* b = PyBytes_AS_STRING(out)
    _put_start(b, sec, nanosec)
    pos[0] = _put32(b + 4, _put_str(b + 4, 8, frame_id, len(frame_id)), <uint32_t>n)
    return out


cdef Py_ssize_t _put_tensor(char* b, Py_ssize_t pos, bytes name, Py_ssize_t rank,
                            const uint32_t* dims, int32_t code, Py_ssize_t ns,
                            const uint64_t* strides, const void* data,
                            Py_ssize_t nbytes) noexcept:
    """Writes one ``Tensor`` at ``pos`` (``b``: the byte after the encapsulation header);
    returns the position after it. ``_size_tensor`` gave the room."""
    cdef Py_ssize_t j, k
    pos = _put_str(b, pos, name, len(name))
    b[pos] = <char>rank
    pos += 1
    pos = _put32(b, pos, <uint32_t>rank)
    for j in range(rank):
        pos = _put32(b, pos, dims[j])
    pos = _put32(b, pos, <uint32_t>code)
    pos = _put32(b, pos, <uint32_t>ns)
    if ns:
        k = _al(pos, 8)
        memset(b + pos, 0, k - pos)
        memcpy(b + k, strides, 8 * ns)
        pos = k + 8 * ns
    pos = _put32(b, pos, <uint32_t>nbytes)
    if nbytes:
        memcpy(b + pos, data, nbytes)
    return pos + nbytes


@cython.boundscheck(False)
@cython.wraparound(False)
def write_tensor_list(int sec, unsigned int nanosec, bytes frame_id, list tensors):
    """A serialised ``av_infer_msgs/TensorList`` (little-endian XCDR1, what
    ``Publisher.publish(bytes)`` sends as is): header ``(sec, nanosec, frame_id)`` (UTF-8
    bytes, no NUL) and ``tensors``, each ``(name: bytes, dims: tuple of int, data_type:
    int, strides: tuple of int, data)`` where ``data`` is a C-contiguous buffer of
    ``prod(dims) * itemsize`` bytes (the caller's contract, ``tensor_codec``); its bytes
    are copied once, into the result. ValueError (nothing written) for a rank over 255 or
    more than 2**32 - 1 bytes; OverflowError for a dimension or stride out of range."""
    cdef Py_ssize_t pos, i, j, rank, ns
    cdef const uint8_t[::1] view
    cdef list views = [], dim_rows = [], stride_rows = []
    cdef uint32_t dims[255]
    cdef uint64_t strides[255]
    if not _HOST_LE:
        raise ValueError("write_tensor_list writes little-endian CDR from a little-endian host")
    pos = _size_head(len(frame_id))
    for t in tensors:  # pass 1: checked and sized (each alignment depends on what is before)
        name, d, code, st, data = t
        if len(d) > 255 or len(st) > 255:
            raise ValueError(f"tensor {name!r}: rank {max(len(d), len(st))} > 255 "
                             "(TensorShape.rank is uint8)")
        view = memoryview(data).cast("B")
        if view.shape[0] > 0xFFFFFFFF:
            raise ValueError(f"tensor {name!r}: {view.shape[0]} bytes (a CDR sequence holds "
                             "at most 2**32 - 1)")
        views.append(view)
        dim_rows.append([<uint32_t>v for v in d])
        stride_rows.append([<uint64_t>v for v in st])
        pos = _size_tensor(pos, len(<bytes>name), len(d), len(st), view.shape[0])
    out = _new_list(pos, sec, nanosec, frame_id, len(tensors), &pos)
    cdef char* b = PyBytes_AS_STRING(out) + 4
    for i in range(len(tensors)):
        name, _, code, _, _ = tensors[i]
        view = views[i]
        rank, ns = len(dim_rows[i]), len(stride_rows[i])
        for j in range(rank):
            dims[j] = dim_rows[i][j]
        for j in range(ns):
            strides[j] = stride_rows[i][j]
        pos = _put_tensor(b, pos, name, rank, dims, <int32_t>code, ns, strides,
                          &view[0] if view.shape[0] else NULL, view.shape[0])
    return out


def write_float64_stamped(int sec, unsigned int nanosec, double value):
    """A serialised ``av_infer_msgs/Float64Stamped`` (``builtin_interfaces/Time stamp``,
    ``float64 data``; little-endian XCDR1): the debug topics' message, 20 bytes."""
    cdef char buf[20]
    if not _HOST_LE:
        raise ValueError("write_float64_stamped writes little-endian CDR from a "
                         "little-endian host")
    _put_start(buf, sec, nanosec)
    memcpy(buf + 12, &value, 8)   # offset 8 after the encapsulation header: 8-aligned
    return PyBytes_FromStringAndSize(buf, 20)


cnp.import_array()


cdef bint _size_arrays(dict outputs, dict type_codes, list arrays, list names, list codes,
                       Py_ssize_t* pos) except -1:
    """Pass 1 of writing ``outputs`` as ``Tensor``s from ``pos``: each checked for the fast
    path (see :func:`write_outputs`) and appended to ``arrays``/``names``/``codes``, ``pos``
    moved past its room. False (the lists partly filled) where one does not qualify."""
    cdef cnp.ndarray a
    cdef Py_ssize_t j, rank
    for name, v in outputs.items():
        if type(v) is not cnp.ndarray or type(name) is not str:
            return False
        a = <cnp.ndarray>v
        code = type_codes.get(cnp.PyArray_TYPE(a))
        if code is None or not cnp.PyArray_IS_C_CONTIGUOUS(a) or not cnp.PyArray_ISNOTSWAPPED(a):
            return False
        rank = cnp.PyArray_NDIM(a)
        if rank > 255 or cnp.PyArray_NBYTES(a) > 0xFFFFFFFF:
            return False
        for j in range(rank):
            if cnp.PyArray_DIMS(a)[j] > 0xFFFFFFFF:
                return False
        bname = (<str>name).encode()
        arrays.append(a)
        names.append(bname)
        codes.append(code)
        pos[0] = _size_tensor(pos[0], len(<bytes>bname), rank, rank, cnp.PyArray_NBYTES(a))
    return True


cdef Py_ssize_t _put_arrays(char* b, Py_ssize_t pos, list arrays, list names, list codes):
    """Pass 2: the arrays :func:`_size_arrays` took, written as ``Tensor``s at ``pos`` (``b``:
    the byte after the encapsulation header) as ``tensor_codec.fill_tensor`` would (C-order
    strides, a dimension of 0 counted as 1); the position after them."""
    cdef cnp.ndarray a
    cdef cnp.npy_intp* d
    cdef uint64_t acc
    cdef uint32_t dims[255]
    cdef uint64_t strides[255]
    cdef Py_ssize_t i, j, rank
    for i in range(len(arrays)):
        a = <cnp.ndarray>arrays[i]
        rank = cnp.PyArray_NDIM(a)
        d = cnp.PyArray_DIMS(a)
        acc = <uint64_t>cnp.PyArray_ITEMSIZE(a)
        for j in range(rank - 1, -1, -1):  # contiguous_strides: a dimension of 0 counts 1
            dims[j] = <uint32_t>d[j]
            strides[j] = acc
            acc *= <uint64_t>(d[j] if d[j] > 1 else 1)
        pos = _put_tensor(b, pos, names[i], rank, dims, <int32_t>codes[i], rank, strides,
                          cnp.PyArray_DATA(a), cnp.PyArray_NBYTES(a))
    return pos


@cython.boundscheck(False)
@cython.wraparound(False)
def write_outputs(int sec, unsigned int nanosec, bytes frame_id, dict outputs,
                  dict type_codes):
    """``write_tensor_list`` for a dict ``{name: array}`` of outputs, each written as
    ``tensor_codec.fill_tensor`` would (strides filled in, C order), straight from the
    arrays through numpy's C API: no Python per tensor (on the data path, after an idle
    moment, the Python version cost ~70 us a frame on the dev VM, this a few). None,
    and nothing written, unless every value is a C-contiguous, native-byte-order numpy
    array whose type number is in ``type_codes`` (``{dtype.num: Tensor data_type}``) and
    whose name is a ``str``, rank, dimensions and size fit the wire: the caller then takes
    the general path (``tensor_codec.tensor_list_cdr``)."""
    cdef Py_ssize_t pos
    cdef list arrays = [], names = [], codes = []
    if not _HOST_LE:
        return None
    pos = _size_head(len(frame_id))
    if not _size_arrays(outputs, type_codes, arrays, names, codes, &pos):
        return None
    out = _new_list(pos, sec, nanosec, frame_id, len(arrays), &pos)
    _put_arrays(PyBytes_AS_STRING(out) + 4, pos, arrays, names, codes)
    return out


cdef Py_ssize_t _lay_response(char* b, bytes frame_id, bytes rid, uint8_t status,
                              tuple texts, double kappa, double quality, tuple timings,
                              Py_ssize_t n) except -1:
    """An ``InferResponse`` up to and including its tensor count ``n``, at ``b`` (the byte
    after the encapsulation header; NULL: sized only); where the tensors go."""
    cdef Py_ssize_t p = _put_str(b, 8, frame_id, len(frame_id))
    p = _put_str(b, p, rid, len(rid))
    p = _put8(b, p, status)
    for sv in texts:  # code, message, model, served_model
        p = _put_str(b, p, sv, len(<bytes>sv))
    p = _put64(b, p, kappa)
    p = _put64(b, p, quality)
    p = _put64(b, p, timings[0])  # queueing_ms, compute_ms, total_ms
    p = _put64(b, p, timings[1])
    p = _put64(b, p, timings[2])
    p = _put32(b, p, <uint32_t>timings[3])  # preempted, kernels_padded
    p = _put32(b, p, <uint32_t>timings[4])
    p = _put8(b, p, 1 if timings[5] else 0)  # has_deadline, deadline_met
    p = _put8(b, p, 1 if timings[6] else 0)
    return _put32(b, p, <uint32_t>n)


@cython.boundscheck(False)
@cython.wraparound(False)
def write_infer_response(int sec, unsigned int nanosec, bytes frame_id, bytes rid,
                         int status, bytes code, bytes message, bytes model, bytes served,
                         double kappa, double quality, tuple timings, dict outputs,
                         dict type_codes):
    """A serialised ``av_infer_msgs/InferResponse`` (little-endian XCDR1): the header, the
    strings (UTF-8 bytes, no NUL), ``status``, κ and quality, ``timings`` in message order
    ``(queueing_ms, compute_ms, total_ms, preempted, kernels_padded, has_deadline,
    deadline_met)`` and ``outputs`` (``{name: array}``, possibly empty) written as
    :func:`write_outputs` writes them, one copy each. None, and nothing written, where an
    output does not qualify for that (the caller then builds the message), or off a
    little-endian host. OverflowError for a ``preempted``/``kernels_padded`` outside
    ``uint32``."""
    cdef Py_ssize_t pos
    cdef list arrays = [], names = [], codes = []
    if not _HOST_LE:
        return None
    texts = (code, message, model, served)
    pos = _lay_response(NULL, frame_id, rid, <uint8_t>status, texts, kappa, quality,
                        timings, 0)
    if not _size_arrays(outputs, type_codes, arrays, names, codes, &pos):
        return None
    out = PyBytes_FromStringAndSize(NULL, pos + 4)
    cdef char* b = PyBytes_AS_STRING(out)
    _put_start(b, sec, nanosec)
    pos = _lay_response(b + 4, frame_id, rid, <uint8_t>status, texts, kappa, quality,
                        timings, len(arrays))
    _put_arrays(b + 4, pos, arrays, names, codes)
    return out


cdef Py_ssize_t _lay_request(char* b, bytes frame_id, tuple texts, int8_t priority,
                             int32_t d_sec, uint32_t d_ns, bint drop_late, int32_t h_sec,
                             uint32_t h_ns, bytes variant_group, Py_ssize_t n) except -1:
    """An ``InferRequest`` up to and including its tensor count ``n``, at ``b`` (the byte
    after the encapsulation header; NULL: sized only); where the tensors go."""
    cdef Py_ssize_t p = _put_str(b, 8, frame_id, len(frame_id))
    for sv in texts:  # id, model, client
        p = _put_str(b, p, sv, len(<bytes>sv))
    p = _put8(b, p, <uint8_t>priority)
    p = _put32(b, p, <uint32_t>d_sec)
    p = _put32(b, p, d_ns)
    p = _put8(b, p, 1 if drop_late else 0)
    p = _put32(b, p, <uint32_t>h_sec)
    p = _put32(b, p, h_ns)
    p = _put_str(b, p, variant_group, len(variant_group))
    return _put32(b, p, <uint32_t>n)


@cython.boundscheck(False)
@cython.wraparound(False)
def write_infer_request(int sec, unsigned int nanosec, bytes frame_id, bytes rid, bytes model,
                        bytes client, int priority, tuple deadline, bint drop_late,
                        tuple hard_deadline, bytes variant_group, dict inputs,
                        dict type_codes):
    """A serialised ``av_infer_msgs/InferRequest`` (little-endian XCDR1): the header, the
    strings (UTF-8 bytes, no NUL), ``priority`` (``int8``), the two durations as ``(sec,
    nanosec)``, ``drop_late`` and ``inputs`` (``{name: array}``) written as
    :func:`write_outputs` writes outputs, one copy each. None, and nothing written, where
    an input does not qualify for that (the caller then builds the message), or off a
    little-endian host. OverflowError for a duration field outside its C type."""
    cdef Py_ssize_t pos
    cdef list arrays = [], names = [], codes = []
    cdef int32_t d_sec, h_sec
    cdef uint32_t d_ns, h_ns
    cdef int8_t prio = priority
    if not _HOST_LE:
        return None
    d_sec, d_ns = deadline[0], deadline[1]
    h_sec, h_ns = hard_deadline[0], hard_deadline[1]
    texts = (rid, model, client)
    pos = _lay_request(NULL, frame_id, texts, prio, d_sec, d_ns, drop_late, h_sec, h_ns,
                       variant_group, 0)
    if not _size_arrays(inputs, type_codes, arrays, names, codes, &pos):
        return None
    out = PyBytes_FromStringAndSize(NULL, pos + 4)
    cdef char* b = PyBytes_AS_STRING(out)
    _put_start(b, sec, nanosec)
    pos = _lay_request(b + 4, frame_id, texts, prio, d_sec, d_ns, drop_late, h_sec, h_ns,
                       variant_group, len(arrays))
    _put_arrays(b + 4, pos, arrays, names, codes)
    return out


cdef double _ZERO36[36]
memset(_ZERO36, 0, sizeof(_ZERO36))


@cython.boundscheck(False)
@cython.wraparound(False)
cdef Py_ssize_t _lay_detections(char* b, int sec, unsigned int nanosec, const char* fid,
                                Py_ssize_t fl, const double[:, ::1] boxes,
                                const double[::1] scores, list labels) except -1:
    """A ``Detection2DArray`` after its stamp, at ``b`` (the byte after the encapsulation
    header; NULL: sized only); the position after it."""
    cdef Py_ssize_t n = boxes.shape[0], i, p = _put_str(b, 8, fid, fl)
    p = _put32(b, p, <uint32_t>n)
    for i in range(n):
        p = _put32(b, p, <uint32_t>sec)  # each detection's header
        p = _put32(b, p, nanosec)
        p = _put_str(b, p, fid, fl)
        p = _put32(b, p, 1)  # one result: hypothesis (class_id, score), pose
        lab = <bytes>labels[i]
        p = _put_str(b, p, lab, len(lab))
        p = _put64(b, p, scores[i])
        for _ in range(6):   # position x, y, z; orientation x, y, z
            p = _put64(b, p, 0.0)
        p = _put64(b, p, 1.0)  # orientation w
        if b != NULL:  # covariance, float64[36] (8-aligned after w)
            memcpy(b + p, _ZERO36, sizeof(_ZERO36))
        p += sizeof(_ZERO36)
        p = _put64(b, p, (boxes[i, 0] + boxes[i, 2]) * 0.5)  # bbox centre x, y, theta
        p = _put64(b, p, (boxes[i, 1] + boxes[i, 3]) * 0.5)
        p = _put64(b, p, 0.0)
        p = _put64(b, p, boxes[i, 2] - boxes[i, 0])  # bbox size x, y
        p = _put64(b, p, boxes[i, 3] - boxes[i, 1])
        p = _put_str(b, p, b"", 0)  # id
    return p


def write_detections(int sec, unsigned int nanosec, bytes frame_id, const double[:, ::1] boxes,
                     const double[::1] scores, list labels):
    """A serialised ``vision_msgs/Detection2DArray`` (little-endian XCDR1) laid out as
    ``nodes.detections.detections_msg`` builds it: the header ``(sec, nanosec, frame_id)``
    on the array and on every ``Detection2D``, one ``ObjectHypothesisWithPose`` per box
    (``class_id`` the label: UTF-8 bytes, no NUL; ``score``; the pose zero with the
    identity orientation ``w = 1`` and a zero covariance), the box (``boxes`` rows ``x1, y1,
    x2, y2``) as its centre (``theta`` 0) and size, and an empty ``id``. ValueError when the
    three lengths differ or off a little-endian host."""
    cdef Py_ssize_t n = boxes.shape[0], fl = len(frame_id)
    cdef const char* fid = frame_id
    if not _HOST_LE:
        raise ValueError("write_detections writes little-endian CDR from a little-endian host")
    if boxes.shape[1] != 4 or scores.shape[0] != n or len(labels) != n:
        raise ValueError(f"{n} boxes (of 4 values each), {scores.shape[0]} scores and "
                         f"{len(labels)} labels")
    out = PyBytes_FromStringAndSize(
        NULL, _lay_detections(NULL, sec, nanosec, fid, fl, boxes, scores, labels) + 4)
    cdef char* b = PyBytes_AS_STRING(out)
    _put_start(b, sec, nanosec)
    _lay_detections(b + 4, sec, nanosec, fid, fl, boxes, scores, labels)
    return out


cdef Py_ssize_t _put_text(char* b, Py_ssize_t pos, object text) except -1:
    """``text`` (a ``str``) as a CDR string: its UTF-8 (CPython's cached form, no copy
    made) and the NUL; ``UnicodeEncodeError`` for a lone surrogate, ``ValueError`` for a
    NUL inside (a ROS string ends at its first)."""
    cdef Py_ssize_t k
    cdef const char* c
    if not PyUnicode_Check(text):
        raise TypeError(f"a diagnostics text is a str, got {type(text).__name__}")
    c = PyUnicode_AsUTF8AndSize(text, &k)
    if b == NULL and memchr(c, 0, k) != NULL:  # checked once, while sizing
        raise ValueError("a NUL inside a string")
    return _put_str(b, pos, c, k)


cdef inline object _field(object t, Py_ssize_t i, Py_ssize_t n, str what):
    """Item ``i`` of ``t``, a tuple (or a named tuple) of ``n`` items (borrowed, no call)."""
    if not PyTuple_Check(t) or PyTuple_GET_SIZE(t) != n:
        raise TypeError(f"a {what} is a tuple of {n}, got {t!r}")
    return <object>PyTuple_GET_ITEM(t, i)


cdef Py_ssize_t _lay_diagnostics(char* b, const char* fid, Py_ssize_t fl,
                                 list statuses) except -1:
    """A ``DiagnosticArray`` after its stamp, at ``b`` (NULL: sized only); the position
    after it."""
    cdef Py_ssize_t p = _put_str(b, 8, fid, fl), i, j, nv
    cdef list values
    p = _put32(b, p, <uint32_t>len(statuses))
    for i in range(len(statuses)):
        st = statuses[i]
        level = _field(st, 0, 5, "status")
        if not PyBytes_Check(level):
            raise TypeError(f"a status level is bytes, got {type(level).__name__}")
        if PyBytes_GET_SIZE(level) != 1:
            raise ValueError(f"a status level is one byte, got {level!r}")
        p = _put8(b, p, <uint8_t>PyBytes_AS_STRING(level)[0])
        p = _put_text(b, p, <object>PyTuple_GET_ITEM(st, 1))  # name
        p = _put_text(b, p, <object>PyTuple_GET_ITEM(st, 2))  # message
        p = _put_text(b, p, <object>PyTuple_GET_ITEM(st, 3))  # hardware_id
        v = <object>PyTuple_GET_ITEM(st, 4)
        if not PyList_Check(v):
            raise TypeError(f"a status's values are a list, got {type(v).__name__}")
        values = <list>v
        nv = len(values)
        p = _put32(b, p, <uint32_t>nv)
        for j in range(nv):
            kv = values[j]
            p = _put_text(b, p, _field(kv, 0, 2, "key/value"))
            p = _put_text(b, p, <object>PyTuple_GET_ITEM(kv, 1))
    return p


def write_diagnostics(int sec, unsigned int nanosec, bytes frame_id, list statuses):
    """A serialised ``diagnostic_msgs/DiagnosticArray`` (little-endian XCDR1): the header
    ``(sec, nanosec, frame_id)`` and one ``DiagnosticStatus`` per entry of ``statuses``,
    each a tuple ``(level, name, message, hardware_id, values)``: ``level`` a ``bytes`` of
    one byte (as ``DiagnosticStatus.level``), three ``str`` and a list of ``(key, value)``
    ``str`` tuples (``KeyValue``). Strings go as their UTF-8. ``TypeError`` for another
    type, ``ValueError`` for a string holding a NUL or off a little-endian host,
    ``UnicodeEncodeError`` for a lone surrogate (``nodes.diagnostics`` escapes both and
    writes again)."""
    cdef Py_ssize_t fl = len(frame_id)
    cdef const char* fid = frame_id
    if not _HOST_LE:
        raise ValueError("write_diagnostics writes little-endian CDR from a little-endian host")
    if memchr(fid, 0, fl) != NULL:
        raise ValueError("a NUL inside the frame id")
    out = PyBytes_FromStringAndSize(NULL, _lay_diagnostics(NULL, fid, fl, statuses) + 4)
    cdef char* b = PyBytes_AS_STRING(out)
    _put_start(b, sec, nanosec)
    _lay_diagnostics(b + 4, fid, fl, statuses)
    return out
