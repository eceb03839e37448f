"""Camera input without ROS: CompressedImage decoding (JPEG/PNG, typed errors for bad
bytes), YUV 4:2:2 and Bayer conversion, and letterboxing in the fused gather."""

from __future__ import annotations

import io
from pathlib import Path

import cv2
import numpy as np
import pytest
from av_infer_nodes.image_decode import compressed_size, convert_raw, decode_compressed
from av_infer_nodes.preprocess import LETTERBOX_PAD, ImageFormatError, image_to_tensor
from PIL import Image

from av_infer.detect import fit

FIXTURE = Path(__file__).parents[1] / "fixtures" / "layout_page.jpg"
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def smooth_rgb(h: int = 48, w: int = 64) -> np.ndarray:
    yy, xx = np.mgrid[0:h, 0:w]
    return np.stack([xx * 3 % 256, yy * 4 % 256, (xx + yy) * 2 % 256], -1).astype(np.uint8)


def encode(rgb: np.ndarray, fmt: str) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, fmt, **({"quality": 95} if fmt == "JPEG" else {}))
    return buf.getvalue()


def test_jpeg_and_png_decode_to_the_same_pixels_as_pillow():
    jpeg = FIXTURE.read_bytes()
    assert compressed_size(np.frombuffer(jpeg, np.uint8)) == ("jpeg", 608, 800)
    enc, bgr = decode_compressed("rgb8; jpeg compressed bgr8", jpeg)
    ref = np.asarray(Image.open(FIXTURE).convert("RGB"))
    assert enc == "bgr8" and bgr.shape == (800, 608, 3) and bgr.flags.c_contiguous
    assert np.abs(bgr[:, :, ::-1].astype(int) - ref).max() <= 8  # libjpeg(-turbo) builds
    rgb = smooth_rgb()
    enc, bgr = decode_compressed("png", encode(rgb, "PNG"))  # lossless: exact
    np.testing.assert_array_equal(bgr[:, :, ::-1], rgb)
    # the format string is not trusted: the bytes say which codec
    np.testing.assert_array_equal(decode_compressed("jpeg", encode(rgb, "PNG"))[1], bgr)


@pytest.mark.parametrize("case", ["empty", "garbage", "truncated_jpeg", "truncated_png",
                                  "corrupt_jpeg", "depth", "bomb"])
def test_bad_compressed_images_are_typed_errors(case):
    jpeg = FIXTURE.read_bytes()
    png = encode(smooth_rgb(), "PNG")
    data, fmt = {
        "empty": (b"", "jpeg"),
        "garbage": (bytes(range(256)) * 4, "jpeg"),
        "truncated_jpeg": (jpeg[: len(jpeg) // 2], "jpeg"),
        "truncated_png": (png[:-20], "png"),
        "corrupt_jpeg": (jpeg[:2] + b"\x00" * 200 + jpeg[202:], "jpeg"),
        "depth": (png, "16UC1; compressedDepth png"),
        # a valid PNG header claiming 100000 x 100000 pixels
        "bomb": (png[:16] + (100000).to_bytes(4, "big") * 2 + png[24:], "png"),
    }[case]
    with pytest.raises(ImageFormatError) as info:
        decode_compressed(fmt, data)
    assert info.value.code == "invalid_input"


@pytest.mark.parametrize("encoding,pattern", [("bayer_rggb8", "RGGB"), ("bayer_bggr8", "BGGR"),
                                              ("bayer_gbrg8", "GBRG"), ("bayer_grbg8", "GRBG")])
def test_bayer_patterns_demosaic_to_the_scene(encoding, pattern):
    rgb = smooth_rgb(40, 60)
    mosaic = np.empty(rgb.shape[:2], np.uint8)
    for dy in range(2):
        for dx in range(2):
            mosaic[dy::2, dx::2] = rgb[dy::2, dx::2, "RGB".index(pattern[dy * 2 + dx])]
    step = 64  # rows padded: step > width
    raw = np.zeros((40, step), np.uint8)
    raw[:, :60] = mosaic
    enc, out = convert_raw(encoding, 40, 60, step, raw.tobytes())
    assert enc == "rgb8" and out.shape == (40, 60, 3)
    inner = (slice(2, -2), slice(2, -2))
    assert np.abs(out[inner].astype(int) - rgb[inner]).mean() < 1.0  # the wrong pattern: ~60


@pytest.mark.parametrize("encoding", ["uyvy", "yuv422", "yuyv", "yuv422_yuy2"])
def test_yuv422_converts_to_rgb(encoding):
    rgb = smooth_rgb(16, 32)
    # BT.601 video range, the YUV 4:2:2 cameras send (OpenCV's encoder: UYVY byte order)
    uyvy = cv2.cvtColor(rgb, cv2.COLOR_RGB2YUV_UYVY).reshape(16, 64)
    packed = uyvy.copy()
    if encoding in ("yuyv", "yuv422_yuy2"):  # Y0 U Y1 V: swap each byte pair
        packed[:, 0::2], packed[:, 1::2] = uyvy[:, 1::2], uyvy[:, 0::2]
    enc, out = convert_raw(encoding, 16, 32, 64, packed.tobytes())
    assert enc == "rgb8"
    assert np.abs(out.astype(int) - rgb).mean() < 4.0  # chroma subsampling only


def test_raw_conversion_errors():
    with pytest.raises(ImageFormatError, match="even width"):
        convert_raw("uyvy", 2, 3, 6, bytes(12))
    with pytest.raises(ImageFormatError, match="needs"):
        convert_raw("bayer_rggb8", 4, 4, 4, bytes(10))
    with pytest.raises(ImageFormatError, match="shorter"):
        convert_raw("yuyv", 4, 4, 4, bytes(64))
    with pytest.raises(ImageFormatError, match="no conversion"):
        convert_raw("nv12", 4, 4, 4, bytes(64))


@pytest.mark.parametrize("method", ["nearest", "bilinear"])
def test_letterbox_is_the_stretched_content_plus_grey(method):
    rgb = smooth_rgb(30, 80)  # wide: padded above and below
    shape = (1, 3, 64, 64)
    g = fit(30, 80, 64, 64, "letterbox")
    ch, cw = g.content_hw
    py, px = int(g.pad_y), int(g.pad_x)
    out = image_to_tensor("rgb8", 30, 80, 240, rgb.tobytes(), shape, method, MEAN, STD,
                          fit="letterbox")
    content = image_to_tensor("rgb8", 30, 80, 240, rgb.tobytes(), (1, 3, ch, cw), method,
                              MEAN, STD)
    np.testing.assert_allclose(out[:, :, py:py + ch, px:px + cw], content, atol=1e-5)
    pad = (LETTERBOX_PAD / 255.0 - np.array(MEAN)) / np.array(STD)
    mask = np.ones((64, 64), bool)
    mask[py:py + ch, px:px + cw] = False
    for c in range(3):
        np.testing.assert_allclose(out[0, c][mask], pad[c], atol=1e-5)
    # stretch stays what it was
    np.testing.assert_array_equal(
        image_to_tensor("rgb8", 30, 80, 240, rgb.tobytes(), shape, method, MEAN, STD),
        image_to_tensor("rgb8", 30, 80, 240, rgb.tobytes(), shape, method, MEAN, STD,
                        fit="stretch"))
    with pytest.raises(ValueError):
        image_to_tensor("rgb8", 30, 80, 240, rgb.tobytes(), shape, fit="crop")
