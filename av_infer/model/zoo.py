"""The benchmark model zoo: deterministic ONNX builds of the DISB models and test models.

Why build instead of download: the machines here reach no model hub, and tests need models
that are identical on every machine. Every model is generated from code with seeded
weights (opset 17, float32, NCHW) and cached on disk under
``cache_dir()/zoo/<name>-<variant>-<builder hash>.onnx``; the hash covers the builder
sources, so editing a builder invalidates old files rather than silently reusing them.

Variants:

* ``full``: the real architectures and input sizes (VGG-19 224, ResNet-152 224,
  DenseNet-201 224, Inception-v3 299, DistilBERT-base seq 128).
* ``scaled``: the same kinds of layers and connectivity with far fewer channels, fewer
  repeats and smaller inputs; each runs in a few milliseconds on one CPU core. These are
  what the default tests and the CPU device use.
* The test models (``tiny_*``, ``dynamic_cnn``) have one variant; ``variant`` is ignored.

Inputs: CNNs take ``input`` float32 ``[1, 3, S, S]`` and return ``logits [1, 1000]``
(``dynamic_cnn``: ``input [N, 3, H, W]`` -> ``logits [N, 10]``). DistilBERT takes
``input_ids`` and ``attention_mask`` int64 ``[1, seq]`` and returns ``last_hidden_state``
``[1, seq, hidden]`` (DistilBertModel, no task head).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import pathlib
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

from av_infer.errors import UnknownModelError
from av_infer.model import zoo_bert, zoo_cnn, zoo_graph

#: Bump to invalidate every cached model even when no builder source changed.
ZOO_VERSION = 1

VARIANTS = ("full", "scaled")
_SINGLE = "default"  # the one variant of the test models


@dataclass(frozen=True)
class _Input:
    name: str
    shape: tuple[int, ...]
    kind: str  # "image" | "ids" | "mask" | "float"
    high: int = 0  # exclusive upper bound for ids


@dataclass(frozen=True)
class _Entry:
    build: Callable[[], onnx.ModelProto]
    inputs: tuple[_Input, ...]


def _img(size: int, batch: int = 1) -> tuple[_Input, ...]:
    return (_Input("input", (batch, 3, size, size), "image"),)


def _bert_inputs(cfg: zoo_bert.BertConfig) -> tuple[_Input, ...]:
    return (
        _Input("input_ids", (1, cfg.seq), "ids", cfg.vocab),
        _Input("attention_mask", (1, cfg.seq), "mask"),
    )


_VGG = {"full": zoo_cnn.VGGConfig(), "scaled": zoo_cnn.VGGConfig(64, 8, 512, calib_batch=4)}
_RESNET = {
    "full": zoo_cnn.ResNetConfig(),
    "scaled": zoo_cnn.ResNetConfig(64, (1, 2, 3, 1), 16, calib_batch=4),
}
_DENSENET = {
    "full": zoo_cnn.DenseNetConfig(),
    "scaled": zoo_cnn.DenseNetConfig(64, 8, (2, 3, 4, 3), 16, calib_batch=4),
}
_INCEPTION = {
    "full": zoo_cnn.InceptionConfig(),
    "scaled": zoo_cnn.InceptionConfig(107, 8, calib_batch=8),
}
_BERT = {
    "full": zoo_bert.BertConfig(),
    "scaled": zoo_bert.BertConfig(2, 128, 4, 512, 1000, 128, 32),
}


def _registry() -> dict[str, dict[str, _Entry]]:
    reg: dict[str, dict[str, _Entry]] = {}
    for v in VARIANTS:
        vg, rn, dn, ic, bt = _VGG[v], _RESNET[v], _DENSENET[v], _INCEPTION[v], _BERT[v]
        reg.setdefault("vgg19", {})[v] = _Entry(
            functools.partial(zoo_cnn.vgg19, vg, 19), _img(vg.size))
        reg.setdefault("resnet152", {})[v] = _Entry(
            functools.partial(zoo_cnn.resnet152, rn, 152), _img(rn.size))
        reg.setdefault("densenet201", {})[v] = _Entry(
            functools.partial(zoo_cnn.densenet201, dn, 201), _img(dn.size))
        reg.setdefault("inception_v3", {})[v] = _Entry(
            functools.partial(zoo_cnn.inception_v3, ic, 3), _img(ic.size))
        reg.setdefault("distilbert", {})[v] = _Entry(
            functools.partial(zoo_bert.distilbert, bt, 66), _bert_inputs(bt))
    reg["tiny_cnn"] = {_SINGLE: _Entry(functools.partial(zoo_cnn.tiny_cnn, 1), _img(32))}
    reg["tiny_mlp"] = {
        _SINGLE: _Entry(functools.partial(zoo_bert.tiny_mlp, 2), (_Input("x", (1, 64), "float"),))
    }
    reg["tiny_transformer"] = {
        _SINGLE: _Entry(
            functools.partial(zoo_bert.tiny_transformer, 3), (_Input("x", (1, 16, 32), "float"),)
        )
    }
    # symbolic N/H/W; sample inputs bind them to 2 x 40 x 48
    reg["dynamic_cnn"] = {
        _SINGLE: _Entry(
            functools.partial(zoo_cnn.dynamic_cnn, 4), (_Input("input", (2, 3, 40, 48), "image"),)
        )
    }
    return reg


_REG = _registry()

#: DISB workload ``model_name`` -> zoo name.
DISB_MODELS: dict[str, str] = {
    "vgg19-imagenet": "vgg19",
    "resnet152-imagenet": "resnet152",
    "densenet201-imagenet": "densenet201",
    "inceptionv3-imagenet": "inception_v3",
    "distilbert": "distilbert",
    "distilbert-base": "distilbert",
}


def names() -> list[str]:
    """Every model the zoo can build: the five DISB models first, then the test models."""
    return list(_REG)


def _entry(name: str, variant: str) -> tuple[_Entry, str]:
    """Resolve (name, variant) to its registry entry and canonical variant."""
    if name not in _REG:
        raise UnknownModelError(f"unknown zoo model {name!r}; known: {', '.join(_REG)}")
    variants = _REG[name]
    if _SINGLE in variants:
        return variants[_SINGLE], _SINGLE
    if variant not in variants:
        raise ValueError(f"unknown variant {variant!r} for {name!r}; use one of {VARIANTS}")
    return variants[variant], variant


def build(name: str, variant: str = "scaled") -> onnx.ModelProto:
    """Build the model in memory (deterministic: the same bytes on every call)."""
    entry, _ = _entry(name, variant)
    return entry.build()


def cache_dir() -> pathlib.Path:
    """``$AV_INFER_CACHE`` or ``~/.cache/av_infer``: outside the repository on purpose."""
    env = os.environ.get("AV_INFER_CACHE")
    return pathlib.Path(env) if env else pathlib.Path.home() / ".cache" / "av_infer"


@functools.cache
def builder_hash() -> str:
    """A short hash of the builder sources, ZOO_VERSION and the onnx version."""
    h = hashlib.sha256(f"zoo{ZOO_VERSION}-onnx{onnx.__version__}".encode())
    for mod in (zoo_graph, zoo_cnn, zoo_bert):
        h.update(pathlib.Path(mod.__file__ or "").read_bytes())
    h.update(pathlib.Path(__file__).read_bytes())
    return h.hexdigest()[:12]


def path(name: str, variant: str = "scaled") -> pathlib.Path:
    """The cached ``.onnx`` file of a model, built on first use.

    The file is written to a temporary name and moved into place with ``os.replace``, so
    concurrent processes see either no file or a complete one.
    """
    entry, variant = _entry(name, variant)
    d = cache_dir() / "zoo"
    p = d / f"{name}-{variant}-{builder_hash()}.onnx"
    if p.exists():
        return p
    d.mkdir(parents=True, exist_ok=True)
    data = entry.build().SerializeToString()
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=d)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return p



def sample_inputs(name: str, variant: str = "scaled", seed: int = 0) -> dict[str, np.ndarray]:
    """Valid inputs: images ~ N(0, 1); token ids within the vocabulary; an attention mask
    of ones with the last quarter zeroed (padding). Does not build the model."""
    entry, _ = _entry(name, variant)
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for spec in entry.inputs:
        if spec.kind in ("image", "float"):
            out[spec.name] = rng.standard_normal(spec.shape, dtype=np.float32)
        elif spec.kind == "ids":
            ids = rng.integers(1, spec.high, size=spec.shape, dtype=np.int64)
            ids[:, 0] = min(101, spec.high - 1)  # [CLS]
            out[spec.name] = ids
        elif spec.kind == "mask":
            m = np.ones(spec.shape, dtype=np.int64)
            m[:, spec.shape[-1] - spec.shape[-1] // 4:] = 0
            out[spec.name] = m
        else:  # pragma: no cover - registry is static
            raise AssertionError(spec.kind)
    return out


def _dims(vi: onnx.ValueInfoProto) -> list[int | str]:
    return [
        d.dim_param if d.HasField("dim_param") else int(d.dim_value)
        for d in vi.type.tensor_type.shape.dim
    ]


def describe(name: str, variant: str = "scaled") -> dict[str, Any]:
    """Inputs/outputs (shape, dtype), parameter count, node count and op histogram.

    Parameters are the elements of floating-point initializers (shape constants, position
    ids and boolean masks are not counted). Reads the cached file (building it if needed).
    """
    _, canon = _entry(name, variant)
    p = path(name, variant)
    m = onnx.load(str(p))
    g = m.graph
    params = 0
    weight_bytes = 0
    for t in g.initializer:
        n = int(np.prod(t.dims)) if len(t.dims) else 1
        if t.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16,
                           onnx.TensorProto.DOUBLE, onnx.TensorProto.BFLOAT16):
            params += n
            weight_bytes += n * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize

    def io(vis: Any) -> dict[str, dict[str, Any]]:
        return {
            v.name: {
                "shape": _dims(v),
                "dtype": str(onnx.helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type)),
            }
            for v in vis
        }

    return {
        "name": name,
        "variant": canon,
        "path": str(p),
        "inputs": io(g.input),
        "outputs": io(g.output),
        "params": params,
        "weight_bytes": weight_bytes,
        "nodes": len(g.node),
        "op_counts": dict(sorted(Counter(n.op_type for n in g.node).items())),
        "opset": zoo_graph.OPSET,
    }
