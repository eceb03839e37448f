"""Export small PyTorch modules to ONNX as compiler test fixtures (tests/fixtures/torch/).

Why: the zoo's hand-built graphs only contain idioms we thought of; real exporter output
(constant-folded shape chains, Where/masked_fill, HardSwish, ConvTranspose, Resize, odd
initializer names) is what users feed the compiler. These files are tiny and committed.

Run with a separate venv that has torch (never the project venv):
    python3 -m venv /tmp/torchvenv && /tmp/torchvenv/bin/pip install torch onnx numpy
    OMP_NUM_THREADS=1 /tmp/torchvenv/bin/python scripts/export_torch_fixtures.py
"""

from __future__ import annotations

import argparse
import pathlib
import warnings

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

OUT = pathlib.Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "torch"


class TinyResNet(nn.Module):
    """conv-BN-ReLU stem, one basic residual block with a strided 1x1 shortcut, GAP, FC."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, 2, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(16)
        self.conv3 = nn.Conv2d(16, 16, 3, 1, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(16)
        self.down = nn.Sequential(nn.Conv2d(8, 16, 1, 2, bias=False), nn.BatchNorm2d(16))
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(x)))
        y = self.bn3(self.conv3(y))
        x = F.relu(y + self.down(x))
        x = self.pool(x)
        x = F.adaptive_avg_pool2d(x, 1)
        return self.fc(torch.flatten(x, 1))


class TinyBertLayer(nn.Module):
    """Embedding + one post-LN encoder layer; the padding mask goes through masked_fill."""

    def __init__(self, vocab: int = 100, d: int = 32, heads: int = 2, ffn: int = 64) -> None:
        super().__init__()
        self.heads, self.dh = heads, d // heads
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(64, d)
        self.ln0 = nn.LayerNorm(d)
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.ln1 = nn.LayerNorm(d)
        self.ff1, self.ff2 = nn.Linear(d, ffn), nn.Linear(ffn, d)
        self.ln2 = nn.LayerNorm(d)

    def split(self, t: torch.Tensor) -> torch.Tensor:
        b, s, _ = t.shape
        return t.view(b, s, self.heads, self.dh).transpose(1, 2)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0)
        x = self.ln0(self.emb(ids) + self.pos(pos))
        q, k, v = self.split(self.q(x)), self.split(self.k(x)), self.split(self.v(x))
        scores = q @ k.transpose(-1, -2) / (self.dh**0.5)
        pad = (mask == 0)[:, None, None, :]
        scores = scores.masked_fill(pad, torch.finfo(scores.dtype).min)
        ctx = torch.softmax(scores, dim=-1) @ v
        b, _, s, _ = ctx.shape
        ctx = ctx.transpose(1, 2).reshape(b, s, -1)
        x = self.ln1(x + self.o(ctx))
        return self.ln2(x + self.ff2(F.gelu(self.ff1(x))))


class MobileNetBlock(nn.Module):
    """MobileNetV3-style inverted residual: 1x1 expand, depthwise 3x3, SE, 1x1 project."""

    def __init__(self, c: int = 16, e: int = 48) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, c, 3, 2, 1, bias=False), nn.BatchNorm2d(c),
                                  nn.Hardswish())
        self.expand = nn.Sequential(nn.Conv2d(c, e, 1, bias=False), nn.BatchNorm2d(e),
                                    nn.Hardswish())
        self.dw = nn.Sequential(nn.Conv2d(e, e, 3, 1, 1, groups=e, bias=False),
                                nn.BatchNorm2d(e), nn.Hardswish())
        self.se1, self.se2 = nn.Conv2d(e, 8, 1), nn.Conv2d(8, e, 1)
        self.project = nn.Sequential(nn.Conv2d(e, c, 1, bias=False), nn.BatchNorm2d(c))
        self.head = nn.Linear(c, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        y = self.dw(self.expand(x))
        s = F.adaptive_avg_pool2d(y, 1)
        s = F.hardsigmoid(self.se2(F.relu(self.se1(s))))
        y = self.project(y * s)
        x = x + y
        return self.head(x.mean((2, 3)))


class TinyUNet(nn.Module):
    """Encoder-decoder: strided conv down, ConvTranspose up, nearest/bilinear Resize, Concat."""

    def __init__(self) -> None:
        super().__init__()
        self.enc1 = nn.Sequential(nn.Conv2d(3, 8, 3, 1, 1), nn.ReLU())
        self.enc2 = nn.Sequential(nn.Conv2d(8, 16, 3, 2, 1), nn.ReLU())
        self.enc3 = nn.Sequential(nn.Conv2d(16, 16, 3, 2, 1), nn.ReLU())
        self.up3 = nn.ConvTranspose2d(16, 16, 2, 2)
        self.dec2 = nn.Sequential(nn.Conv2d(32, 8, 3, 1, 1), nn.ReLU())
        self.dec1 = nn.Sequential(nn.Conv2d(16, 8, 3, 1, 1), nn.ReLU())
        self.out = nn.Conv2d(8, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e1 = self.enc1(x)
        e2 = self.enc2(e1)
        e3 = self.enc3(e2)
        d2 = self.dec2(torch.cat([self.up3(e3), e2], 1))
        up = F.interpolate(d2, scale_factor=2.0, mode="nearest")
        d1 = self.dec1(torch.cat([up, e1], 1))
        d1 = d1 + F.interpolate(d1, scale_factor=1.0, mode="bilinear", align_corners=False)
        return self.out(d1)


def _randomize_bn(m: nn.Module, g: torch.Generator) -> None:
    """Give BN layers non-trivial running stats so BN folding is actually exercised."""
    for mod in m.modules():
        if isinstance(mod, nn.BatchNorm2d):
            c = mod.num_features
            mod.running_mean.copy_(torch.randn(c, generator=g) * 0.1)
            mod.running_var.copy_(torch.rand(c, generator=g) * 0.5 + 0.75)
            mod.weight.data.copy_(torch.rand(c, generator=g) * 0.5 + 0.5)
            mod.bias.data.copy_(torch.randn(c, generator=g) * 0.1)


def _export(model: nn.Module, args: tuple[torch.Tensor, ...], path: pathlib.Path,
            input_names: list[str], output_names: list[str], opset: int,
            dynamic_axes: dict[str, dict[int, str]] | None = None) -> str:
    """Export with the legacy TorchScript exporter, falling back to dynamo."""
    model.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            torch.onnx.export(model, args, str(path), input_names=input_names,
                              output_names=output_names, opset_version=opset,
                              dynamic_axes=dynamic_axes, do_constant_folding=True,
                              dynamo=False)
            how = "torchscript (dynamo=False)"
        except Exception as e:  # noqa: BLE001 - report and fall back
            print(f"  legacy exporter failed for {path.name}: {e!r}; using dynamo=True")
            torch.onnx.export(model, args, str(path), input_names=input_names,
                              output_names=output_names, opset_version=opset, dynamo=True,
                              external_data=False)
            how = "dynamo=True"
    return how


def _reference(model: nn.Module, args: tuple[torch.Tensor, ...], path: pathlib.Path,
               names: list[str]) -> None:
    """Save inputs and the PyTorch output next to the model so tests can compare numbers."""
    with torch.no_grad():
        y = model(*args)
    arrays = {n: a.numpy() for n, a in zip(names, args)}
    arrays["expected_output"] = y.numpy()
    np.savez(path.with_suffix(".npz"), **arrays)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=pathlib.Path, default=OUT)
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(1)
    cases = []

    m = TinyResNet()
    _randomize_bn(m, g)
    x = torch.randn(1, 3, 32, 32, generator=g)
    cases.append(("tiny_resnet_opset13", m, (x,), ["input"], ["logits"], 13, None))
    cases.append(("tiny_resnet_dynbatch_opset17", m, (x,), ["input"], ["logits"], 17,
                  {"input": {0: "N"}, "logits": {0: "N"}}))

    m = TinyBertLayer()
    ids = torch.randint(0, 100, (1, 16), generator=g)
    mask = torch.ones(1, 16, dtype=torch.int64)
    mask[:, 12:] = 0
    cases.append(("tiny_bert_opset13", m, (ids, mask), ["input_ids", "attention_mask"],
                  ["last_hidden_state"], 13, None))
    cases.append(("tiny_bert_opset17", m, (ids, mask), ["input_ids", "attention_mask"],
                  ["last_hidden_state"], 17, None))

    m = MobileNetBlock()
    _randomize_bn(m, g)
    x = torch.randn(1, 3, 32, 32, generator=g)
    cases.append(("mobilenet_block_opset17", m, (x,), ["input"], ["logits"], 17, None))

    m = TinyUNet()
    x = torch.randn(1, 3, 32, 32, generator=g)
    cases.append(("tiny_unet_opset13", m, (x,), ["input"], ["output"], 13, None))

    for name, model, args, ins, outs, opset, dyn in cases:
        p = a.out / f"{name}.onnx"
        model.eval()
        how = _export(model, args, p, ins, outs, opset, dyn)
        _reference(model, args, p, ins)
        print(f"{p.name}: {p.stat().st_size} bytes, opset {opset}, {how}")


if __name__ == "__main__":
    main()
