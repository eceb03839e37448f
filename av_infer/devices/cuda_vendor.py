"""Vendor kernels for the cuda device: where cuBLASLt / cuDNN are, which plan kernels they
can run, and the per-device state that runs them (docs/cuda_vendor.md).

Why: our NVRTC conv/GEMM kernels are 3-5x slower than cuDNN/cuBLAS on an H100 (issue 30,
docs/gpu_results.md). A vendor op is still one kernel index of the plan in the vHQ: the
dispatcher launches it through ``av_infer/_cy/cuda_vendor.pyx`` instead of ``cuLaunchKernel``
with the same packed ``MmArgs`` struct, counted against ``c`` like any launch; it cannot
read the stream's flag word, so the dispatcher checks the flag before issuing it.

Guarantees:
* :func:`find_library` looks in ``$AV_INFER_CUBLASLT`` / ``$AV_INFER_CUDNN`` (a file or a
  folder; when set, only there), then where NVIDIA's pip wheels put the libraries
  (``site-packages/nvidia/*/lib``, ``nvidia/cu13/lib``, ``nvidia/cu12/lib``, ``torch/lib``),
  then the system loader path; if none has it, :class:`VendorLibraryError` names the
  library and every place searched. Nothing falls back silently.
* :func:`vendor_spec` says, per plan kernel, whether a vendor op computes exactly what our
  kernel computes (same inputs, epilogue, output layout) and, if not, why (the per-op
  fallback to our own kernel is explicit and reported in ``CudaDevice.vendor_report``).
"""

from __future__ import annotations

import ctypes
import glob
import os
import site
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from av_infer.errors import DeviceUnavailableError
from av_infer.kernels.cpu_spatial import _as_2d_args, _to4d
from av_infer.kernels.cuda.sources import LAYOUTS, LaunchSpec
from av_infer.model.plan import Kernel, Plan

__all__ = [
    "LIBRARIES",
    "TOLERANCE",
    "MODES",
    "PRECISIONS",
    "VendorLibraryError",
    "VendorSpec",
    "find_library",
    "max_error",
    "search_places",
    "vendor_spec",
]

#: precision of a model: FP32 (FMA maths, no TF32), TF32 tensor cores, FP16 tensor cores
#: (FP32 storage; vendor ops convert operands to FP16, accumulate in FP32)
PRECISIONS = ("fp32", "tf32", "fp16")
#: tolerance of a model's outputs against ONNX Runtime (FP32 on the CPU) per precision, as
#: :func:`max_error`: FP32 as before (docs/gpu_results.md: <= 4e-5 seen on full-size models);
#: TF32 and FP16 round both operands to 10 mantissa bits (relative 2^-11 each), and the
#: errors of deep networks compound; the checks print the error beside the tolerance
TOLERANCE = {"fp32": 1e-3, "tf32": 2e-2, "fp16": 2e-2}
#: ``CudaDevice(vendor=...)``: ``off`` our kernels only; ``auto`` per eligible op the faster
#: of ours and the vendor's (measured at load); ``force`` the vendor's for every eligible op
MODES = ("off", "auto", "force")

#: library -> (env override, sonames in order of preference, what it is)
LIBRARIES: dict[str, tuple[str, tuple[str, ...], str]] = {
    "cublaslt": ("AV_INFER_CUBLASLT", ("libcublasLt.so.13", "libcublasLt.so.12"),
                 "cuBLASLt (pip: nvidia-cublas / nvidia-cublas-cu12)"),
    "cudnn": ("AV_INFER_CUDNN", ("libcudnn.so.9",),
              "cuDNN 9 (pip: nvidia-cudnn-cu13 / nvidia-cudnn-cu12)"),
}


class VendorLibraryError(DeviceUnavailableError):
    """A vendor library the cuda device needs is missing: ``library`` (its soname(s)) and
    ``searched`` (every place looked, in order)."""

    def __init__(self, library: str, searched: Sequence[str], hint: str = "") -> None:
        self.library = library
        self.searched = list(searched)
        msg = (f"{library} not found; searched: " + "; ".join(self.searched)
               + (f". {hint}" if hint else ""))
        super().__init__(msg)


