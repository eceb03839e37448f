"""Camera frames the fused gather cannot read directly -> an RGB/BGR array it can.

Two kinds (ROS-free, so plain pytest covers them):

* ``sensor_msgs/CompressedImage``: JPEG or PNG bytes, decoded with OpenCV
  (opencv-python-headless: the fastest of OpenCV, simplejpeg and Pillow on a 1280x720 JPEG
  with simplejpeg level, and needed anyway for the conversions below; docs/ros.md,
  "Camera input"). The codec is told by the bytes' signature, not by ``format`` (which
  image_transport writes as e.g. ``"bgr8; jpeg compressed bgr8"``); ``compressedDepth``
  and anything else is refused.
* raw ``sensor_msgs/Image`` encodings beyond rgb8/bgr8/mono8: YUV 4:2:2 (``uyvy`` =
  ``yuv422``, ``yuyv`` = ``yuv422_yuy2``) and 8-bit Bayer (``bayer_rggb8``, ``bayer_bggr8``,
  ``bayer_gbrg8``, ``bayer_grbg8``), converted with OpenCV's ``cvtColor`` (Bayer: bilinear
  demosaicing).

Guaranteed: a result is ``(encoding, array)`` with ``encoding`` in ``rgb8``/``bgr8`` and a
C-contiguous uint8 HxWx3 array, ready for ``preprocess.image_to_tensor``; anything that
cannot be decoded (an unknown format, truncated or corrupt bytes, sizes that do not add up,
an image over ``max_pixels``) raises ``ImageFormatError`` (code ``invalid_input``) saying
what, so the node answers that frame on ``~/output/errors`` like any bad image.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
from av_infer_nodes.preprocess import ImageFormatError

#: ROS image encodings (sensor_msgs/image_encodings.hpp) -> OpenCV conversion to RGB.
#: ROS names a Bayer pattern by its first row from the top-left pixel; OpenCV by the
#: second row's pixels 2 and 3, hence the apparent swap (cv_bridge uses the same table).
CONVERTED: dict[str, tuple[str, int]] = {
    "uyvy": ("COLOR_YUV2RGB_UYVY", 2),
    "yuv422": ("COLOR_YUV2RGB_UYVY", 2),
    "yuyv": ("COLOR_YUV2RGB_YUYV", 2),
    "yuv422_yuy2": ("COLOR_YUV2RGB_YUYV", 2),
    "bayer_rggb8": ("COLOR_BayerBG2RGB", 1),
    "bayer_bggr8": ("COLOR_BayerRG2RGB", 1),
    "bayer_gbrg8": ("COLOR_BayerGR2RGB", 1),
    "bayer_grbg8": ("COLOR_BayerGB2RGB", 1),
}

#: Larger frames are refused before decoding (a decompression bomb would otherwise
#: allocate gigabytes): 8K x 8K.
MAX_PIXELS = 8192 * 8192

_JPEG, _PNG = b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n"


def _cv2() -> Any:
    try:
        import cv2
    except ImportError as exc:  # pragma: no cover - a dependency of av_infer's ROS nodes
        raise ImageFormatError("opencv-python-headless is not installed (requirements.txt)"
                               ) from exc
    return cv2


def _view(data: Any) -> np.ndarray:
    return np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)


def compressed_size(buf: np.ndarray) -> tuple[str, int, int]:
    """``(codec, width, height)`` from a JPEG's SOF or a PNG's IHDR, without decoding."""
    head = buf[:8].tobytes()
    if head.startswith(_PNG):
        if buf.size < 33 or buf[12:16].tobytes() != b"IHDR":
            raise ImageFormatError("corrupt PNG: no IHDR chunk")
        w, h = struct.unpack(">II", buf[16:24].tobytes())
        return "png", int(w), int(h)
    if head.startswith(_JPEG):
        i, n = 2, buf.size
        while i + 9 < n:
            if buf[i] != 0xFF:
                raise ImageFormatError(f"corrupt JPEG: no marker at byte {i}")
            marker = int(buf[i + 1])
            if marker == 0xFF:  # fill byte
                i += 1
                continue
            seg = int(buf[i + 2]) << 8 | int(buf[i + 3])
            if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):  # SOFn
                h = int(buf[i + 5]) << 8 | int(buf[i + 6])
                w = int(buf[i + 7]) << 8 | int(buf[i + 8])
                return "jpeg", w, h
            i += 2 + seg
        raise ImageFormatError("corrupt or truncated JPEG: no frame header (SOF)")
    raise ImageFormatError("unsupported compressed image: neither JPEG nor PNG "
                           f"(first bytes {head[:4].hex()})")


def _complete(codec: str, buf: np.ndarray) -> bool:
    """Whether the stream ends where its format says (libjpeg decodes a truncated JPEG
    into a grey-filled image with only a warning; PNG's IEND chunk is its last)."""
    tail = buf[-16:].tobytes().rstrip(b"\x00")
    return tail.endswith(b"\xff\xd9") if codec == "jpeg" else tail.endswith(
        b"IEND\xaeB`\x82")


def decode_compressed(fmt: str, data: Any, max_pixels: int = MAX_PIXELS
                      ) -> tuple[str, np.ndarray]:
    """A ``CompressedImage``'s ``format`` and ``data`` -> ``("bgr8", HxWx3 uint8)``."""
    if "compresseddepth" in (fmt or "").lower():
        raise ImageFormatError(f"unsupported compressed format {fmt!r} (depth images)")
    buf = _view(data)
    if buf.size == 0:
        raise ImageFormatError("empty compressed image")
    codec, w, h = compressed_size(buf)
    if w <= 0 or h <= 0 or w * h > max_pixels:
        raise ImageFormatError(f"{codec} image of {w}x{h} pixels (at most {max_pixels})")
    if not _complete(codec, buf):
        raise ImageFormatError(f"truncated {codec}: the stream has no end marker")
    cv2 = _cv2()
    img = cv2.imdecode(buf, cv2.IMREAD_COLOR)
    if img is None or img.shape[:2] != (h, w):
        raise ImageFormatError(f"corrupt {codec} ({buf.size} bytes): OpenCV cannot decode it")
    return "bgr8", img


def convert_raw(encoding: str, height: int, width: int, step: int, data: Any
                ) -> tuple[str, np.ndarray]:
    """A raw YUV 4:2:2 or Bayer ``Image`` -> ``("rgb8", HxWx3 uint8)`` (``CONVERTED``)."""
    if encoding not in CONVERTED:
        raise ImageFormatError(f"no conversion for encoding {encoding!r}")
    code, bpp = CONVERTED[encoding]
    if height <= 0 or width <= 0:
        raise ImageFormatError(f"empty image {width}x{height}")
    if bpp == 2 and width % 2:
        raise ImageFormatError(f"{encoding} needs an even width, got {width}")
    row = width * bpp
    if step < row:
        raise ImageFormatError(f"step {step} is shorter than a row ({row} bytes)")
    buf = _view(data)
    if buf.size < step * (height - 1) + row:
        raise ImageFormatError(f"data has {buf.size} bytes, a {width}x{height} {encoding} "
                               f"image with step {step} needs {step * (height - 1) + row}")
    rows = np.lib.stride_tricks.as_strided(buf, shape=(height, row), strides=(step, 1))
    src = np.ascontiguousarray(rows).reshape(height, width, bpp) if bpp == 2 else (
        np.ascontiguousarray(rows))
    if bpp == 1 and (height < 2 or width < 2):
        raise ImageFormatError(f"a Bayer image needs at least 2x2 pixels, got {width}x{height}")
    cv2 = _cv2()
    return "rgb8", cv2.cvtColor(src, getattr(cv2, code))
