"""Digital corruptions (brightness, contrast, elastic, pixelate, JPEG) with Hendrycks' CIFAR constants.

* brightness: skimage ``rgb2hsv``, ``V <- clip(V + c)``, ``hsv2rgb``, transcribed formula for formula in torch.
* contrast: ``(x - mean_c) c + mean_c`` with per-image, per-channel means.
* elastic_transform: (1) a random affine from three points around the centre jittered by U(-j, j), applied as
  ``cv2.warpAffine(BORDER_REFLECT_101)`` including OpenCV's fixed-point source coordinates (1/1024, then 1/32
  pixel; OpenCV 3.4-4.10, which made CIFAR-10-C, works this way; OpenCV 5.0 samples at float coordinates instead);
  (2) displacements ``alpha * gaussian(U(-1, 1), sigma, mode='reflect', truncate=3)``; (3)
  ``map_coordinates(order=1, mode='reflect')``. Both samplers use ``grid_sample(padding_mode="reflection")``:
  with ``align_corners=True`` it reflects about the outer pixel centres (= cv2 BORDER_REFLECT_101 = scipy
  'mirror'), with ``align_corners=False`` about the outer pixel edges (= scipy 'reflect'), which is what each step
  needs; equal to SciPy/OpenCV up to float64 round-off. The constants are Hendrycks' ``IMSIZE * (...)`` with
  IMSIZE = 32 for every image size; the centre points use (W//2, H//2) for (x, y), which for square images equals
  the reference's (H//2, W//2).
* pixelate: ``PIL.resize(BOX)`` down to ``int(n c)`` and back, emulated exactly with Pillow's fixed-point BOX
  coefficients and 8-bit rounding after each pass (Pillow's BOX is centre-in-footprint averaging, not area
  weighting). Inputs are taken at their 8-bit level.
* jpeg_compression: Pillow encode/decode at the given quality, one image at a time (a codec; not vectorised).
"""
from __future__ import annotations

import io
from typing import Tuple

import numpy as np
import torch
from PIL import Image

from ._color import hsv_to_rgb, rgb_to_hsv
from ._filters import gaussian_filter
from ._resample import bilinear_sample, pillow_box_resize
from ._spec import CorruptionSpec, Fields

BRIGHTNESS = (0.05, 0.1, 0.15, 0.2, 0.3)  # added to HSV V
CONTRAST = (0.75, 0.5, 0.4, 0.3, 0.15)  # scale around the channel mean
ELASTIC_IMSIZE = 32
# (alpha, sigma, affine jitter) = IMSIZE * (...), exactly as make_cifar_c.py writes them
ELASTIC = tuple(
    (ELASTIC_IMSIZE * a, ELASTIC_IMSIZE * s, ELASTIC_IMSIZE * j)
    for a, s, j in ((0, 0, 0.08), (0.05, 0.2, 0.07), (0.08, 0.06, 0.06), (0.1, 0.04, 0.05), (0.1, 0.03, 0.03))
)
ELASTIC_TRUNCATE = 3.0
PIXELATE = (0.95, 0.9, 0.85, 0.75, 0.65)  # downscale factor
JPEG_QUALITY = (80, 65, 58, 50, 40)
# cv2.warpAffine fixed point: AB_BITS = 10, INTER_BITS = 5
_AB_SCALE, _INTER_TAB = 1024, 32


def _brightness(x: torch.Tensor, c: float) -> torch.Tensor:
    """HSV round trip with ``V <- clip(V + c)``."""
    hsv = rgb_to_hsv(x)
    hsv = torch.cat((hsv[:, :2], (hsv[:, 2:] + c).clamp(0.0, 1.0)), dim=1)
    return hsv_to_rgb(hsv).clamp(0.0, 1.0)


def _contrast(x: torch.Tensor, c: float) -> torch.Tensor:
    """``(x - mean) c + mean`` per image and channel."""
    means = x.mean(dim=(2, 3), keepdim=True)
    return ((x - means) * c + means).clamp(0.0, 1.0)


def _draw_elastic(gen: torch.Generator, c: Tuple[float, float, float], height: int, width: int) -> Fields:
    """Affine jitter [3, 2] ~ U(-j, j) (float32 as in the reference), then two U(-1, 1) fields [H, W]."""
    jitter_max = c[2]
    jitter = -jitter_max + (jitter_max - -jitter_max) * torch.rand(3, 2, generator=gen, dtype=torch.float64)
    noise_x = -1.0 + 2.0 * torch.rand(height, width, generator=gen, dtype=torch.float64)
    noise_y = -1.0 + 2.0 * torch.rand(height, width, generator=gen, dtype=torch.float64)
    return {"jitter": jitter.float().double(), "noise_x": noise_x, "noise_y": noise_y}