def _site_dirs() -> list[Path]:
    out: list[Path] = []
    cands = list(sys.path)
    try:
        cands += site.getsitepackages()
    except AttributeError:  # some virtualenvs
        pass
    try:
        cands.append(site.getusersitepackages())
    except AttributeError:
        pass
    for p in cands:
        if not p:
            continue
        d = Path(p)
        if d.is_dir() and d not in out:
            out.append(d)
    return out


def search_places(kind: str) -> list[Path]:
    """Folders where NVIDIA's wheels put ``kind``'s library, in search order (existing or
    not: the error lists them all)."""
    sub = {"cublaslt": ("cu13/lib", "cublas/lib", "cu12/lib"),
           "cudnn": ("cudnn/lib", "cu13/lib", "cu12/lib")}[kind]
    out: list[Path] = []
    for sp in _site_dirs():
        nv = sp / "nvidia"
        if (not nv.is_dir() and not (sp / "torch" / "lib").is_dir()
                and sp.name not in ("site-packages", "dist-packages")):
            continue  # another sys.path entry (the checkout, a zip): no wheel lands there
        for s in sub:
            out.append(nv / s)
        for extra in sorted(glob.glob(str(nv / "*" / "lib"))):
            if Path(extra) not in out:
                out.append(Path(extra))
        out.append(sp / "torch" / "lib")
    return out


def _loadable(name: str) -> bool:
    try:
        ctypes.CDLL(name, mode=os.RTLD_LOCAL)
    except OSError:
        return False
    return True


def find_library(kind: str, env: Mapping[str, str] | None = None) -> str:
    """Path (or, found by the system loader, the soname) of vendor library ``kind``
    (``cublaslt`` or ``cudnn``); raises :class:`VendorLibraryError` naming it and every
    place searched when there is none."""
    envname, sonames, what = LIBRARIES[kind]
    env = os.environ if env is None else env
    searched: list[str] = []
    override = env.get(envname, "").strip()
    if override:
        p = Path(override)
        cands = [p] if not p.is_dir() else [p / s for s in sonames]
        for c in cands:
            if c.is_file():
                return str(c)
        searched += [f"${envname}={override} ({', '.join(str(c) for c in cands)})"]
        raise VendorLibraryError(f"{what}: {' or '.join(sonames)}", searched,
                                 f"${envname} is set, so nothing else was searched")
    for d in search_places(kind):
        for s in sonames:
            if (d / s).is_file():
                return str(d / s)
        searched.append(str(d))
    for s in sonames:
        if _loadable(s):
            return s
    searched.append("the system loader path (LD_LIBRARY_PATH, ld.so.cache: "
                    + ", ".join(sonames) + ")")
    raise VendorLibraryError(
        f"{what}: {' or '.join(sonames)}", searched,
        f"install it, set ${envname} to the file or its folder, or run the cuda device "
        f"with vendor='off' (AV_INFER_CUDA_VENDOR=off: our own kernels only)")


def cudnn_preload(path: str) -> list[str]:
    """cuDNN 9's sub-libraries beside ``path`` (the loader shim dlopens them by name, which
    fails outside the loader path unless they are loaded first), graph/engines first."""
    d = Path(path).parent
    if not str(path).startswith("/"):
        return []
    order = ("graph", "engines_precompiled", "engines_runtime_compiled", "heuristic", "ops",
             "cnn", "adv")
    libs = sorted(glob.glob(str(d / "libcudnn_*.so.9")))
    key = {n: i for i, n in enumerate(order)}
    libs.sort(key=lambda p: key.get(Path(p).name[len("libcudnn_"):-len(".so.9")], 99))
    return libs * 2  # twice: a library whose dependency came later loads on the 2nd pass


