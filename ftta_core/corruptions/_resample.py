"""Batched resampling: Hendrycks' clipped zoom (as matrices), bilinear sampling, Pillow's 8-bit BOX resize."""
from __future__ import annotations

import math
from functools import lru_cache

import torch
import torch.nn.functional as F

from ._filters import apply_separable

# Pillow's fixed-point resampling (src/libImaging/Resample.c): PRECISION_BITS = 32 - 8 - 2
_PILLOW_PRECISION_BITS = 22


@lru_cache(maxsize=None)
def zoom_matrix(size: int, zoom: float) -> torch.Tensor:
    """[size, size] float64 matrix of Hendrycks' ``clipped_zoom`` along one axis.

    Centre crop ``ceil(n/zoom)``, ``scipy.ndimage.zoom(order=1)`` to ``round(crop*zoom)`` pixels (grid_mode=False maps
    output o to input ``o*(crop-1)/(out-1)``: linear interpolation with aligned corners), centre trim back to n.
    """
    crop = math.ceil(size / float(zoom))
    top = (size - crop) // 2
    out = int(round(crop * float(zoom)))
    trim = (out - size) // 2
    step = (crop - 1) / (out - 1) if out > 1 else 0.0
    source = (torch.arange(size, dtype=torch.float64) + trim) * step
    lower = torch.floor(source).clamp(max=crop - 1)
    frac = source - lower
    upper = (lower + 1).clamp(max=crop - 1)
    rows = torch.arange(size)
    matrix = torch.zeros(size, size, dtype=torch.float64)
    matrix.index_put_((rows, top + lower.long()), 1.0 - frac, accumulate=True)
    matrix.index_put_((rows, top + upper.long()), frac, accumulate=True)
    return matrix


def clipped_zoom(x: torch.Tensor, zoom: float) -> torch.Tensor:
    """Hendrycks' ``clipped_zoom`` on the last two dims of ``x`` (separable, per axis)."""
    height, width = x.shape[-2:]
    return apply_separable(x, zoom_matrix(height, float(zoom)), zoom_matrix(width, float(zoom)))


def bilinear_sample(x: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, mode: str) -> torch.Tensor:
    """Sample [B, C, H, W] at float pixel coordinates ``rows``/``cols`` [B, H', W'] bilinearly, border rule ``mode``.

    Interpolates the border-extended image, like scipy.ndimage.map_coordinates(order=1, mode=...) and cv2.remap, via
    ``grid_sample``: its "reflection" padding reflects about the outer pixel edges with ``align_corners=False``
    (= scipy 'reflect', half-sample symmetric) and about the outer pixel centres with ``align_corners=True``
    (= scipy 'mirror' = cv2 BORDER_REFLECT_101); "border" padding is 'nearest'. Bilinear interpolation of a
    symmetric extension equals interpolation at the reflected coordinate, so these agree with SciPy/OpenCV to
    float64 round-off (checked against an explicit index-reflection gather in the tests).
    """
    height, width = x.shape[-2:]
    rows, cols = rows.to(x), cols.to(x)
    if mode == "reflect":
        grid = torch.stack(((2.0 * cols + 1.0) / width - 1.0, (2.0 * rows + 1.0) / height - 1.0), dim=-1)
        return F.grid_sample(x, grid, mode="bilinear", padding_mode="reflection", align_corners=False)
    if mode not in ("mirror", "nearest"):
        raise ValueError(f"border mode must be 'nearest', 'reflect' or 'mirror', got {mode!r}")
    grid = torch.stack((2.0 * cols / (width - 1) - 1.0, 2.0 * rows / (height - 1) - 1.0), dim=-1)
    padding = "reflection" if mode == "mirror" else "border"
    return F.grid_sample(x, grid, mode="bilinear", padding_mode=padding, align_corners=True)


@lru_cache(maxsize=None)
def pillow_box_coefficients(in_size: int, out_size: int) -> torch.Tensor:
    """Pillow's fixed-point BOX resampling matrix [out, in] (integer values, float64), from ``precompute_coeffs``.

    Pillow's BOX is not area-weighted: output pixel ``o`` averages, with equal weights, the input pixels whose
    centres fall in ``((o+0.5)*scale - support, (o+0.5)*scale + support]``; upscaling reduces to nearest neighbour.
    """
    scale = in_size / out_size
    filterscale = max(scale, 1.0)
    support = 0.5 * filterscale
    inverse = 1.0 / filterscale
    coeffs = torch.zeros(out_size, in_size, dtype=torch.float64)
    for out_index in range(out_size):
        center = (out_index + 0.5) * scale
        first = max(int(center - support + 0.5), 0)
        stop = min(int(center + support + 0.5), in_size)
        weights = [1.0 if -0.5 < (i - center + 0.5) * inverse <= 0.5 else 0.0 for i in range(first, stop)]
        total = sum(weights)
        for offset, weight in enumerate(weights):
            normalised = weight / total if total != 0.0 else weight
            coeffs[out_index, first + offset] = int(0.5 + normalised * (1 << _PILLOW_PRECISION_BITS))
    return coeffs


def _pillow_pass(levels: torch.Tensor, coeffs: torch.Tensor) -> torch.Tensor:
    """One 8-bit Pillow pass along the last dim: ``(sum(p k) + 2^21) >> 22`` clipped to [0, 255] (exact in float64)."""
    acc = torch.matmul(levels, coeffs.to(levels.device).transpose(0, 1))
    half = float(1 << (_PILLOW_PRECISION_BITS - 1))
    return torch.floor((acc + half) / float(1 << _PILLOW_PRECISION_BITS)).clamp_(0.0, 255.0)


def pillow_box_resize(levels: torch.Tensor, out_h: int, out_w: int) -> torch.Tensor:
    """``PIL.Image.resize((out_w, out_h), BOX)`` of uint8 levels [B, C, H, W] (float64): horizontal, then vertical.

    Exact for one-axis and equal-ratio (pixelate's) resizes; when both axes change by different ratios Pillow 13
    sometimes runs the vertical pass first, so a few values can differ by one level there.
    """
    height, width = levels.shape[-2:]
    out = levels
    if out_w != width:
        out = _pillow_pass(out, pillow_box_coefficients(width, out_w))
    if out_h != height:
        out = _pillow_pass(out.transpose(-1, -2), pillow_box_coefficients(height, out_h)).transpose(-1, -2)
    return out
