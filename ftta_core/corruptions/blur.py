"""Blur corruptions (defocus, glass, motion, zoom) with Hendrycks' CIFAR constants, batched over images.

* defocus_blur: Hendrycks' ``disk`` kernel (aliased disk on a 17x17 grid, smoothed by a 3x3 Gaussian as
  cv2.GaussianBlur does), cropped to its non-zero support and correlated with BORDER_REFLECT_101 (cv2.filter2D).
* glass_blur: skimage ``gaussian`` (scipy 'nearest' border, summed in SciPy's order so the truncated uint8 image is
  the reference's bit for bit), truncate to uint8, the local pixel "shuffle", Gaussian again. The reference's
  ``x[h, w], x[h', w'] = x[h', w'], x[h, w]`` swaps NumPy *views*, so it really copies ``x[h', w']`` into
  ``x[h, w]`` and leaves ``x[h', w']`` unchanged; we reproduce that. Offsets are ``np.random.randint(-d, d)``,
  i.e. in [-d, d-1]. With d = 1 (all CIFAR severities) every source pixel is visited
  later in the descending scan, so one pass equals a single gather from the unmodified image; that fast path is
  used whenever all offsets are <= 0, otherwise we loop over pixel positions in the reference order, vectorised
  over the batch (each image its own offsets).
* motion_blur: no ImageMagick. A line kernel as in imagecorruptions' ``_motion_blur`` (Gaussian weights on
  2*radius+1 taps, integer offsets along the angle, edge replication), which lays out its taps like ImageMagick's
  MagickMotionBlurImage; angle ~ U(-45, 45). ImageMagick writes the result as an 8-bit PNG, i.e. rounds, so this
  corruption is quantised by rounding, not truncation. Remaining differences to ImageMagick (virtual-pixel and
  quantum details) are not modelled: it approximates, not reproduces, CIFAR-10-C's motion blur.
* zoom_blur: the mean of the image and its ``clipped_zoom`` copies for ``np.arange(1, e, 0.01)`` (float arange,
  so 7/12/16/21/26 factors), scipy ``zoom(order=1)`` = align-corners bilinear.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Tuple

import numpy as np
import torch

from ._filters import SeparableSum, apply_separable, correlation_matrix, gaussian_filter, kernel2d_operator, line_blur
from ._resample import zoom_matrix
from ._spec import CorruptionSpec, Fields, quantise

DEFOCUS_BLUR = ((0.3, 0.4), (0.4, 0.5), (0.5, 0.6), (1, 0.2), (1.5, 0.1))  # (disk radius, alias blur sigma)
GLASS_BLUR = ((0.05, 1, 1), (0.25, 1, 1), (0.4, 1, 1), (0.25, 1, 2), (0.4, 1, 2))  # (sigma, max_delta, iterations)
MOTION_BLUR = ((6, 1), (6, 1.5), (6, 2), (8, 2), (9, 2.5))  # ImageMagick (radius, sigma)
MOTION_ANGLE_RANGE = (-45.0, 45.0)
ZOOM_BLUR = tuple(tuple(float(z) for z in np.arange(1, end, 0.01)) for end in (1.06, 1.11, 1.16, 1.21, 1.26))


@lru_cache(maxsize=None)
def disk_kernel(radius: float, alias_blur: float) -> torch.Tensor:
    """Hendrycks' ``disk(radius, alias_blur)`` (float32 values, as cv2 returns), cropped to its non-zero support."""
    if radius <= 8:
        grid, ksize = torch.arange(-8, 9, dtype=torch.float64), 3
    else:
        grid, ksize = torch.arange(-radius, radius + 1, dtype=torch.float64), 5
    yy, xx = torch.meshgrid(grid, grid, indexing="ij")
    disk = (xx**2 + yy**2 <= radius**2).to(torch.float64)
    disk = disk / disk.sum()
    taps = torch.arange(ksize, dtype=torch.float64) - ksize // 2
    gauss = torch.exp(-(taps**2) / (2.0 * alias_blur**2))
    smooth = correlation_matrix(disk.shape[0], gauss / gauss.sum(), "mirror")  # cv2.GaussianBlur, BORDER_REFLECT_101
    kernel = apply_separable(disk, smooth, smooth).float().double()
    centre = kernel.shape[0] // 2
    half = int((kernel.abs().gt(0).nonzero() - centre).abs().max())
    return kernel[centre - half : centre + half + 1, centre - half : centre + half + 1].contiguous()


@lru_cache(maxsize=None)
def _defocus_operator(c: Tuple[float, float], height: int, width: int) -> SeparableSum:
    """cv2.filter2D with the disk kernel (BORDER_REFLECT_101) as a sum of separable terms."""
    return kernel2d_operator(disk_kernel(*c), height, width, "mirror")


def _defocus_blur(x: torch.Tensor, c: Tuple[float, float]) -> torch.Tensor:
    """Correlate with the disk kernel, BORDER_REFLECT_101."""
    return _defocus_operator(tuple(c), *x.shape[-2:])(x).clamp(0.0, 1.0)