# -- which kernels a vendor op can run ------------------------------------------------------
@dataclass
class VendorSpec:
    """The vendor op for one plan kernel: ``kind`` ``matmul`` (cuBLASLt) or ``conv``
    (cuDNN), ``params`` for ``Vendor.matmul_op`` / ``Vendor.conv_op`` (precision and
    workspace added by the device), or ``reason`` why the kernel stays ours."""

    kernel: int
    kind: str | None
    params: dict[str, Any] = field(default_factory=dict)
    reason: str = ""
    needs_zero_bias: int = 0  # conv without bias: a device buffer of this many zeros


def _fields(spec: LaunchSpec) -> dict[str, Any]:
    out: dict[str, Any] = {}
    i = 0
    for name, _kind, count in LAYOUTS[spec.struct_name]:
        vals = spec.slots[i:i + count]
        out[name] = vals[0] if count == 1 else list(vals)
        i += count
    return out


def _epilogue(k: Kernel) -> tuple[bool, bool, str]:
    """(residual, relu, reason) of a kernel's epilogue; reason set when no vendor epilogue
    computes it (vendor: act(acc + bias + residual) with act relu or identity)."""
    steps = [s[0] if isinstance(s, (list, tuple)) else s for s in k.args.get("epilogue") or []]
    if steps in ([], ["relu"], ["add"], ["add", "relu"]):
        return "add" in steps, "relu" in steps, ""
    return False, False, f"epilogue {steps} (vendor: [add][relu] only)"


def _align(plan: Plan, name: str | None, stride_elems: int = 0, itemsize: int = 4) -> int:
    """Bytes every address of tensor ``name`` is a multiple of, at most 256 (allocations
    are 256-byte aligned on a GPU; buffer offsets 64; views add their byte offset), and of
    its batch stride when it has one."""
    if not name:
        return 256
    t = plan.tensors[name]
    a = 256
    for v in (plan.buffers[t.buffer].offset + t.byte_offset, stride_elems * itemsize):
        if v:
            a = min(a, v & -v)
    return a


#: bytes cuDNN's fused conv wants every operand aligned to (a conservative floor; cuBLASLt
#: is told each operand's alignment instead) and the bias epilogue's pointer
MIN_ALIGN = 16


