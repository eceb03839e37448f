"""The CUDA emulator's driver half (av_infer/devices/cuda_emu/driver.c, docs/cuda_emu.md §2).

Everything goes through ctypes against the built ``libavi_cuda_emu.so`` and a small kernel
module compiled here from C (the kernel half is not used). No GPU is needed. Kernels that
wait on a host-controlled word make the "still pending" states deterministic; every such
wait has a timeout inside the kernel, so a driver bug fails a test instead of hanging it.
No assertion depends on timing.
"""

from __future__ import annotations

import ctypes
import struct
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from av_infer.devices.cuda_emu.driver import DriverBuildError, build_driver, find_cc
from tests.checks import require

CUDA_SUCCESS = 0
INVALID_VALUE = 1
INVALID_IMAGE = 200
INVALID_HANDLE = 400
NOT_FOUND = 500
NOT_READY = 600
LAUNCH_FAILED = 719
NOT_SUPPORTED = 801
CU_EVENT_DISABLE_TIMING = 2
KERNEL_TIMEOUT_S = 30  # a waiting kernel gives up after this (marks out[0] = 2)
JOIN_TIMEOUT_S = 120

N_MANY = 70  # parameters of `sum70`: more than the driver's first size buffer (64)

_MODULE_C = r"""
#define _POSIX_C_SOURCE 200809L
#include <stddef.h>
#include <stdint.h>
#include <time.h>
#define EXP __attribute__((visibility("default")))
#define KARGS void** p, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, \
              unsigned bz, unsigned smem
#define UNUSED (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)smem
#define SIZES(name, ...)                                                               \
    EXP int avi_emuparams_##name(unsigned long long* s, int max) {                     \
        const unsigned long long z[] = {__VA_ARGS__};                                  \
        int n = (int)(sizeof z / sizeof z[0]);                                         \
        for (int i = 0; i < n && i < max; ++i) s[i] = z[i];                            \
        return n;                                                                      \
    }
#define ARG(i, T) (*(T*)p[i])

EXP int avi_emu_abi_version(void) { return ABI; }

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* log[0] = count, log[1 + i] = i-th appended value */
EXP int avi_emu_append(KARGS) {
    UNUSED;
    uint32_t* log = ARG(0, uint32_t*);
    uint32_t n = __atomic_load_n(&log[0], __ATOMIC_SEQ_CST);
    log[1 + n] = ARG(1, uint32_t);
    __atomic_store_n(&log[0], n + 1, __ATOMIC_SEQ_CST);
    return 0;
}
SIZES(append, sizeof(uint32_t*), sizeof(uint32_t))

/* spin until *word == expected: out[0] = 1 (or 2 after a timeout), out[1] = *probe then */
EXP int avi_emu_wait_word(KARGS) {
    UNUSED;
    const uint32_t* word = ARG(0, const uint32_t*);
    uint32_t expected = ARG(1, uint32_t);
    uint32_t* out = ARG(2, uint32_t*);
    const uint32_t* probe = ARG(3, const uint32_t*);
    double t0 = now_s();
    int ok = 1;
    while (__atomic_load_n(word, __ATOMIC_SEQ_CST) != expected) {
        if (now_s() - t0 > TIMEOUT) { ok = 0; break; }
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
    out[1] = __atomic_load_n(probe, __ATOMIC_SEQ_CST);
    __atomic_store_n(&out[0], ok ? 1u : 2u, __ATOMIC_SEQ_CST);
    return 0;
}
SIZES(wait_word, sizeof(void*), sizeof(uint32_t), sizeof(void*), sizeof(void*))

EXP int avi_emu_set_word(KARGS) {
    UNUSED;
    __atomic_store_n(ARG(0, uint32_t*), ARG(1, uint32_t), __ATOMIC_SEQ_CST);
    return 0;
}
SIZES(set_word, sizeof(uint32_t*), sizeof(uint32_t))

EXP int avi_emu_read_word(KARGS) {
    UNUSED;
    *ARG(1, uint32_t*) = __atomic_load_n(ARG(0, const uint32_t*), __ATOMIC_SEQ_CST);
    return 0;
}
SIZES(read_word, sizeof(const uint32_t*), sizeof(uint32_t*))

EXP int avi_emu_fail(KARGS) {
    UNUSED;
    (void)p;
    return 1;
}
EXP int avi_emuparams_fail(unsigned long long* s, int max) { (void)s; (void)max; return 0; }

typedef struct { uint32_t a[12]; } Big;
/* out[0..11] = big.a, out[12] = c, out[13] = 1 if every value is 64-byte aligned */
EXP int avi_emu_capture(KARGS) {
    UNUSED;
    Big big = ARG(0, Big);
    uint32_t* out = ARG(1, uint32_t*);
    for (int i = 0; i < 12; ++i) out[i] = big.a[i];
    out[12] = ARG(2, uint8_t);
    out[13] = ((uintptr_t)p[0] % 64 == 0) && ((uintptr_t)p[1] % 64 == 0) &&
              ((uintptr_t)p[2] % 64 == 0);
    return 0;
}
SIZES(capture, sizeof(Big), sizeof(uint32_t*), sizeof(uint8_t))

EXP int avi_emu_geom(KARGS) {
    uint32_t* out = ARG(0, uint32_t*);
    out[0] = gx, out[1] = gy, out[2] = gz, out[3] = bx, out[4] = by, out[5] = bz;
    out[6] = smem;
    return 0;
}
SIZES(geom, sizeof(uint32_t*))

/* module-private state: a second load of the module is a separate instance */
static uint32_t calls;
EXP int avi_emu_count_calls(KARGS) {
    UNUSED;
    *ARG(0, uint32_t*) = ++calls;
    return 0;
}
/* the kernel half's spelling of the size function */
EXP int avi_emuparams_count_calls(unsigned long long* s, int cap) {
    if (cap > 0) s[0] = sizeof(uint32_t*);
    return 1;
}

/* a kernel without a size function: found, but cannot be launched */
EXP int avi_emu_nosizes(KARGS) { UNUSED; (void)p; return 0; }

/* the dispatcher's calling convention: (const unsigned* flag, struct by value) */
typedef struct { uint32_t* log; uint32_t value; uint32_t pad; } DkArgs;
EXP int avi_emu_dk(KARGS) {
    UNUSED;
    const uint32_t* flag = ARG(0, const uint32_t*);
    DkArgs a = ARG(1, DkArgs);
    uint32_t n = a.log[0];
    a.log[1 + n] = a.value + 1000u * __atomic_load_n(flag, __ATOMIC_SEQ_CST);
    __atomic_store_n(&a.log[0], n + 1, __ATOMIC_SEQ_CST);
    return 0;
}
SIZES(dk, sizeof(const uint32_t*), sizeof(DkArgs))
"""