def _shuffle_positions(size: int, max_delta: int) -> torch.Tensor:
    """The scan order of the reference loop: ``range(size - d, d, -1)``."""
    return torch.arange(size - max_delta, max_delta, -1)


def _draw_glass_offsets(gen: torch.Generator, c: Tuple[float, int, int], height: int, width: int) -> Fields:
    """Offsets [iterations, n_h, n_w, 2] = (dx, dy) ~ randint(-d, d) for every scanned position."""
    _, max_delta, iterations = c
    shape = (iterations, len(_shuffle_positions(height, max_delta)), len(_shuffle_positions(width, max_delta)), 2)
    return {"offsets": torch.randint(-max_delta, max_delta, shape, generator=gen)}


def local_shuffle(
    levels: torch.Tensor, offsets: torch.Tensor, max_delta: int, force_loop: bool = False
) -> torch.Tensor:
    """Glass blur's scan: for each iteration, h and w descending, ``x[h, w] <- x[h + dy, w + dx]`` per image.

    ``offsets`` [B, iterations, n_h, n_w, 2] hold (dx, dy). When all are <= 0 each pass is one gather (see the
    module docstring); ``force_loop`` runs the position-by-position loop anyway (used by the tests).
    """
    out = levels.clone()
    height, width = out.shape[-2:]
    rows = _shuffle_positions(height, max_delta).to(out.device)
    cols = _shuffle_positions(width, max_delta).to(out.device)
    batch_index = torch.arange(out.shape[0], device=out.device)
    single_gather = not force_loop and bool(offsets.max() <= 0)
    for it in range(offsets.shape[1]):
        dx, dy = offsets[:, it, ..., 0], offsets[:, it, ..., 1]
        if single_gather:  # sources are all read before they are written
            src_rows = rows[None, :, None] + dy
            src_cols = cols[None, None, :] + dx
            flat = (src_rows * width + src_cols).reshape(out.shape[0], 1, -1).expand(-1, out.shape[1], -1)
            values = out.reshape(out.shape[0], out.shape[1], -1).gather(2, flat).reshape(*out.shape[:2], *dx.shape[1:])
            out[:, :, rows[:, None], cols[None, :]] = values
            continue
        for i, h in enumerate(rows.tolist()):
            for j, w in enumerate(cols.tolist()):
                out[:, :, h, w] = out[batch_index, :, h + dy[:, i, j], w + dx[:, i, j]]
    return out


def _glass_blur_with_offsets(x: torch.Tensor, c: Tuple[float, int, int], offsets: torch.Tensor) -> torch.Tensor:
    """Gaussian, truncate to uint8, local shuffle with ``offsets`` [B, iterations, n_h, n_w, 2], Gaussian."""
    sigma, max_delta, _ = c
    levels = quantise(gaussian_filter(x, sigma, "nearest")) * 255.0
    shuffled = local_shuffle(levels, offsets.to(x.device), max_delta)
    return gaussian_filter(shuffled / 255.0, sigma, "nearest").clamp(0.0, 1.0)


def _draw_motion_angle(gen: torch.Generator, _c: object, _height: int, _width: int) -> Fields:
    """A blur angle in degrees ~ U(-45, 45)."""
    low, high = MOTION_ANGLE_RANGE
    return {"angle": low + (high - low) * torch.rand((), generator=gen, dtype=torch.float64)}


def _motion_blur_with_angle(x: torch.Tensor, c: Tuple[int, float], angle: torch.Tensor) -> torch.Tensor:
    """Line-kernel motion blur of radius/sigma ``c`` at per-image ``angle`` [B] degrees."""
    return line_blur(x, c[0], c[1], angle).clamp(0.0, 1.0)


@lru_cache(maxsize=None)
def _zoom_blur_operator(factors: Tuple[float, ...], height: int, width: int) -> SeparableSum:
    """``(x + sum_z clipped_zoom(x, z)) / (n + 1)`` as a sum of separable terms."""
    scale = 1.0 / (len(factors) + 1)
    identity = (torch.eye(height, dtype=torch.float64) * scale, torch.eye(width, dtype=torch.float64))
    zooms = [(zoom_matrix(height, z) * scale, zoom_matrix(width, z)) for z in factors]
    return SeparableSum([identity] + zooms)


def _zoom_blur(x: torch.Tensor, factors: Tuple[float, ...]) -> torch.Tensor:
    """Mean of the image and its clipped zooms."""
    return _zoom_blur_operator(tuple(factors), *x.shape[-2:])(x).clamp(0.0, 1.0)


SPECS = (
    CorruptionSpec("defocus_blur", DEFOCUS_BLUR, _defocus_blur),
    CorruptionSpec("glass_blur", GLASS_BLUR, _glass_blur_with_offsets, _draw_glass_offsets),
    CorruptionSpec("motion_blur", MOTION_BLUR, _motion_blur_with_angle, _draw_motion_angle, rounding="round"),
    CorruptionSpec("zoom_blur", ZOOM_BLUR, _zoom_blur, output_dtype=torch.float32),
)
