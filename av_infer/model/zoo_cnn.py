"""CNN builders of the zoo: VGG-19, ResNet-152, DenseNet-201, Inception-v3 and test CNNs.

Layer structure and names follow torchvision (``layer3.5.conv2``, ``features.denseblock3``,
``Mixed_6b.branch7x7_2``) so plans and profiles read like the PyTorch models they stand for.
Each builder takes a config; ``full`` configs are the real architectures, ``scaled`` ones
keep the kinds of layers and the connectivity with far fewer channels and smaller inputs.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx

from av_infer.model.zoo_graph import FLOAT, GraphBuilder

# ----------------------------------------------------------------------------- VGG-19


@dataclass(frozen=True)
class VGGConfig:
    size: int = 224
    width_div: int = 1
    fc: int = 4096
    classes: int = 1000
    calib_batch: int = 1  # images used to calibrate BN statistics and scales


VGG19_CFG = [64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M",
             512, 512, 512, 512, "M", 512, 512, 512, 512, "M"]


def vgg19(cfg: VGGConfig, seed: int) -> onnx.ModelProto:
    """VGG-19 (configuration E): 16 conv3x3+ReLU, 5 max pools, 3 fully connected layers."""
    b = GraphBuilder("vgg19", seed)
    x = b.add_input("input", FLOAT, [1, 3, cfg.size, cfg.size],
                    calib_shape=(cfg.calib_batch, 3, cfg.size, cfg.size))
    c, hw = 3, cfg.size
    for i, v in enumerate(VGG19_CFG):
        # torchvision indices: conv at i, relu at i+1 (pools take one index)
        idx = sum(1 if u == "M" else 2 for u in VGG19_CFG[:i])
        if v == "M":
            x = b.maxpool(x, f"features.{idx}", 2, 2)
            hw //= 2
        else:
            w = int(v) // cfg.width_div
            x = b.conv(x, f"features.{idx}", c, w, 3, 1, 1, bias=True, normalize_output=True)
            x = b.relu(x, f"features.{idx + 1}")
            c = w
    x = b.flatten(x, "flatten")
    fc = cfg.fc
    x = b.linear(x, "classifier.0", c * hw * hw, fc, normalize_output=True)
    x = b.relu(x, "classifier.1")
    x = b.linear(x, "classifier.3", fc, fc, normalize_output=True)
    x = b.relu(x, "classifier.4")
    x = b.linear(x, "classifier.6", fc, cfg.classes, normalize_output=True)
    b.mark_output(x, "logits", FLOAT, [1, cfg.classes])
    return b.model("VGG-19 (torchvision layout), random weights")


# ------------------------------------------------------------------------- ResNet-152


@dataclass(frozen=True)
class ResNetConfig:
    size: int = 224
    blocks: tuple[int, int, int, int] = (3, 8, 36, 3)
    width: int = 64
    classes: int = 1000
    calib_batch: int = 1  # images used to calibrate BN statistics and scales


def _conv_bn(b: GraphBuilder, x: str, prefix: str, idx: str, cin: int, cout: int, k: int,
             s: int = 1, p: int = 0, gamma: tuple[float, float] = (0.5, 1.0),
             eps: float = 1e-5) -> str:
    x = b.conv(x, f"{prefix}.conv{idx}", cin, cout, k, s, p)
    return b.bn(x, f"{prefix}.bn{idx}", cout, eps=eps, gamma=gamma)


def resnet152(cfg: ResNetConfig, seed: int) -> onnx.ModelProto:
    """ResNet-152 v1.5: bottlenecks (stride in the 3x3), BN after each conv, Add then Relu."""
    b = GraphBuilder("resnet152", seed)
    x = b.add_input("input", FLOAT, [1, 3, cfg.size, cfg.size],
                    calib_shape=(cfg.calib_batch, 3, cfg.size, cfg.size))
    w0 = cfg.width
    x = b.conv(x, "conv1", 3, w0, 7, 2, 3)
    x = b.bn(x, "bn1", w0)
    x = b.relu(x, "relu")
    x = b.maxpool(x, "maxpool", 3, 2, 1)
    cin = w0
    for li, n in enumerate(cfg.blocks):
        w = w0 * (2**li)
        for bi in range(n):
            p = f"layer{li + 1}.{bi}"
            stride = 2 if (bi == 0 and li > 0) else 1
            y = _conv_bn(b, x, p, "1", cin, w, 1)
            y = b.relu(y, f"{p}.relu1")
            y = _conv_bn(b, y, p, "2", w, w, 3, stride, 1)
            y = b.relu(y, f"{p}.relu2")
            y = _conv_bn(b, y, p, "3", w, w * 4, 1, gamma=(0.1, 0.3))
            if bi == 0:
                sc = b.conv(x, f"{p}.downsample.0", cin, w * 4, 1, stride, 0)
                sc = b.bn(sc, f"{p}.downsample.1", w * 4)
            else:
                sc = x
            x = b.add(y, sc, f"{p}.add")
            x = b.relu(x, f"{p}.relu3")
            cin = w * 4
    x = b.classifier_head(x, "fc", cin, cfg.classes)
    b.mark_output(x, "logits", FLOAT, [1, cfg.classes])
    return b.model("ResNet-152 v1.5 (torchvision layout), random weights")


# ----------------------------------------------------------------------- DenseNet-201


@dataclass(frozen=True)
class DenseNetConfig:
    size: int = 224
    growth: int = 32
    blocks: tuple[int, ...] = (6, 12, 48, 32)
    init_features: int = 64
    bn_size: int = 4
    classes: int = 1000
    calib_batch: int = 1  # images used to calibrate BN statistics and scales


def densenet201(cfg: DenseNetConfig, seed: int) -> onnx.ModelProto:
    """DenseNet-201: pre-activation dense layers (BN-ReLU-Conv), each concatenating all
    earlier features of its block (the exporter's one multi-input Concat per layer)."""
    b = GraphBuilder("densenet201", seed)
    x = b.add_input("input", FLOAT, [1, 3, cfg.size, cfg.size],
                    calib_shape=(cfg.calib_batch, 3, cfg.size, cfg.size))
    c = cfg.init_features
    x = b.conv(x, "features.conv0", 3, c, 7, 2, 3)
    x = b.bn(x, "features.norm0", c)
    x = b.relu(x, "features.relu0")
    x = b.maxpool(x, "features.pool0", 3, 2, 1)
    g = cfg.growth
    for bi, n in enumerate(cfg.blocks):
        feats, widths = [x], [c]
        for li in range(n):
            p = f"features.denseblock{bi + 1}.denselayer{li + 1}"
            h = feats[0] if len(feats) == 1 else b.concat(feats, f"{p}.cat", widths=widths)
            h = b.bn(h, f"{p}.norm1", sum(widths))
            h = b.relu(h, f"{p}.relu1")
            h = b.conv(h, f"{p}.conv1", sum(widths), cfg.bn_size * g, 1)
            h = b.bn(h, f"{p}.norm2", cfg.bn_size * g)
            h = b.relu(h, f"{p}.relu2")
            h = b.conv(h, f"{p}.conv2", cfg.bn_size * g, g, 3, 1, 1)
            feats.append(h)
            widths.append(g)
        c = sum(widths)
        x = b.concat(feats, f"features.denseblock{bi + 1}.cat", widths=widths)
        if bi != len(cfg.blocks) - 1:
            p = f"features.transition{bi + 1}"
            x = b.bn(x, f"{p}.norm", c)
            x = b.relu(x, f"{p}.relu")
            x = b.conv(x, f"{p}.conv", c, c // 2, 1)
            x = b.avgpool(x, f"{p}.pool", 2, 2)
            c //= 2
    x = b.bn(x, "features.norm5", c)
    x = b.relu(x, "relu")
    x = b.classifier_head(x, "classifier", c, cfg.classes)
    b.mark_output(x, "logits", FLOAT, [1, cfg.classes])
    return b.model("DenseNet-201 (torchvision layout), random weights")


# ----------------------------------------------------------------------- Inception-v3


@dataclass(frozen=True)
class InceptionConfig:
    size: int = 299
    width_div: int = 1
    classes: int = 1000
    calib_batch: int = 1  # images used to calibrate BN statistics and scales


class _Inception:
    """torchvision's Inception3 (aux head omitted, transform_input=False)."""

    def __init__(self, b: GraphBuilder, div: int) -> None:
        self.b, self.div = b, div

    def w(self, c: int) -> int:
        return max(1, c // self.div)

    def basic(self, x: str, name: str, cin: int, cout: int, k: int | tuple[int, int],
              s: int = 1, p: int | tuple[int, int] = 0) -> str:
        """BasicConv2d: conv (no bias) + BN(eps=1e-3) + ReLU."""
        x = self.b.conv(x, f"{name}.conv", cin, cout, k, s, p)
        x = self.b.bn(x, f"{name}.bn", cout, eps=1e-3)
        return self.b.relu(x, f"{name}.relu")

    def block_a(self, x: str, n: str, cin: int, pool_features: int) -> tuple[str, int]:
        w, bc = self.w, self.basic
        b1 = bc(x, f"{n}.branch1x1", cin, w(64), 1)
        b5 = bc(x, f"{n}.branch5x5_1", cin, w(48), 1)
        b5 = bc(b5, f"{n}.branch5x5_2", w(48), w(64), 5, 1, 2)
        b3 = bc(x, f"{n}.branch3x3dbl_1", cin, w(64), 1)
        b3 = bc(b3, f"{n}.branch3x3dbl_2", w(64), w(96), 3, 1, 1)
        b3 = bc(b3, f"{n}.branch3x3dbl_3", w(96), w(96), 3, 1, 1)
        bp = self.b.avgpool(x, f"{n}.avg_pool", 3, 1, 1, include_pad=1)
        bp = bc(bp, f"{n}.branch_pool", cin, w(pool_features), 1)
        widths = [w(64), w(64), w(96), w(pool_features)]
        return self.b.concat([b1, b5, b3, bp], f"{n}.cat", widths=widths), sum(widths)

    def block_b(self, x: str, n: str, cin: int) -> tuple[str, int]:
        w, bc = self.w, self.basic
        b3 = bc(x, f"{n}.branch3x3", cin, w(384), 3, 2)
        bd = bc(x, f"{n}.branch3x3dbl_1", cin, w(64), 1)
        bd = bc(bd, f"{n}.branch3x3dbl_2", w(64), w(96), 3, 1, 1)
        bd = bc(bd, f"{n}.branch3x3dbl_3", w(96), w(96), 3, 2)
        bp = self.b.maxpool(x, f"{n}.max_pool", 3, 2)
        widths = [w(384), w(96), cin]
        return self.b.concat([b3, bd, bp], f"{n}.cat", widths=widths), sum(widths)

    def block_c(self, x: str, n: str, cin: int, c7: int) -> tuple[str, int]:
        w, bc = self.w, self.basic
        c7 = w(c7)
        b1 = bc(x, f"{n}.branch1x1", cin, w(192), 1)
        b7 = bc(x, f"{n}.branch7x7_1", cin, c7, 1)
        b7 = bc(b7, f"{n}.branch7x7_2", c7, c7, (1, 7), 1, (0, 3))
        b7 = bc(b7, f"{n}.branch7x7_3", c7, w(192), (7, 1), 1, (3, 0))
        bd = bc(x, f"{n}.branch7x7dbl_1", cin, c7, 1)
        bd = bc(bd, f"{n}.branch7x7dbl_2", c7, c7, (7, 1), 1, (3, 0))
        bd = bc(bd, f"{n}.branch7x7dbl_3", c7, c7, (1, 7), 1, (0, 3))
        bd = bc(bd, f"{n}.branch7x7dbl_4", c7, c7, (7, 1), 1, (3, 0))
        bd = bc(bd, f"{n}.branch7x7dbl_5", c7, w(192), (1, 7), 1, (0, 3))
        bp = self.b.avgpool(x, f"{n}.avg_pool", 3, 1, 1, include_pad=1)
        bp = bc(bp, f"{n}.branch_pool", cin, w(192), 1)
        widths = [w(192)] * 4
        return self.b.concat([b1, b7, bd, bp], f"{n}.cat", widths=widths), sum(widths)

    def block_d(self, x: str, n: str, cin: int) -> tuple[str, int]:
        w, bc = self.w, self.basic
        b3 = bc(x, f"{n}.branch3x3_1", cin, w(192), 1)
        b3 = bc(b3, f"{n}.branch3x3_2", w(192), w(320), 3, 2)
        b7 = bc(x, f"{n}.branch7x7x3_1", cin, w(192), 1)
        b7 = bc(b7, f"{n}.branch7x7x3_2", w(192), w(192), (1, 7), 1, (0, 3))
        b7 = bc(b7, f"{n}.branch7x7x3_3", w(192), w(192), (7, 1), 1, (3, 0))
        b7 = bc(b7, f"{n}.branch7x7x3_4", w(192), w(192), 3, 2)
        bp = self.b.maxpool(x, f"{n}.max_pool", 3, 2)
        widths = [w(320), w(192), cin]
        return self.b.concat([b3, b7, bp], f"{n}.cat", widths=widths), sum(widths)

    def block_e(self, x: str, n: str, cin: int) -> tuple[str, int]:
        w, bc, b = self.w, self.basic, self.b
        b1 = bc(x, f"{n}.branch1x1", cin, w(320), 1)
        b3 = bc(x, f"{n}.branch3x3_1", cin, w(384), 1)
        b3a = bc(b3, f"{n}.branch3x3_2a", w(384), w(384), (1, 3), 1, (0, 1))
        b3b = bc(b3, f"{n}.branch3x3_2b", w(384), w(384), (3, 1), 1, (1, 0))
        b3 = b.concat([b3a, b3b], f"{n}.branch3x3.cat")
        bd = bc(x, f"{n}.branch3x3dbl_1", cin, w(448), 1)
        bd = bc(bd, f"{n}.branch3x3dbl_2", w(448), w(384), 3, 1, 1)
        bda = bc(bd, f"{n}.branch3x3dbl_3a", w(384), w(384), (1, 3), 1, (0, 1))
        bdb = bc(bd, f"{n}.branch3x3dbl_3b", w(384), w(384), (3, 1), 1, (1, 0))
        bd = b.concat([bda, bdb], f"{n}.branch3x3dbl.cat")
        bp = b.avgpool(x, f"{n}.avg_pool", 3, 1, 1, include_pad=1)
        bp = bc(bp, f"{n}.branch_pool", cin, w(192), 1)
        widths = [w(320), 2 * w(384), 2 * w(384), w(192)]
        return b.concat([b1, b3, bd, bp], f"{n}.cat", widths=widths), sum(widths)


def inception_v3(cfg: InceptionConfig, seed: int) -> onnx.ModelProto:
    """Inception-v3: stem, Mixed_5b..7c (A,A,A,B,C,C,C,C,D,E,E), avgpool, fc."""
    b = GraphBuilder("inception_v3", seed)
    m = _Inception(b, cfg.width_div)
    w = m.w
    x = b.add_input("input", FLOAT, [1, 3, cfg.size, cfg.size],
                    calib_shape=(cfg.calib_batch, 3, cfg.size, cfg.size))
    x = m.basic(x, "Conv2d_1a_3x3", 3, w(32), 3, 2)
    x = m.basic(x, "Conv2d_2a_3x3", w(32), w(32), 3)
    x = m.basic(x, "Conv2d_2b_3x3", w(32), w(64), 3, 1, 1)
    x = b.maxpool(x, "maxpool1", 3, 2)
    x = m.basic(x, "Conv2d_3b_1x1", w(64), w(80), 1)
    x = m.basic(x, "Conv2d_4a_3x3", w(80), w(192), 3)
    x = b.maxpool(x, "maxpool2", 3, 2)
    c = w(192)
    x, c = m.block_a(x, "Mixed_5b", c, 32)
    x, c = m.block_a(x, "Mixed_5c", c, 64)
    x, c = m.block_a(x, "Mixed_5d", c, 64)
    x, c = m.block_b(x, "Mixed_6a", c)
    x, c = m.block_c(x, "Mixed_6b", c, 128)
    x, c = m.block_c(x, "Mixed_6c", c, 160)
    x, c = m.block_c(x, "Mixed_6d", c, 160)
    x, c = m.block_c(x, "Mixed_6e", c, 192)
    x, c = m.block_d(x, "Mixed_7a", c)
    x, c = m.block_e(x, "Mixed_7b", c)
    x, c = m.block_e(x, "Mixed_7c", c)
    x = b.classifier_head(x, "fc", c, cfg.classes)
    b.mark_output(x, "logits", FLOAT, [1, cfg.classes])
    return b.model("Inception-v3 (torchvision layout, no aux head), random weights")


# ----------------------------------------------------------------------- test models


def tiny_cnn(seed: int) -> onnx.ModelProto:
    """conv-bn-relu-pool, conv-bn, residual Add, relu, GAP, Gemm: 1x3x32x32 -> 1x10."""
    b = GraphBuilder("tiny_cnn", seed)
    x = b.add_input("input", FLOAT, [1, 3, 32, 32], calib_shape=(4, 3, 32, 32))
    x = b.conv(x, "conv1", 3, 8, 3, 1, 1)
    x = b.bn(x, "bn1", 8)
    x = b.relu(x, "relu1")
    x = b.maxpool(x, "pool1", 2, 2)
    y = b.conv(x, "conv2", 8, 8, 3, 1, 1, bias=True)
    y = b.bn(y, "bn2", 8)
    x = b.add(y, x, "add")
    x = b.relu(x, "relu2")
    x = b.classifier_head(x, "fc", 8, 10)
    b.mark_output(x, "logits", FLOAT, [1, 10])
    return b.model("tiny test CNN")


def dynamic_cnn(seed: int) -> onnx.ModelProto:
    """A CNN whose batch and spatial dims are symbolic ('N','H','W'): GAP makes the head
    independent of H and W."""
    b = GraphBuilder("dynamic_cnn", seed)
    x = b.add_input("input", FLOAT, ["N", 3, "H", "W"], calib_shape=(2, 3, 16, 16))
    x = b.conv(x, "conv1", 3, 8, 3, 1, 1)
    x = b.bn(x, "bn1", 8)
    x = b.relu(x, "relu1")
    x = b.conv(x, "conv2", 8, 16, 3, 2, 1, bias=True)
    x = b.relu(x, "relu2")
    x = b.classifier_head(x, "fc", 16, 10)
    b.mark_output(x, "logits", FLOAT, ["N", 10])
    return b.model("dynamic-shape test CNN")