def _sum70_source() -> str:
    args = " + ".join(f"ARG({i}, uint32_t)" for i in range(N_MANY))
    sizes = ", ".join(["sizeof(uint32_t)"] * N_MANY + ["sizeof(uint32_t*)"])
    return (f"EXP int avi_emu_sum70(KARGS) {{ UNUSED; *ARG({N_MANY}, uint32_t*) = {args}; "
            f"return 0; }}\nSIZES(sum70, {sizes})\n")


# -- fixtures ------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def cc() -> str:
    """The host C compiler. The emulator must build in CI (CI=true): a missing compiler
    fails there; elsewhere the tests skip with the reason."""
    return require(find_cc(), "no host C compiler (gcc/cc on PATH, or set CC) for the CUDA "
                   "emulator driver")


@pytest.fixture(scope="session")
def build_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cuda_emu")


@pytest.fixture(scope="session")
def driver_path(cc: str, build_dir: Path) -> Path:
    return build_driver(build_dir / "cache")


def _compile_module(cc: str, out: Path, abi: int = 1, extra: str = "") -> bytes:
    src = out.with_suffix(".c")
    src.write_text(_MODULE_C + _sum70_source() + extra)
    res = subprocess.run([cc, "-O1", "-std=c11", "-shared", "-fPIC", f"-DABI={abi}",
                          f"-DTIMEOUT={KERNEL_TIMEOUT_S}", "-o", str(out), str(src)],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    return out.read_bytes()


@pytest.fixture(scope="session")
def module_image(cc: str, build_dir: Path) -> bytes:
    return _compile_module(cc, build_dir / "mod.so")


class Emu:
    """ctypes view of the driver with every used prototype declared."""

    def __init__(self, path: Path) -> None:
        L = self.lib = ctypes.CDLL(str(path))
        vp, u, i, sz = ctypes.c_void_p, ctypes.c_uint, ctypes.c_int, ctypes.c_size_t
        ull = ctypes.c_ulonglong
        pvp = ctypes.POINTER(vp)
        protos = {
            "cuInit": [u],
            "cuGetErrorString": [i, ctypes.POINTER(ctypes.c_char_p)],
            "cuGetErrorName": [i, ctypes.POINTER(ctypes.c_char_p)],
            "cuCtxGetCurrent": [pvp],
            "cuCtxSetCurrent": [vp],
            "cuCtxSynchronize": [],
            "cuCtxGetStreamPriorityRange": [ctypes.POINTER(i), ctypes.POINTER(i)],
            "cuModuleLoadData": [pvp, ctypes.c_char_p],
            "cuModuleUnload": [vp],
            "cuModuleGetFunction": [pvp, vp, ctypes.c_char_p],
            "cuFuncGetAttribute": [ctypes.POINTER(i), i, vp],
            "cuFuncSetAttribute": [vp, i, i],
            "cuOccupancyMaxActiveBlocksPerMultiprocessor": [ctypes.POINTER(i), vp, i, sz],
            "cuStreamCreate": [pvp, u],
            "cuStreamCreateWithPriority": [pvp, u, i],
            "cuStreamGetPriority": [vp, ctypes.POINTER(i)],
            "cuStreamDestroy_v2": [vp],
            "cuStreamDestroy": [vp],
            "cuStreamSynchronize": [vp],
            "cuStreamQuery": [vp],
            "cuStreamWaitEvent": [vp, vp, u],
            "cuStreamWriteValue32": [vp, ull, ctypes.c_uint32, u],
            "cuStreamWriteValue32_v2": [vp, ull, ctypes.c_uint32, u],
            "cuMemsetD32Async": [ull, u, sz, vp],
            "cuMemsetD32_v2": [ull, u, sz],
            "cuMemAlloc_v2": [ctypes.POINTER(ull), sz],
            "cuMemFree_v2": [ull],
            "cuMemcpyHtoD_v2": [ull, vp, sz],
            "cuMemcpyDtoH_v2": [vp, ull, sz],
            "cuEventCreate": [pvp, u],
            "cuEventDestroy_v2": [vp],
            "cuEventRecord": [vp, vp],
            "cuEventQuery": [vp],
            "cuEventSynchronize": [vp],
            "cuEventElapsedTime": [ctypes.POINTER(ctypes.c_float), vp, vp],
            "cuLaunchKernel": [vp, u, u, u, u, u, u, u, vp, vp, vp],
        }
        for name, args in protos.items():
            fn = getattr(L, name)
            fn.argtypes = args
            fn.restype = ctypes.c_int
        L.avi_emu_driver_last_error.argtypes = []
        L.avi_emu_driver_last_error.restype = ctypes.c_char_p

    def __getattr__(self, name: str) -> Any:
        return getattr(self.lib, name)

    def ok(self, rc: int, what: str = "") -> None:
        assert rc == CUDA_SUCCESS, f"{what}: CUresult {rc} ({self.last_error()})"

    def last_error(self) -> str:
        return self.lib.avi_emu_driver_last_error().decode()

    def load(self, image: bytes) -> int:
        m = ctypes.c_void_p()
        self.ok(self.cuModuleLoadData(ctypes.byref(m), image), "cuModuleLoadData")
        return m.value

    def func(self, module: int, name: str) -> int:
        f = ctypes.c_void_p()
        self.ok(self.cuModuleGetFunction(ctypes.byref(f), module, name.encode()), name)
        return f.value

    def stream(self, prio: int | None = None) -> int:
        s = ctypes.c_void_p()
        rc = (self.cuStreamCreate(ctypes.byref(s), 1) if prio is None
              else self.cuStreamCreateWithPriority(ctypes.byref(s), 1, prio))
        self.ok(rc, "cuStreamCreate")
        return s.value

    def event(self, flags: int = 0) -> int:
        e = ctypes.c_void_p()
        self.ok(self.cuEventCreate(ctypes.byref(e), flags), "cuEventCreate")
        return e.value

    def launch_rc(self, f: int, stream: int | None, *params: Any, grid=(1, 1, 1),
                  block=(1, 1, 1), smem: int = 0, extra: Any = None) -> int:
        arr = (ctypes.c_void_p * max(len(params), 1))(*[ctypes.addressof(p) for p in params])
        return self.cuLaunchKernel(f, *grid, *block, smem, stream, arr, extra)

    def launch(self, f: int, stream: int | None, *params: Any, **kw: Any) -> None:
        self.ok(self.launch_rc(f, stream, *params, **kw), "cuLaunchKernel")


def ptr(buf: ctypes.Array, index: int = 0) -> ctypes.c_void_p:
    """A by-value pointer parameter to element ``index`` of a ctypes uint32 array."""
    return ctypes.c_void_p(ctypes.addressof(buf) + 4 * index)


def u32(v: int) -> ctypes.c_uint32:
    return ctypes.c_uint32(v)


def words(n: int) -> ctypes.Array:
    return (ctypes.c_uint32 * n)()


def log_values(log: ctypes.Array) -> list[int]:
    return list(log[1:1 + log[0]])


@pytest.fixture(scope="session")
def emu(driver_path: Path) -> Emu:
    e = Emu(driver_path)
    e.ok(e.cuInit(0), "cuInit")
    return e


@pytest.fixture(scope="session")
def mod(emu: Emu, module_image: bytes) -> int:
    return emu.load(module_image)


@pytest.fixture(scope="session")
def K(emu: Emu, mod: int) -> dict[str, int]:
    names = ("append", "wait_word", "set_word", "read_word", "fail", "capture", "geom",
             "count_calls", "nosizes", "sum70", "dk")
    return {n: emu.func(mod, n) for n in names}


@pytest.fixture
def stream(emu: Emu):
    s = emu.stream()
    yield s
    emu.cuStreamDestroy_v2(s)


class Gate:
    """A host word a `wait_word` kernel spins on; open() lets it finish."""

    def __init__(self, emu: Emu, K: dict[str, int], probe: ctypes.Array | None = None) -> None:
        self.word = words(1)
        self.out = words(2)
        self.emu, self.K = emu, K
        self.probe = probe if probe is not None else self.word

    def block(self, stream: int | None) -> None:
        self.emu.launch(self.K["wait_word"], stream, ptr(self.word), u32(1), ptr(self.out),
                        ptr(self.probe))

    def open(self) -> None:
        self.word[0] = 1

    @property
    def timed_out(self) -> bool:
        return self.out[0] == 2


# -- build ---------------------------------------------------------------------------------
def test_build_is_cached_and_atomic(cc: str, tmp_path: Path) -> None:
    p1 = build_driver(tmp_path)
    mtime = p1.stat().st_mtime_ns
    p2 = build_driver(tmp_path)
    assert p1 == p2 and p2.stat().st_mtime_ns == mtime
    assert p1.name.startswith("libavi_cuda_emu") and p1.suffix == ".so"
    assert [p.name for p in tmp_path.iterdir()] == [p1.name]  # no temp file left


def test_build_error_names_compiler_output(cc: str, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    bad = tmp_path / "driver.c"
    bad.write_text("int broken( {\n")
    monkeypatch.setattr("av_infer.devices.cuda_emu.driver.DRIVER_SOURCE", bad)
    with pytest.raises(DriverBuildError, match="driver.c") as ei:
        build_driver(tmp_path / "c")
    assert "error" in str(ei.value)
    assert not any((tmp_path / "c").iterdir())


def test_default_cache_dir(cc: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AV_INFER_CUDA_CACHE", str(tmp_path))
    assert build_driver().parent == tmp_path / "emu"


# -- context, errors -------------------------------------------------------------------------
def test_context_and_priorities(emu: Emu) -> None:
    ctx = ctypes.c_void_p()
    emu.ok(emu.cuCtxGetCurrent(ctypes.byref(ctx)))
    assert ctx.value
    emu.ok(emu.cuCtxSetCurrent(ctx))
    lo, hi = ctypes.c_int(9), ctypes.c_int(9)
    emu.ok(emu.cuCtxGetStreamPriorityRange(ctypes.byref(lo), ctypes.byref(hi)))
    assert (lo.value, hi.value) == (0, -5)
    s = emu.stream(prio=-100)
    p = ctypes.c_int()
    emu.ok(emu.cuStreamGetPriority(s, ctypes.byref(p)))
    assert p.value == -5
    emu.ok(emu.cuStreamDestroy_v2(s))


@pytest.mark.parametrize("code,name,text", [
    (0, "CUDA_SUCCESS", "no error"),
    (1, "CUDA_ERROR_INVALID_VALUE", "invalid argument"),
    (200, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"),
    (400, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"),
    (500, "CUDA_ERROR_NOT_FOUND", "named symbol not found"),
    (600, "CUDA_ERROR_NOT_READY", "device not ready"),
    (719, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"),
    (801, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"),
])
def test_error_strings(emu: Emu, code: int, name: str, text: str) -> None:
    s = ctypes.c_char_p()
    emu.ok(emu.cuGetErrorString(code, ctypes.byref(s)))
    assert s.value.decode() == text
    emu.ok(emu.cuGetErrorName(code, ctypes.byref(s)))
    assert s.value.decode() == name


def test_unknown_error_code(emu: Emu) -> None:
    s = ctypes.c_char_p(b"x")
    assert emu.cuGetErrorString(123456, ctypes.byref(s)) == INVALID_VALUE
    assert s.value is None


# -- modules ---------------------------------------------------------------------------------
def test_module_load_errors(emu: Emu, cc: str, module_image: bytes, tmp_path: Path) -> None:
    m = ctypes.c_void_p()
    assert emu.cuModuleLoadData(ctypes.byref(m), b"\0" * 256) == INVALID_IMAGE
    assert emu.cuModuleLoadData(ctypes.byref(m), b"not an ELF image" * 16) == INVALID_IMAGE
    exe = bytearray(module_image)
    exe[16:18] = struct.pack("<H", 2)  # e_type = ET_EXEC
    assert emu.cuModuleLoadData(ctypes.byref(m), bytes(exe)) == INVALID_IMAGE
    wrong_abi = _compile_module(cc, tmp_path / "abi2.so", abi=2)
    assert emu.cuModuleLoadData(ctypes.byref(m), wrong_abi) == INVALID_IMAGE
    assert "abi_version" in emu.last_error()


def test_module_size_from_elf_header(emu: Emu, module_image: bytes) -> None:
    """Bytes after the ELF image are not part of it (as after a cubin)."""
    m = emu.load(module_image + b"\xff" * 4096)
    emu.ok(emu.cuModuleUnload(m))


def test_function_lookup_and_attributes(emu: Emu, mod: int, K: dict[str, int]) -> None:
    f = ctypes.c_void_p()
    assert emu.cuModuleGetFunction(ctypes.byref(f), mod, b"missing") == NOT_FOUND
    assert emu.func(mod, "append") == K["append"]  # same name, same handle
    v = ctypes.c_int()
    for attr, want in ((0, 1024), (1, 0), (2, 0), (3, 0), (4, 32), (8, 49152), (9, -1)):
        emu.ok(emu.cuFuncGetAttribute(ctypes.byref(v), attr, K["append"]), str(attr))
        assert v.value == want, attr
    assert emu.cuFuncGetAttribute(ctypes.byref(v), 99, K["append"]) == INVALID_VALUE
    for threads, want in ((1, 32), (32, 32), (64, 32), (128, 16), (256, 8), (1024, 2),
                          (2048, 0)):
        emu.ok(emu.cuOccupancyMaxActiveBlocksPerMultiprocessor(ctypes.byref(v), K["append"],
                                                               threads, 0))
        assert v.value == want, threads


def test_module_instances_and_unload_with_pending_work(emu: Emu, module_image: bytes,
                                                       K: dict[str, int], stream: int) -> None:
    m1, m2 = emu.load(module_image), emu.load(module_image)
    c1, c2 = emu.func(m1, "count_calls"), emu.func(m2, "count_calls")
    out = words(4)
    emu.launch(c1, stream, ptr(out, 0))
    emu.launch(c1, stream, ptr(out, 1))
    emu.launch(c2, stream, ptr(out, 2))
    emu.ok(emu.cuStreamSynchronize(stream))
    assert list(out[:3]) == [1, 2, 1]  # separate statics per load
    gate = Gate(emu, K)
    gate.block(stream)
    log = words(4)
    emu.launch(emu.func(m2, "append"), stream, ptr(log), u32(5))
    emu.ok(emu.cuModuleUnload(m2))  # the pending launch keeps the module loaded
    assert emu.cuModuleUnload(m2) == INVALID_HANDLE
    gate.open()
    emu.ok(emu.cuStreamSynchronize(stream))
    assert not gate.timed_out and log_values(log) == [5]
    emu.ok(emu.cuModuleUnload(m1))


# -- launches --------------------------------------------------------------------------------
def test_in_order_within_a_stream(emu: Emu, K: dict[str, int], stream: int) -> None:
    log = words(256)
    gate = Gate(emu, K)
    gate.block(stream)  # everything below is queued behind it
    for v in range(200):
        emu.launch(K["append"], stream, ptr(log), u32(v))
    assert emu.cuStreamQuery(stream) == NOT_READY
    assert log[0] == 0
    gate.open()
    emu.ok(emu.cuStreamSynchronize(stream))
    assert log_values(log) == list(range(200))
    assert emu.cuStreamQuery(stream) == CUDA_SUCCESS


def test_streams_run_concurrently(emu: Emu, K: dict[str, int]) -> None:
    s1, s2 = emu.stream(), emu.stream()
    word, out = words(1), words(2)
    # A spins on stream 1 until B, launched after it on stream 2, sets the word
    emu.launch(K["wait_word"], s1, ptr(word), u32(7), ptr(out), ptr(word))
    emu.launch(K["set_word"], s2, ptr(word), u32(7))
    emu.ok(emu.cuStreamSynchronize(s1))
    emu.ok(emu.cuStreamSynchronize(s2))
    assert list(out) == [1, 7], "kernel A timed out: streams did not run concurrently"
    emu.ok(emu.cuStreamDestroy_v2(s1))
    emu.ok(emu.cuStreamDestroy_v2(s2))


def test_null_stream(emu: Emu, K: dict[str, int]) -> None:
    log = words(8)
    emu.launch(K["append"], None, ptr(log), u32(1))
    emu.launch(K["append"], 1, ptr(log), u32(2))  # CU_STREAM_LEGACY: the same stream
    emu.ok(emu.cuStreamSynchronize(None))
    assert log_values(log) == [1, 2]
    assert emu.cuStreamDestroy_v2(None) == INVALID_HANDLE


def test_geometry_and_launch_validation(emu: Emu, K: dict[str, int], stream: int) -> None:
    out = words(8)
    emu.launch(K["geom"], stream, ptr(out), grid=(3, 4, 5), block=(8, 4, 2), smem=123)
    emu.ok(emu.cuStreamSynchronize(stream))
    assert list(out[:7]) == [3, 4, 5, 8, 4, 2, 123]
    bad = [dict(grid=(0, 1, 1)), dict(block=(1, 0, 1)), dict(block=(1025, 1, 1)),
           dict(block=(32, 32, 2)), dict(block=(1, 1, 65)), dict(grid=(1, 65536, 1)),
           dict(smem=49153)]
    for kw in bad:
        assert emu.launch_rc(K["geom"], stream, ptr(out), **kw) == INVALID_VALUE, kw
    emu.ok(emu.cuFuncSetAttribute(K["geom"], 8, 65536))
    emu.launch(K["geom"], stream, ptr(out), smem=65536)
    emu.ok(emu.cuStreamSynchronize(stream))
    assert out[6] == 65536
    emu.ok(emu.cuFuncSetAttribute(K["geom"], 8, 49152))
    extra = (ctypes.c_void_p * 1)()
    assert emu.launch_rc(K["geom"], stream, ptr(out), extra=extra) == NOT_SUPPORTED
    assert emu.launch_rc(K["nosizes"], stream) == NOT_SUPPORTED
    assert "avi_emuparams_nosizes" in emu.last_error()
    assert emu.cuLaunchKernel(K["geom"], 1, 1, 1, 1, 1, 1, 0, stream, None, None) == \
        INVALID_VALUE  # a kernel with parameters needs kernelParams


def test_parameter_values_captured_at_launch(emu: Emu, K: dict[str, int], stream: int) -> None:
    gate = Gate(emu, K)
    gate.block(stream)  # the launch below runs only after we have mutated everything
    big = (ctypes.c_uint32 * 12)(*range(100, 112))
    out, decoy = words(16), words(16)
    out_p, c = ptr(out), ctypes.c_uint8(42)
    arr = (ctypes.c_void_p * 3)(ctypes.addressof(big), ctypes.addressof(out_p),
                               ctypes.addressof(c))
    emu.ok(emu.cuLaunchKernel(K["capture"], 1, 1, 1, 1, 1, 1, 0, stream, arr, None))
    for i in range(12):
        big[i] = 0
    out_p.value = ctypes.addressof(decoy)
    c.value = 7
    arr[0] = arr[1] = arr[2] = None
    gate.open()
    emu.ok(emu.cuStreamSynchronize(stream))
    assert list(out[:12]) == list(range(100, 112))
    assert out[12] == 42 and out[13] == 1  # 64-byte aligned copies
    assert list(decoy) == [0] * 16


def test_more_than_64_parameters(emu: Emu, K: dict[str, int], stream: int) -> None:
    vals = [u32(i + 1) for i in range(N_MANY)]
    out = words(1)
    emu.launch(K["sum70"], stream, *vals, ptr(out))
    emu.ok(emu.cuStreamSynchronize(stream))
    assert out[0] == N_MANY * (N_MANY + 1) // 2


def test_failing_kernel_is_sticky_on_its_stream(emu: Emu, K: dict[str, int]) -> None:
    s, other = emu.stream(), emu.stream()
    log = words(8)
    e1, e2, e3 = emu.event(), emu.event(), emu.event()
    emu.launch(K["append"], s, ptr(log), u32(1))
    emu.ok(emu.cuEventRecord(e1, s))
    emu.launch(K["fail"], s)
    emu.ok(emu.cuEventRecord(e2, s))
    emu.launch(K["append"], s, ptr(log), u32(2))  # skipped: the stream has failed
    emu.ok(emu.cuEventRecord(e3, s))
    assert emu.cuStreamSynchronize(s) == LAUNCH_FAILED
    assert emu.cuStreamQuery(s) == LAUNCH_FAILED
    assert emu.cuEventQuery(e1) == CUDA_SUCCESS  # before the failure
    assert emu.cuEventQuery(e2) == LAUNCH_FAILED
    assert emu.cuEventSynchronize(e3) == LAUNCH_FAILED
    assert log_values(log) == [1]
    assert "fail" in emu.last_error()
    emu.launch(K["append"], other, ptr(log), u32(3))  # other streams are unaffected
    emu.ok(emu.cuStreamSynchronize(other))
    assert emu.cuCtxSynchronize() == LAUNCH_FAILED
    for e in (e1, e2, e3):
        emu.ok(emu.cuEventDestroy_v2(e))
    emu.ok(emu.cuStreamDestroy_v2(s))
    emu.ok(emu.cuStreamDestroy_v2(other))
    emu.ok(emu.cuCtxSynchronize())  # the failed stream is gone


def test_a_copy_keeps_its_calls_when_another_is_open_globally(build_dir: Path,
                                                              module_image: bytes) -> None:
    """Two copies of the driver in one process, the first opened ``RTLD_GLOBAL`` (as the
    vendor path opens the driver for its cuBLASLt/cuDNN entry points): the second copy's
    calls to its own entry points stay in it (``-Bsymbolic``), so a kernel failure on its
    stream is recorded in *its* last error, not the other copy's. Was: with the vendor
    path used earlier in the process, ``test_failing_kernel_is_sticky_on_its_stream``
    read a stale message."""
    first = build_driver(build_dir / "global-copy")
    ctypes.CDLL(str(first), mode=ctypes.RTLD_GLOBAL)
    mine = Emu(build_driver(build_dir / "second-copy"))  # fresh: nothing bound yet
    mine.ok(mine.cuInit(0), "cuInit")
    m = mine.load(module_image)
    s = mine.stream()
    mine.launch(mine.func(m, "fail"), s)
    assert mine.cuStreamSynchronize(s) == LAUNCH_FAILED
    assert "fail" in mine.last_error()
    mine.ok(mine.cuStreamDestroy_v2(s))
    mine.ok(mine.cuModuleUnload(m))


# -- events ----------------------------------------------------------------------------------
def test_event_query_before_and_after(emu: Emu, K: dict[str, int], stream: int) -> None:
    fresh = emu.event()
    emu.ok(emu.cuEventQuery(fresh))  # never recorded: complete
    emu.ok(emu.cuEventSynchronize(fresh))
    gate, e = Gate(emu, K), emu.event()
    gate.block(stream)
    emu.ok(emu.cuEventRecord(e, stream))
    assert emu.cuEventQuery(e) == NOT_READY
    assert emu.cuEventQuery(e) == NOT_READY
    gate.open()
    emu.ok(emu.cuEventSynchronize(e))
    emu.ok(emu.cuEventQuery(e))
    assert not gate.timed_out
    # re-recording replaces the marker: pending again behind a new gate
    gate2 = Gate(emu, K)
    gate2.block(stream)
    emu.ok(emu.cuEventRecord(e, stream))
    assert emu.cuEventQuery(e) == NOT_READY
    gate2.open()
    emu.ok(emu.cuEventSynchronize(e))
    for ev in (e, fresh):
        emu.ok(emu.cuEventDestroy_v2(ev))


def test_stream_wait_event_orders_streams(emu: Emu, K: dict[str, int]) -> None:
    a, b, c = emu.stream(), emu.stream(), emu.stream()
    log = words(8)
    gate, e = Gate(emu, K), emu.event()
    gate.block(a)
    emu.launch(K["append"], a, ptr(log), u32(1))
    emu.ok(emu.cuEventRecord(e, a))
    emu.ok(emu.cuStreamWaitEvent(b, e, 0))
    emu.launch(K["append"], b, ptr(log), u32(2))
    # re-recording e on an idle stream does not release b: it waits for the marker
    # recorded at the time of its cuStreamWaitEvent call
    emu.ok(emu.cuEventRecord(e, c))
    emu.ok(emu.cuStreamSynchronize(c))
    emu.ok(emu.cuEventQuery(e))
    assert emu.cuStreamQuery(b) == NOT_READY
    assert log[0] == 0
    # an event never recorded does not make a stream wait
    never, log2 = emu.event(), words(4)
    emu.ok(emu.cuStreamWaitEvent(c, never, 0))
    emu.launch(K["append"], c, ptr(log2), u32(9))
    emu.ok(emu.cuStreamSynchronize(c))
    assert log_values(log2) == [9]
    gate.open()
    emu.ok(emu.cuStreamSynchronize(b))
    assert log_values(log) == [1, 2] and not gate.timed_out
    emu.ok(emu.cuStreamSynchronize(a))
    for ev in (e, never):
        emu.ok(emu.cuEventDestroy_v2(ev))
    for s in (a, b, c):
        emu.ok(emu.cuStreamDestroy_v2(s))


def test_elapsed_time(emu: Emu, K: dict[str, int], stream: int) -> None:
    start, end = emu.event(), emu.event()
    ms = ctypes.c_float(-1.0)
    assert emu.cuEventElapsedTime(ctypes.byref(ms), start, end) == INVALID_HANDLE  # unrecorded
    gate = Gate(emu, K)
    emu.ok(emu.cuEventRecord(start, stream))
    gate.block(stream)
    emu.ok(emu.cuEventRecord(end, stream))
    assert emu.cuEventElapsedTime(ctypes.byref(ms), start, end) == NOT_READY
    gate.open()
    emu.ok(emu.cuEventSynchronize(end))
    emu.ok(emu.cuEventElapsedTime(ctypes.byref(ms), start, end))
    assert ms.value >= 0.0
    # the time_kernel sequence of CudaDevice
    out = words(8)
    for _ in range(3):
        emu.ok(emu.cuEventRecord(start, stream))
        emu.launch(K["geom"], stream, ptr(out))
        emu.ok(emu.cuEventRecord(end, stream))
        emu.ok(emu.cuEventSynchronize(end))
        emu.ok(emu.cuEventElapsedTime(ctypes.byref(ms), start, end))
        assert ms.value >= 0.0
    nt = emu.event(CU_EVENT_DISABLE_TIMING)
    emu.ok(emu.cuEventRecord(nt, stream))
    emu.ok(emu.cuEventSynchronize(nt))
    assert emu.cuEventElapsedTime(ctypes.byref(ms), start, nt) == INVALID_HANDLE
    for e in (start, end, nt):
        emu.ok(emu.cuEventDestroy_v2(e))


def test_destroy_event_with_pending_record(emu: Emu, K: dict[str, int], stream: int) -> None:
    gate, e = Gate(emu, K), emu.event()
    gate.block(stream)
    emu.ok(emu.cuEventRecord(e, stream))
    emu.ok(emu.cuEventDestroy_v2(e))  # released once the marker has been passed
    gate.open()
    emu.ok(emu.cuStreamSynchronize(stream))


# -- stream memory operations ----------------------------------------------------------------
@pytest.mark.parametrize("name", ["cuStreamWriteValue32", "cuStreamWriteValue32_v2"])
def test_write_value_lands_in_stream_order(emu: Emu, K: dict[str, int], stream: int,
                                           name: str) -> None:
    flag, seen = words(1), words(1)
    gate = Gate(emu, K, probe=flag)  # records the flag when the gate opens
    gate.block(stream)
    emu.ok(getattr(emu, name)(stream, ctypes.addressof(flag), 7, 0))
    emu.launch(K["read_word"], stream, ptr(flag), ptr(seen))
    assert flag[0] == 0  # the stream has not reached the write
    gate.open()
    emu.ok(emu.cuStreamSynchronize(stream))
    assert gate.out[1] == 0, "the write landed before earlier work of its stream"
    assert seen[0] == 7, "the write landed after later work of its stream"
    assert flag[0] == 7
    assert getattr(emu, name)(stream, ctypes.addressof(flag) + 2, 1, 0) == INVALID_VALUE


def test_memset_d32(emu: Emu, K: dict[str, int], stream: int) -> None:
    buf, seen = words(20), words(1)
    gate = Gate(emu, K)
    gate.block(stream)
    emu.ok(emu.cuMemsetD32Async(ctypes.addressof(buf), 0xDEADBEEF, 16, stream))
    emu.launch(K["read_word"], stream, ptr(buf, 15), ptr(seen))
    assert list(buf) == [0] * 20
    gate.open()
    emu.ok(emu.cuStreamSynchronize(stream))
    assert list(buf) == [0xDEADBEEF] * 16 + [0] * 4 and seen[0] == 0xDEADBEEF
    emu.ok(emu.cuMemsetD32_v2(ctypes.addressof(buf) + 64, 5, 4))  # synchronous
    assert list(buf[16:]) == [5] * 4
    assert emu.cuMemsetD32Async(ctypes.addressof(buf) + 1, 0, 1, stream) == INVALID_VALUE


def test_memory_helpers(emu: Emu) -> None:
    d = ctypes.c_ulonglong()
    emu.ok(emu.cuMemAlloc_v2(ctypes.byref(d), 100))
    assert d.value % 256 == 0
    src, dst = (ctypes.c_uint8 * 100)(*range(100)), (ctypes.c_uint8 * 100)()
    emu.ok(emu.cuMemcpyHtoD_v2(d.value, src, 100))
    emu.ok(emu.cuMemcpyDtoH_v2(dst, d.value, 100))
    assert list(dst) == list(range(100))
    emu.ok(emu.cuMemFree_v2(d.value))


# -- lifecycle and load ----------------------------------------------------------------------
def test_stream_destroy_drains_pending_work(emu: Emu, K: dict[str, int]) -> None:
    s = emu.stream()
    log = words(128)
    gate = Gate(emu, K)
    gate.block(s)
    for v in range(100):
        emu.launch(K["append"], s, ptr(log), u32(v))
    result: dict[str, int] = {}

    def destroy() -> None:
        result["rc"] = emu.cuStreamDestroy_v2(s)
        result["seen"] = log[0]  # what had run when cuStreamDestroy returned

    th = threading.Thread(target=destroy)
    th.start()
    time.sleep(0.05)  # lets destroy() start waiting (the assertions hold either way)
    gate.open()
    th.join(JOIN_TIMEOUT_S)
    assert not th.is_alive()
    assert result == {"rc": CUDA_SUCCESS, "seen": 100}
    assert log_values(log) == list(range(100)) and not gate.timed_out


def test_many_launches(emu: Emu, K: dict[str, int], stream: int) -> None:
    n = 10_000
    log = words(n + 1)
    e = emu.event()
    for v in range(n):
        emu.launch(K["append"], stream, ptr(log), u32(v))
        if v % 1000 == 999:
            emu.ok(emu.cuEventRecord(e, stream))
            assert emu.cuEventQuery(e) in (CUDA_SUCCESS, NOT_READY)
    emu.ok(emu.cuStreamSynchronize(stream))
    assert log[0] == n and log_values(log) == list(range(n))
    emu.ok(emu.cuEventDestroy_v2(e))


def test_threads_share_the_driver(emu: Emu, K: dict[str, int]) -> None:
    """Launches, records, queries and waits from several threads at once."""
    n_threads, n = 4, 1500
    logs = [words(n + 1) for _ in range(n_threads)]
    streams = [emu.stream() for _ in range(n_threads)]
    shared = emu.event()
    errors: list[str] = []

    def work(t: int) -> None:
        try:
            s, log = streams[t], logs[t]
            ev = emu.event()
            for v in range(n):
                emu.launch(K["append"], s, ptr(log), u32(v))
                if v % 100 == 0:
                    emu.ok(emu.cuEventRecord(ev, s))
                    emu.ok(emu.cuEventRecord(shared, s))
                    emu.ok(emu.cuStreamWaitEvent(s, shared, 0))
                    assert emu.cuEventQuery(ev) in (CUDA_SUCCESS, NOT_READY)
            emu.ok(emu.cuStreamSynchronize(s))
            emu.ok(emu.cuEventSynchronize(ev))
            emu.ok(emu.cuEventDestroy_v2(ev))
        except AssertionError as e:  # pragma: no cover - reported below
            errors.append(str(e))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(JOIN_TIMEOUT_S)
    assert not any(th.is_alive() for th in threads) and not errors, errors
    for log in logs:
        assert log_values(log) == list(range(n))
    emu.ok(emu.cuEventDestroy_v2(shared))
    for s in streams:
        emu.ok(emu.cuStreamDestroy_v2(s))


# -- the project's dispatcher --------------------------------------------------------------
_DISPATCH_SCRIPT = textwrap.dedent("""
    import ctypes, struct, sys, threading, time
    from av_infer._cy import cuda_dispatch as cd
    from av_infer._cy.vhq import VHQ

    path, mod_path = sys.argv[1], sys.argv[2]
    cd.load_driver(path)
    try:
        disp = cd.Dispatcher(path)
    except TypeError:  # a dispatcher with one process-global driver
        disp = cd.Dispatcher()
    m = disp.load_module(open(mod_path, "rb").read())
    f = disp.get_function(m, "dk")
    assert disp.func_attribute(f, 0) == 1024 and disp.func_attribute(f, 4) == 32
    flag = (ctypes.c_uint32 * 2)()
    log = (ctypes.c_uint32 * 64)()
    vhq = VHQ(4, 16)
    s = disp.open_stream(vhq, False, ctypes.addressof(flag))
    n = 6
    args = b"".join(struct.pack("<QII", ctypes.addressof(log), v, 0) for v in range(n))
    geom = struct.pack("<7I", 1, 1, 1, 1, 1, 1, 0) * n
    disp.register_task(7, [f] * n, geom, args, [16 * i for i in range(n)])
    th = threading.Thread(target=disp._run, daemon=True)
    th.start()
    vhq.push(7, 0, n - 1)
    disp.wake()
    comps, deadline = [], time.monotonic() + 60
    while len(comps) < n and time.monotonic() < deadline:
        comps += disp.poll(64, 0.2)
    assert [(c[0], c[1], c[2], c[3]) for c in comps] == [(s, 7, k, 0) for k in range(n)], comps
    assert list(log[1:1 + log[0]]) == list(range(n)), list(log)
    disp.write_flag(s, 3)
    disp.write_flag(s, 0)  # the compute stream now waits for the flag stream
    disp.sync_stream(s)
    assert flag[0] == 0
    disp.stop()
    th.join(10)
    print("dispatcher ok")
""")


def test_cython_dispatcher_loads_the_driver(driver_path: Path) -> None:
    code = ("import sys; from av_infer._cy import cuda_dispatch; "
            "cuda_dispatch.load_driver(sys.argv[1]); print('loaded')")
    res = subprocess.run([sys.executable, "-c", code, str(driver_path)], capture_output=True,
                         text=True, timeout=JOIN_TIMEOUT_S)
    assert res.returncode == 0 and "loaded" in res.stdout, res.stderr


def test_cython_dispatcher_runs_on_the_driver(driver_path: Path, build_dir: Path,
                                              module_image: bytes) -> None:
    mod_path = build_dir / "mod.so"
    assert mod_path.read_bytes() == module_image
    res = subprocess.run([sys.executable, "-c", _DISPATCH_SCRIPT, str(driver_path),
                          str(mod_path)], capture_output=True, text=True,
                         timeout=JOIN_TIMEOUT_S)
    assert res.returncode == 0 and "dispatcher ok" in res.stdout, res.stdout + res.stderr