def affine_source_coordinates(jitter: torch.Tensor, height: int, width: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Source (row, col) [B, H, W] of ``cv2.warpAffine(getAffineTransform(pts1, pts1 + jitter))``, 1/32-pixel grid."""
    jitter = jitter.detach().to("cpu", torch.float64)
    cx, cy, half = float(width // 2), float(height // 2), float(min(height, width) // 3)
    pts1 = torch.tensor([[cx + half, cy + half], [cx + half, cy - half], [cx - half, cy - half]], dtype=torch.float64)
    pts2 = (pts1.float() + jitter.float()).double()  # float32 arithmetic, as np.float32 points
    design = torch.cat((pts1, torch.ones(3, 1, dtype=torch.float64)), dim=1).expand(jitter.shape[0], 3, 3)
    forward = torch.linalg.solve(design, pts2).transpose(1, 2)  # [B, 2, 3]: dst = M [src; 1]
    m = forward.reshape(-1, 6).unbind(1)
    det = m[0] * m[4] - m[1] * m[3]
    inv_det = torch.where(det != 0, 1.0 / det, torch.zeros_like(det))
    a11, a12, a21, a22 = m[4] * inv_det, -m[1] * inv_det, -m[3] * inv_det, m[0] * inv_det
    b1, b2 = -a11 * m[2] - a12 * m[5], -a21 * m[2] - a22 * m[5]
    xs = torch.arange(width, dtype=torch.float64)[None, None, :]
    ys = torch.arange(height, dtype=torch.float64)[None, :, None]

    def fixed_point(ax: torch.Tensor, ay: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        per_col = torch.round(ax[:, None, None] * xs * _AB_SCALE)
        per_row = torch.round((ay[:, None, None] * ys + b[:, None, None]) * _AB_SCALE) + _AB_SCALE // _INTER_TAB // 2
        return torch.floor((per_row + per_col) / (_AB_SCALE // _INTER_TAB)) / _INTER_TAB

    return fixed_point(a21, a22, b2), fixed_point(a11, a12, b1)


def _elastic_with_fields(
    x: torch.Tensor, c: Tuple[float, float, float], jitter: torch.Tensor, noise_x: torch.Tensor, noise_y: torch.Tensor
) -> torch.Tensor:
    """Affine warp (BORDER_REFLECT_101) then the smoothed displacement field (scipy 'reflect')."""
    alpha, sigma, _ = c
    height, width = x.shape[-2:]
    rows, cols = affine_source_coordinates(jitter, height, width)
    warped = bilinear_sample(x, rows.to(x.device), cols.to(x.device), "mirror").float().double()  # a float32 image
    noise = torch.stack((noise_x, noise_y), dim=1).to(x.device, torch.float64)
    shifts = (gaussian_filter(noise, sigma, "reflect", ELASTIC_TRUNCATE) * alpha).float().double()
    grid_rows = torch.arange(height, device=x.device, dtype=torch.float64)[None, :, None] + shifts[:, 1]
    grid_cols = torch.arange(width, device=x.device, dtype=torch.float64)[None, None, :] + shifts[:, 0]
    return bilinear_sample(warped, grid_rows, grid_cols, "reflect").clamp(0.0, 1.0)


def _pixelate(x: torch.Tensor, c: float) -> torch.Tensor:
    """Pillow BOX down to ``int(n c)`` and back up, on the 8-bit levels."""
    height, width = x.shape[-2:]
    levels = torch.round(x.clamp(0.0, 1.0) * 255.0).to(torch.float64)
    small = pillow_box_resize(levels, int(height * c), int(width * c))
    return (pillow_box_resize(small, height, width) / 255.0).to(x)


def jpeg_roundtrip(image: np.ndarray, quality: int) -> np.ndarray:
    """Pillow JPEG encode at ``quality`` and decode of one uint8 [H, W, 3] image."""
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, "JPEG", quality=quality)
    buffer.seek(0)
    with Image.open(buffer) as decoded:
        return np.asarray(decoded.convert("RGB"))


def _jpeg(x: torch.Tensor, quality: int) -> torch.Tensor:
    """JPEG round trip of every image through Pillow (a Python loop: it is a codec)."""
    levels = torch.round(x.clamp(0.0, 1.0) * 255.0).to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()
    decoded = np.stack([jpeg_roundtrip(image, quality) for image in levels])
    return torch.from_numpy(decoded).to(x.device).permute(0, 3, 1, 2).to(x.dtype) / 255.0


SPECS = (
    CorruptionSpec("brightness", BRIGHTNESS, _brightness),
    CorruptionSpec("contrast", CONTRAST, _contrast),
    CorruptionSpec("elastic_transform", ELASTIC, _elastic_with_fields, _draw_elastic, output_dtype=torch.float32),
    CorruptionSpec("pixelate", PIXELATE, _pixelate),
    CorruptionSpec("jpeg_compression", JPEG_QUALITY, _jpeg),
)