def vendor_spec(plan: Plan, k: Kernel, spec: LaunchSpec, have: Mapping[str, bool]) -> VendorSpec:
    """The vendor op computing kernel ``k`` exactly as our kernel ``spec`` does, or why not.
    ``have``: {"cublaslt": bool, "cudnn": bool} (libraries loaded)."""
    if spec.struct_name != "MmArgs" or k.kind not in ("conv", "gemm"):
        return VendorSpec(k.index, None, reason=f"{k.kind}: no vendor op")
    f = _fields(spec)
    residual, relu, why = _epilogue(k)
    if why:
        return VendorSpec(k.index, None, reason=why)
    if residual and f["res_mode"] != 1:
        return VendorSpec(k.index, None, reason="broadcast residual")
    if k.kind == "conv":
        if not have.get("cudnn"):
            return VendorSpec(k.index, None, reason="cuDNN not loaded")
        xs = plan.tensors[k.inputs[0]].shape
        n = _to4d(tuple(xs))[0]
        s, pb, pe, d = _as_2d_args(k.args, len(xs) - 2)
        if tuple(pb) != tuple(pe):
            return VendorSpec(k.index, None, reason=f"asymmetric padding {pb} {pe}")
        if f["bias_mode"] not in (0, 1):
            return VendorSpec(k.index, None, reason="non per-channel bias")
        if float(f["alpha"]) != 1.0:
            return VendorSpec(k.index, None, reason="alpha != 1")
        names = [k.inputs[0], k.inputs[1], k.outputs[0], k.args.get("bias")]
        if residual:
            names.append(next(s[1] for s in k.args["epilogue"] if s[0] == "add"))
        low = [n for n in names if n and _align(plan, n) < MIN_ALIGN]
        if low:
            return VendorSpec(k.index, None, reason=f"{low} not {MIN_ALIGN}-byte aligned")
        params = dict(n=n, c=int(f["C"]), h=int(f["H"]), w=int(f["W"]), cout=int(f["cout"]),
                      kh=int(f["kh"]), kw=int(f["kw"]), ho=int(f["ho"]), wo=int(f["wo"]),
                      pad_h=int(pb[0]), pad_w=int(pb[1]), stride_h=int(s[0]),
                      stride_w=int(s[1]), dil_h=int(d[0]), dil_w=int(d[1]),
                      groups=int(f["groups"]), relu=int(relu), residual=int(residual),
                      has_bias=int(f["bias_mode"] == 1))
        # only the fused call (ReLU or residual) needs a bias buffer when the conv has none;
        # identity without residual runs cudnnConvolutionForward with no bias op at all
        fused = relu or residual
        return VendorSpec(k.index, "conv", params,
                          needs_zero_bias=int(f["cout"]) if fused and f["bias_mode"] != 1 else 0)
    # gemm
    if not have.get("cublaslt"):
        return VendorSpec(k.index, None, reason="cuBLASLt not loaded")
    M, N, K = int(f["M"]), int(f["N"]), int(f["K"])
    dims = [(int(f["bshape"][i]), int(f["sab"][i]), int(f["sbb"][i]))
            for i in range(int(f["brank"])) if int(f["bshape"][i]) != 1]
    if len(dims) > 1:
        return VendorSpec(k.index, None, reason=f"{len(dims)} batch dims")
    batch, sa, sb = dims[0] if dims else (1, 0, 0)
    if int(f["sak"]) == 1:
        a_row, lda = 1, int(f["sam"])
    elif int(f["sam"]) == 1:
        a_row, lda = 0, int(f["sak"])
    else:
        return VendorSpec(k.index, None, reason="a is neither row- nor column-major")
    if int(f["sbn"]) == 1:
        b_row, ldb = 1, int(f["sbk"])
    elif int(f["sbk"]) == 1:
        b_row, ldb = 0, int(f["sbn"])
    else:
        return VendorSpec(k.index, None, reason="b is neither row- nor column-major")
    beta = float(f["beta"])
    bias_epi, c_slot = 0, 0
    if f["bias_mode"] == 3:
        if int(f["bias_n"]) == N and beta == 1.0:
            bias_epi = 1
        elif int(f["bias_n"]) == batch * M * N and not residual:
            c_slot = 2
        else:
            return VendorSpec(k.index, None, reason=f"bias of {f['bias_n']} (beta {beta})")
    elif f["bias_mode"] != 0:
        return VendorSpec(k.index, None, reason="broadcast bias")
    cname = None
    if residual:
        c_slot = 1
        cname = next(s[1] for s in k.args["epilogue"] if s[0] == "add")
    elif c_slot == 2:
        cname = k.args.get("bias")
    if bias_epi and _align(plan, k.args.get("bias")) < MIN_ALIGN:
        return VendorSpec(k.index, None, reason=f"bias not {MIN_ALIGN}-byte aligned")
    mn = M * N if batch > 1 else 0
    params = dict(M=M, N=N, K=K, a_rowmajor=a_row, lda=lda, b_rowmajor=b_row, ldb=ldb,
                  batch=batch, stride_a=sa, stride_b=sb, alpha=float(f["alpha"]), beta=beta,
                  bias_epi=bias_epi, relu=int(relu), c_slot=c_slot,
                  align_a=_align(plan, k.inputs[0], sa), align_b=_align(plan, k.inputs[1], sb),
                  align_c=_align(plan, cname or k.outputs[0], mn),
                  align_d=_align(plan, k.outputs[0], mn))
    return VendorSpec(k.index, "matmul", params)


def max_error(got: Any, want: Any) -> float:
    """max |got - want| / max |want| (0 for an all-zero reference compared with itself):
    the error the precision checks compare with :data:`TOLERANCE`."""
    import numpy as np

    g, w = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    scale = float(np.max(np.abs(w))) if w.size else 0.0
    diff = float(np.max(np.abs(g - w))) if w.size else 0.0
    return diff / scale if scale > 0 else diff
