"""Transformer builders of the zoo: DistilBERT, a tiny transformer block and a tiny MLP.

DistilBERT is written the way ``torch.onnx.export`` writes HuggingFace's DistilBertModel:
``nn.Linear`` on 3-D activations becomes MatMul + Add (weights stored pre-transposed as
``[in, out]``), head splits are Shape -> Gather -> Unsqueeze -> Concat -> Reshape chains
(all static here, so a compiler must fold them), GELU is the Erf pattern, and the attention
mask is the classic additive mask ``(1 - mask) * -10000`` broadcast onto the scores.
The output is the last hidden state ``[1, seq, hidden]`` (DistilBertModel, no task head).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto

from av_infer.model.zoo_graph import FLOAT, INT64, GraphBuilder


@dataclass(frozen=True)
class BertConfig:
    layers: int = 6
    hidden: int = 768
    heads: int = 12
    ffn: int = 3072
    vocab: int = 30522
    max_pos: int = 512
    seq: int = 128


def _linear3d(b: GraphBuilder, x: str, name: str, cin: int, cout: int) -> str:
    """nn.Linear on [B, S, C]: MatMul with the pre-transposed weight, then Add bias."""
    w = b.param(f"{name}.weight", b.normal((cin, cout), 1.0 / math.sqrt(cin)))
    bias = b.param(f"{name}.bias", b.normal((cout,), 0.02))
    y = b.node("MatMul", [x, w], f"{name}.matmul", m2=b.m2.get(x, 1.0))
    return b.node("Add", [bias, y], f"{name}.add")


def _layernorm(b: GraphBuilder, x: str, name: str, c: int, eps: float = 1e-12) -> str:
    g = b.param(f"{name}.weight", b.uniform((c,), 0.8, 1.2))
    beta = b.param(f"{name}.bias", b.normal((c,), 0.02))
    return b.node("LayerNormalization", [x, g, beta], name, m2=1.0, axis=-1, epsilon=eps)


def _gelu(b: GraphBuilder, x: str, p: str) -> str:
    """GELU as exported by torch: x * 0.5 * (1 + erf(x / sqrt(2)))."""
    d = b.node("Div", [x, b.const(1.4142135381698608, np.float32)], f"{p}.div")
    e = b.node("Erf", [d], f"{p}.erf")
    a = b.node("Add", [e, b.const(1.0, np.float32)], f"{p}.add")
    m = b.node("Mul", [x, a], f"{p}.mul")
    return b.node("Mul", [m, b.const(0.5, np.float32)], f"{p}.mul_half", m2=0.4)


def _dyn_shape(b: GraphBuilder, ref: str, p: str, tail: list[int]) -> str:
    """Shape(ref)[0] ++ tail: the exporter's view(bs, ...) idiom."""
    sh = b.node("Shape", [ref], f"{p}.shape")
    bs = b.node("Gather", [sh, b.const(0)], f"{p}.gather", axis=0)
    bsu = b.node("Unsqueeze", [bs, b.const([0])], f"{p}.unsqueeze")
    return b.node("Concat", [bsu, b.const(tail)], f"{p}.concat", axis=0)


