"""CUDA without a GPU: source generation for every kind, nvcc compiles for Orin (sm_87) and
H100 (sm_90), the compile cache, and imports that must not touch CUDA.

nvcc runs once per architecture on one source holding every distinct kernel of the samples
(FP32 and TF32 tiles) and of the scaled zoo; results are cached by source hash under
``.pytest_cache`` so reruns cost nothing.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from av_infer.kernels.cuda.samples import chain_plan, samples
from av_infer.kernels.cuda.sources import (
    LAYOUTS,
    AuxRef,
    LaunchSpec,
    TensorRef,
    build_plan_source,
    missing_kinds,
    prelude,
    struct_size,
)
from av_infer.kernels.cuda_compile import (
    CompileCache,
    CompileError,
    NvccCompiler,
    cache_key,
)
from av_infer.model.plan import ENGINE_KINDS, KERNEL_KINDS

ROOT = Path(__file__).resolve().parents[2]
ARCHS = ("sm_87", "sm_90")


def _zoo_plans() -> list:
    from av_infer.model import zoo
    from av_infer.model.compiler import compile_model

    plans = []
    for name in zoo.names():
        try:
            plans.append(compile_model(zoo.path(name, "scaled"), name=name))
        except Exception:  # noqa: BLE001 - dynamic-shape test models need bound inputs
            continue
    return plans


@pytest.fixture(scope="module")
def all_plans() -> list:
    return [p for p, _ in samples().values()] + [chain_plan()[0]] + _zoo_plans()


def test_every_kind_has_a_cuda_generator():
    assert missing_kinds() == []


def test_samples_cover_every_kind():
    kinds = {k.kind for p, _ in samples().values() for k in p.kernels}
    assert kinds == set(KERNEL_KINDS) - {"trace"} - ENGINE_KINDS


def test_every_sample_and_zoo_plan_generates(all_plans):
    for plan in all_plans:
        src = build_plan_source(plan)
        assert len(src.specs) == len(plan.kernels)
        for spec, k in zip(src.specs, plan.kernels):
            assert spec.kernel == k.index
            assert spec.func in src.functions
            assert len(spec.slots) * 8 == struct_size(spec.struct_name)
            assert all(g >= 1 for g in (*spec.grid, *spec.block))
        # every wrapper starts with the preemption check and keeps its body separate
        for code in src.wrappers.values():
            head = code.split("__global__", 1)[1]
            assert head.splitlines()[1].strip() == "AVI_PREEMPT_CHECK(flag)"
            assert "_body" in head


_FLAG_READ = re.compile(r"\*\s*\(\s*volatile[^)]*\)\s*\(?\s*[\w.]*flag")


def _c_body(src: str, head: re.Pattern) -> str:
    """The brace-balanced body of the first function whose header matches ``head``."""
    m = head.search(src)
    assert m, head.pattern
    i = src.index("{", m.end() - 1)
    depth = 0
    for j in range(i, len(src)):
        depth += {"{": 1, "}": -1}.get(src[j], 0)
        if depth == 0:
            return src[i + 1:j]
    raise AssertionError(f"unbalanced body after {head.pattern}")


def _assert_block_uniform_flag_check(src: str) -> None:
    """The flag check every kernel starts with (issue 16, defect 8): AVI_PREEMPT_CHECK is
    the one place that reads a flag word; thread 0 reads it into shared memory, a barrier,
    then every thread of the block takes the same exit (no per-thread return on the flag
    that could leave a barrier or full-mask shuffle short of warps)."""
    macro = re.search(r"#define AVI_PREEMPT_CHECK\((\w+)\)\s*\\?\s*\n?(.*)", src)
    assert macro, "AVI_PREEMPT_CHECK is not defined"
    assert re.fullmatch(rf"if \(avi_block_preempted\({macro.group(1)}\)\) return;",
                        macro.group(2).strip()), macro.group(0)
    body = _c_body(src, re.compile(r"bool avi_block_preempted\(const unsigned int\* flag\)"))
    stmts = [st.strip() for st in body.split(";") if st.strip()]
    shared = next(i for i, st in enumerate(stmts) if st.startswith("__shared__"))
    word = stmts[shared].split()[-1]
    read = next(i for i, st in enumerate(stmts) if _FLAG_READ.search(st))
    assert re.match(rf"if \(threadIdx\.x == 0\b.*\)\s*{word} = ", stmts[read]), stmts[read]
    assert stmts[read + 1] == "__syncthreads()"
    assert stmts[read + 2:] == [f"return {word} != 0u"], stmts[read + 2:]
    # nothing else reads a flag word (a per-thread read would bypass the check)
    assert len(_FLAG_READ.findall(src)) == 1, _FLAG_READ.findall(src)


def test_every_kernel_leaves_block_uniformly_on_the_flag(all_plans):
    from av_infer.kernels.cuda.padding import build_padded_module

    zoo = [p for p in all_plans if p.name in set(_zoo_names())]
    assert zoo, "no zoo model compiled"
    for plan in [*zoo, chain_plan()[0]]:
        src = build_plan_source(plan)
        _assert_block_uniform_flag_check(src.source)
        kernels = re.findall(r'extern "C" __global__ void (?:__launch_bounds__\([^)]*\) )?'
                             r'\w+\(([^)]*)\)\s*\{\s*([^\n]*)', src.source)
        assert len(kernels) == len(src.wrappers) > 0
        for params, first in kernels:  # the check is each kernel's first statement
            assert params.startswith("const unsigned int* flag"), params
            assert first == "AVI_PREEMPT_CHECK(flag)", first
    # the padded dispatcher kernel: the same check on its part's flag, nothing before it
    # that could return (zoo plan bodies + the chain's conv tiles)
    padded = build_padded_module([build_plan_source(zoo[0]),
                                  build_plan_source(chain_plan()[0])])
    _assert_block_uniform_flag_check(padded.source)
    disp = _c_body(padded.source, re.compile(r"void avi_pad_dispatch\([^)]*\)"))
    before, _, after = disp.partition("AVI_PREEMPT_CHECK(p.flag)")
    assert after, "the padded dispatcher does not check its part's flag"
    assert "return" not in before and "__syncthreads" not in before
    assert after.index("switch") > 0


def _zoo_names() -> list[str]:
    from av_infer.model import zoo

    return list(zoo.names())


def test_wrappers_are_deduplicated():
    plan, _ = chain_plan()
    src = build_plan_source(plan)
    convs = {s.func for s, k in zip(src.specs, plan.kernels) if k.kind == "conv"}
    assert len(convs) == 2  # the stem conv (bias+relu) and six identical residual convs


def test_pack_resolves_pointer_slots():
    slots = [0] * (struct_size("GatherArgs") // 8)
    slots[0], slots[1], slots[2] = TensorRef("d"), AuxRef(0), TensorRef("y", 16)
    spec = LaunchSpec(0, "f", "GatherArgs", slots, (1, 1, 1), (32, 1, 1))
    addr = {"d": 1000, "y": 2000}
    blob = spec.pack(lambda r: 7 if isinstance(r, AuxRef) else addr[r.name] + r.extra)
    vals = np.frombuffer(blob, dtype=np.int64)
    assert list(vals[:3]) == [1000, 7, 2016]
    assert len(blob) == struct_size("GatherArgs")


def test_struct_layouts_are_all_8_byte_fields():
    for name, layout in LAYOUTS.items():
        assert {k for _, k, _ in layout} <= {"p", "q", "d"}, name
        assert struct_size(name) <= 4096, f"{name} exceeds the 4 KB kernel parameter limit"


# -- nvcc ------------------------------------------------------------------------------------
def _union(plans: list) -> str:
    wrappers: dict[str, str] = {}
    for p in plans:
        for tf32 in (False, True):
            wrappers.update(build_plan_source(p, tf32).wrappers)
    return prelude() + "\n" + "\n".join(wrappers.values())


@pytest.mark.parametrize("arch", ARCHS)
def test_nvcc_compiles_every_kernel(arch, all_plans, nvcc):
    cache = CompileCache(ROOT / ".pytest_cache" / "av_infer_nvcc")
    src = _union(all_plans)
    cubin = cache.get_or_compile(NvccCompiler("cubin"), src, arch, ("-w",))
    assert cubin[:4] == b"\x7fELF"
    # every wrapper is an exported kernel symbol of the cubin
    names = {f for p in all_plans for f in build_plan_source(p).functions}
    missing = [n for n in names if n.encode() not in cubin]
    assert not missing, missing[:5]


def test_nvcc_reports_errors_with_the_log(tmp_path, nvcc):
    with pytest.raises(CompileError, match="nvcc failed"):
        NvccCompiler("ptx").compile("this is not cuda", "sm_90")


# -- compile cache with a fake compiler ----------------------------------------------------
class FakeCompiler:
    name = "fake"
    fmt = "cubin"

    def __init__(self, ver: str = "1") -> None:
        self.calls = 0
        self.ver = ver

    def version(self) -> str:
        return f"fake-{self.ver}"

    def compile(self, source: str, arch: str, options=()) -> bytes:
        self.calls += 1
        return f"{arch}|{' '.join(options)}|{source}".encode()


def test_cache_hit_and_key_covers_arch_options_version(tmp_path):
    cache, fc = CompileCache(tmp_path), FakeCompiler()
    a = cache.get_or_compile(fc, "src", "sm_90", ("-O3",))
    assert cache.get_or_compile(fc, "src", "sm_90", ("-O3",)) == a
    assert fc.calls == 1 and cache.hits == 1
    cache.get_or_compile(fc, "src", "sm_87", ("-O3",))
    cache.get_or_compile(fc, "src", "sm_90", ())
    cache.get_or_compile(fc, "src2", "sm_90", ("-O3",))
    cache.get_or_compile(FakeCompiler("2"), "src", "sm_90", ("-O3",))
    assert fc.calls == 4
    keys = {cache_key("s", arch, opt, v, f) for arch in ("sm_87", "sm_90") for opt in ((), ("-x",))
            for v in ("a", "b") for f in ("cubin", "ptx")}
    assert len(keys) == 16


@pytest.mark.parametrize("damage", ["flip", "truncate", "magic", "empty"])
def test_corrupt_cache_file_is_a_miss(tmp_path, damage):
    cache, fc = CompileCache(tmp_path), FakeCompiler()
    good = cache.get_or_compile(fc, "src", "sm_90")
    key = cache_key("src", "sm_90", (), fc.version(), fc.fmt)
    path = cache.path(key)
    raw = bytearray(path.read_bytes())
    if damage == "flip":
        raw[-1] ^= 0xFF
    elif damage == "truncate":
        raw = raw[: len(raw) // 2]
    elif damage == "magic":
        raw[:4] = b"XXXX"
    else:
        raw = bytearray()
    path.write_bytes(bytes(raw))
    assert cache.load(key) is None
    assert cache.get_or_compile(fc, "src", "sm_90") == good
    assert fc.calls == 2 and cache.load(key) == good


def test_cache_writes_are_atomic(tmp_path, monkeypatch):
    cache = CompileCache(tmp_path)
    key = "ab" + "0" * 62
    cache.store(key, b"first")

    def boom(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        cache.store(key, b"second")
    monkeypatch.undo()
    assert cache.load(key) == b"first"  # the old file is intact
    assert not [p for p in cache.path(key).parent.iterdir() if p.name.startswith(".tmp-")]


# -- imports without CUDA --------------------------------------------------------------------
def test_imports_do_not_touch_cuda():
    code = (
        "import sys\n"
        "import av_infer, av_infer.devices.cuda, av_infer.kernels.cuda, av_infer.telemetry\n"
        "import av_infer.kernels.cuda_compile\n"
        "bad = [m for m in ('cupy', 'cuda', 'pynvml') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_dispatcher_imports_and_reports_missing_driver():
    from av_infer._cy import cuda_dispatch  # built by setup.py on every machine
    with pytest.raises(OSError, match="libdoes-not-exist.so.1 not found"):
        cuda_dispatch.load_driver("libdoes-not-exist.so.1")
    if not cuda_dispatch.driver_loaded():
        try:
            cuda_dispatch.load_driver()
        except OSError as e:
            assert "libcuda.so.1 not found" in str(e)


def test_cuda_device_unavailable_is_a_typed_error_with_a_reason():
    from av_infer.devices import cuda, make_device
    from av_infer.errors import DeviceUnavailableError

    ok, why = cuda.availability()
    if ok:
        pytest.skip("a GPU is present: covered by test_cuda_device.py")
    assert why
    with pytest.raises(DeviceUnavailableError, match="unavailable"):
        make_device("cuda")


def test_telemetry_never_raises():
    from av_infer.telemetry import gpu_telemetry

    t = gpu_telemetry(0)
    assert isinstance(t, dict) and "available" in t
    if not t["available"]:
        assert t["reason"]


def test_kernel_variant_without_cuda_version_is_a_typed_error():
    """A concat of more parts than the CUDA kernel takes: UnsupportedModelError naming the
    kernel (what load_model on the cuda device reports), not a bare NotImplementedError."""
    from av_infer.errors import UnsupportedModelError
    from av_infer.kernels.cuda.sources import MAXPARTS
    from av_infer.model.plan_builder import PlanBuilder

    b = PlanBuilder("wide_concat")
    parts = [b.tensor(f"x{i}", (1, 1), role="input") for i in range(MAXPARTS + 1)]
    y = b.tensor("y", (1, MAXPARTS + 1), role="output")
    b.kernel("concat", parts, [y], axis=1)
    with pytest.raises(UnsupportedModelError, match=f"{MAXPARTS + 1} parts") as e:
        build_plan_source(b.build())
    assert e.value.unsupported == {"concat": [b.build().kernels[0].name]}