def distilbert(cfg: BertConfig, seed: int) -> onnx.ModelProto:
    """DistilBERT encoder (DistilBertModel): embeddings + ``layers`` transformer blocks."""
    b = GraphBuilder("distilbert", seed)
    ids = b.add_input("input_ids", INT64, [1, cfg.seq])
    mask = b.add_input("attention_mask", INT64, [1, cfg.seq])
    h, nh = cfg.hidden, cfg.heads
    dh = h // nh

    # embeddings: word + position (position ids sliced to the sequence length)
    we = b.param("embeddings.word_embeddings.weight", b.normal((cfg.vocab, h), 1.0))
    pe = b.param("embeddings.position_embeddings.weight", b.normal((cfg.max_pos, h), 0.5))
    pid = b.param("embeddings.position_ids", np.arange(cfg.max_pos, dtype=np.int64)[None, :])
    x = b.node("Gather", [we, ids], "embeddings.word_embeddings", axis=0)
    sh = b.node("Shape", [ids], "embeddings.shape")
    sl = b.node("Gather", [sh, b.const(1)], "embeddings.seq_len", axis=0)
    slu = b.node("Unsqueeze", [sl, b.const([0])], "embeddings.seq_len_unsqueeze")
    pos = b.node("Slice", [pid, b.const([0]), slu, b.const([1]), b.const([1])],
                 "embeddings.position_ids_slice")
    pos = b.node("Gather", [pe, pos], "embeddings.position_embeddings", axis=0)
    x = b.node("Add", [x, pos], "embeddings.add")
    x = _layernorm(b, x, "embeddings.LayerNorm", h)

    # additive attention mask [1, 1, 1, S]: 0 where attended, -10000 where masked
    m = b.node("Cast", [mask], "mask.cast", to=TensorProto.FLOAT)
    m = b.node("Sub", [b.const(1.0, np.float32), m], "mask.sub")
    m = b.node("Mul", [m, b.const(-10000.0, np.float32)], "mask.mul")
    m = b.node("Unsqueeze", [m, b.const([1, 2])], "mask.unsqueeze")

    for li in range(cfg.layers):
        p = f"transformer.layer.{li}"
        a = f"{p}.attention"
        q = _linear3d(b, x, f"{a}.q_lin", h, h)
        k = _linear3d(b, x, f"{a}.k_lin", h, h)
        v = _linear3d(b, x, f"{a}.v_lin", h, h)
        heads = []
        for nm, t in (("q", q), ("k", k), ("v", v)):
            s = _dyn_shape(b, x, f"{a}.{nm}_view", [-1, nh, dh])
            t = b.node("Reshape", [t, s], f"{a}.{nm}_reshape")
            heads.append(b.node("Transpose", [t], f"{a}.{nm}_transpose", perm=[0, 2, 1, 3]))
        q, k, v = heads
        q = b.node("Div", [q, b.const(math.sqrt(dh), np.float32)], f"{a}.q_scale")
        kt = b.node("Transpose", [k], f"{a}.k_transpose_t", perm=[0, 1, 3, 2])
        sc = b.node("MatMul", [q, kt], f"{a}.scores")
        sc = b.node("Add", [sc, m], f"{a}.scores_mask")
        pr = b.node("Softmax", [sc], f"{a}.softmax", axis=-1)
        ctx = b.node("MatMul", [pr, v], f"{a}.context")
        ctx = b.node("Transpose", [ctx], f"{a}.context_transpose", perm=[0, 2, 1, 3])
        s = _dyn_shape(b, x, f"{a}.unshape", [-1, h])
        ctx = b.node("Reshape", [ctx, s], f"{a}.context_reshape")
        o = _linear3d(b, ctx, f"{a}.out_lin", h, h)
        o = b.node("Add", [o, x], f"{p}.sa_residual")
        x = _layernorm(b, o, f"{p}.sa_layer_norm", h)
        f = _linear3d(b, x, f"{p}.ffn.lin1", h, cfg.ffn)
        f = _gelu(b, f, f"{p}.ffn.gelu")
        f = _linear3d(b, f, f"{p}.ffn.lin2", cfg.ffn, h)
        f = b.node("Add", [f, x], f"{p}.ffn_residual")
        x = _layernorm(b, f, f"{p}.output_layer_norm", h)
    b.mark_output(x, "last_hidden_state", FLOAT, [1, cfg.seq, h])
    return b.model("DistilBERT encoder (HuggingFace layout), random weights")


def tiny_transformer(seed: int) -> onnx.ModelProto:
    """One pre-LN attention block (2 heads, causal mask via Where) plus a ReLU FFN:
    x [1, 16, 32] -> y [1, 16, 32]."""
    b = GraphBuilder("tiny_transformer", seed)
    s, c, nh = 16, 32, 2
    dh = c // nh
    x0 = b.add_input("x", FLOAT, [1, s, c])
    x = _layernorm(b, x0, "ln1", c, eps=1e-5)
    heads = []
    for nm in ("q", "k", "v"):
        t = _linear3d(b, x, f"attn.{nm}", c, c)
        t = b.node("Reshape", [t, b.const([1, s, nh, dh])], f"attn.{nm}_reshape")
        heads.append(b.node("Transpose", [t], f"attn.{nm}_transpose", perm=[0, 2, 1, 3]))
    q, k, v = heads
    kt = b.node("Transpose", [k], "attn.k_transpose_t", perm=[0, 1, 3, 2])
    sc = b.node("MatMul", [q, kt], "attn.scores")
    sc = b.node("Mul", [sc, b.const(1.0 / math.sqrt(dh), np.float32)], "attn.scale")
    causal = b.param("attn.causal_mask", np.tril(np.ones((s, s), dtype=bool)))
    sc = b.node("Where", [causal, sc, b.const(-10000.0, np.float32)], "attn.mask")
    pr = b.node("Softmax", [sc], "attn.softmax", axis=-1)
    ctx = b.node("MatMul", [pr, v], "attn.context")
    ctx = b.node("Transpose", [ctx], "attn.context_transpose", perm=[0, 2, 1, 3])
    ctx = b.node("Reshape", [ctx, b.const([1, s, c])], "attn.context_reshape")
    o = _linear3d(b, ctx, "attn.out", c, c)
    x = b.node("Add", [x0, o], "residual1")
    y = _layernorm(b, x, "ln2", c, eps=1e-5)
    y = _linear3d(b, y, "ffn.fc1", c, 4 * c)
    y = b.node("Relu", [y], "ffn.relu")
    y = _linear3d(b, y, "ffn.fc2", 4 * c, c)
    y = b.node("Add", [x, y], "residual2")
    b.mark_output(y, "y", FLOAT, [1, s, c])
    return b.model("tiny transformer block")


def tiny_mlp(seed: int) -> onnx.ModelProto:
    """Gemm-Relu-Gemm-Softmax: x [1, 64] -> probs [1, 10]."""
    b = GraphBuilder("tiny_mlp", seed)
    x = b.add_input("x", FLOAT, [1, 64])
    x = b.linear(x, "fc1", 64, 32)
    x = b.relu(x, "relu")
    x = b.linear(x, "fc2", 32, 10, normalize_output=True)
    x = b.node("Softmax", [x], "softmax", axis=-1)
    b.mark_output(x, "probs", FLOAT, [1, 10])
    return b.model("tiny test MLP")
