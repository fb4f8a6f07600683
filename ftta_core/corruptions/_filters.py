"""Batched linear filters on [..., H, W] tensors with explicit border rules (SciPy/OpenCV names).

Border modes (index extension; ``abcd`` is a row):

* ``"nearest"``: ``aaaa|abcd|dddd`` (scipy 'nearest', cv2 BORDER_REPLICATE; skimage.filters.gaussian default);
* ``"reflect"``: ``dcba|abcd|dcba`` (scipy 'reflect' = half-sample symmetric, cv2 BORDER_REFLECT);
* ``"mirror"``: ``dcb|abcd|cba`` (scipy 'mirror' = cv2 BORDER_REFLECT_101, cv2's default border).

A 1-D correlation including its border rule is a matrix [n, n] (folding repeatedly when the kernel is wider than
the image, exactly as SciPy does), so a separable filter is two small matmuls and a non-separable kernel is a short
sum of them (its SVD); on small images this is much faster than padding + conv2d. Gaussian filters instead sum
shifted copies in SciPy's own order, because glass blur truncates to uint8 between two Gaussians and flat image
regions then sit exactly on a level boundary, where only the same summation order gives the same level.
"""
from __future__ import annotations

from functools import lru_cache
from typing import List, Sequence, Tuple

import numpy as np
import torch

BORDER_MODES = ("nearest", "reflect", "mirror")
DENSE_MAX_PIXELS = 1024  # sums of more than two separable terms run as one dense [HW, HW] matmul up to 32x32
MatrixPair = Tuple[torch.Tensor, torch.Tensor]


def border_index(index: torch.Tensor, size: int, mode: str) -> torch.Tensor:
    """Map integer indices (any range) into [0, size) by the border rule ``mode``."""
    if mode == "nearest" or size == 1:
        return index.clamp(0, size - 1)
    if mode == "reflect":
        period = 2 * size
        folded = torch.remainder(index, period)
        return torch.where(folded < size, folded, period - 1 - folded)
    if mode == "mirror":
        period = 2 * size - 2
        folded = torch.remainder(index, period)
        return torch.where(folded < size, folded, period - folded)
    raise ValueError(f"border mode must be one of {BORDER_MODES}, got {mode!r}")


def correlation_matrix(size: int, kernel: Sequence[float], mode: str) -> torch.Tensor:
    """[size, size] float64 matrix of a 1-D correlation with an odd-length ``kernel`` under border rule ``mode``."""
    weights = torch.as_tensor(kernel, dtype=torch.float64).reshape(-1)
    radius = weights.numel() // 2
    rows = torch.arange(size)
    matrix = torch.zeros(size, size, dtype=torch.float64)
    for tap, weight in enumerate(weights.tolist()):
        columns = border_index(rows + tap - radius, size, mode)
        matrix.index_put_((rows, columns), torch.full((size,), weight, dtype=torch.float64), accumulate=True)
    return matrix


def apply_separable(x: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """``rows @ x @ cols.T`` over the last two dims of ``x`` (rows [H', H], cols [W', W])."""
    out = torch.matmul(x, cols.to(x).transpose(0, 1))
    return torch.matmul(out.transpose(-1, -2), rows.to(x).transpose(0, 1)).transpose(-1, -2)


class SeparableSum:
    """The linear image map ``x -> sum_k R_k x C_k^T``; run as one dense matrix when that is cheaper (<= 32x32)."""

    def __init__(self, pairs: List[MatrixPair]) -> None:
        self.pairs = pairs
        self._dense: torch.Tensor | None = None

    def dense(self) -> torch.Tensor:
        """The map as a [H'W', HW] matrix (built once)."""
        if self._dense is None:
            self._dense = sum(torch.kron(r, c) for r, c in self.pairs)
        return self._dense

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the map to every channel of ``x`` [..., H, W]."""
        rows0, cols0 = self.pairs[0]
        height, width = x.shape[-2:]
        if len(self.pairs) > 2 and height * width <= DENSE_MAX_PIXELS:
            flat = x.reshape(-1, height * width)
            out = torch.matmul(flat, self.dense().to(x).transpose(0, 1))
            return out.reshape(*x.shape[:-2], rows0.shape[0], cols0.shape[0])
        out = apply_separable(x, rows0, cols0)
        for rows, cols in self.pairs[1:]:
            out = out + apply_separable(x, rows, cols)
        return out


@lru_cache(maxsize=None)
def gaussian_kernel1d(sigma: float, truncate: float = 4.0) -> Tuple[float, ...]:
    """scipy.ndimage's normalised 1-D Gaussian, computed with NumPy exactly as SciPy does (bit-identical weights)."""
    radius = int(truncate * float(sigma) + 0.5)
    taps = np.arange(-radius, radius + 1)
    weights = np.exp(-0.5 / (sigma * sigma) * taps**2)
    return tuple((weights / weights.sum()).tolist())


def _correlate_symmetric(x: torch.Tensor, weights: Tuple[float, ...], dim: int, mode: str) -> torch.Tensor:
    """scipy.ndimage.correlate1d with a symmetric kernel, summed in SciPy's order: centre tap first, then the
    pairs ``(left + right) * w`` from the outermost inwards (so float64 results are bit-identical to SciPy's)."""
    radius = len(weights) // 2
    size = x.shape[dim]
    index = border_index(torch.arange(-radius, size + radius, device=x.device), size, mode)
    padded = x.index_select(dim, index)
    out = padded.narrow(dim, radius, size) * weights[radius]
    for offset in range(radius, 0, -1):
        pair = padded.narrow(dim, radius - offset, size) + padded.narrow(dim, radius + offset, size)
        out = out + pair * weights[radius - offset]
    return out


def gaussian_filter(x: torch.Tensor, sigma: float, mode: str = "nearest", truncate: float = 4.0) -> torch.Tensor:
    """Per-channel Gaussian blur over the last two dims = scipy.ndimage.gaussian_filter (skimage ``gaussian``).

    H is filtered before W, as SciPy does; a sigma of (almost) zero leaves the image unchanged, as in SciPy.
    """
    if sigma <= 1e-15:
        return x.clone()
    weights = gaussian_kernel1d(float(sigma), float(truncate))
    return _correlate_symmetric(_correlate_symmetric(x, weights, -2, mode), weights, -1, mode)


def kernel2d_operator(kernel: torch.Tensor, height: int, width: int, mode: str) -> SeparableSum:
    """cv2.filter2D-style correlation with a 2-D ``kernel`` as a sum of separable terms (its SVD)."""
    u, s, vh = torch.linalg.svd(kernel.to(torch.float64))
    rank = int((s > s[0] * 1e-12).sum())
    pairs = [
        (correlation_matrix(height, u[:, r] * s[r], mode), correlation_matrix(width, vh[r], mode)) for r in range(rank)
    ]
    return SeparableSum(pairs)


def gather_shifted(x: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """``out[b, c, i, j] = x[b, c, rows[b, i], cols[b, j]]`` with per-image index vectors rows [B, H'], cols [B, W']."""
    batch, channels, height, width = x.shape
    flat = (rows[:, :, None] * width + cols[:, None, :]).reshape(batch, 1, -1)
    out = x.reshape(batch, channels, -1).gather(2, flat.expand(batch, channels, flat.shape[-1]))
    return out.reshape(batch, channels, rows.shape[1], cols.shape[1])


def line_blur(x: torch.Tensor, radius: int, sigma: float, angles_deg: torch.Tensor) -> torch.Tensor:
    """Motion blur along a line at a per-image angle: imagecorruptions' ``_motion_blur`` (shift, accumulate), batched.

    Tap ``i`` (0..2*radius) has weight ``exp(-i^2 / (2 sigma^2))`` (normalised over the taps) and reads the pixel
    ``(y + ceil(i sin(a) - 0.5), x + ceil(i cos(a) - 0.5))`` with edge replication, which is how ImageMagick's
    MagickMotionBlurImage lays out its taps. As in imagecorruptions, an image stops accumulating at the first tap whose
    offset reaches the image size (weights are then not renormalised).
    """
    batch, _, height, width = x.shape
    taps = 2 * int(radius) + 1
    weights = torch.exp(-(torch.arange(taps, dtype=torch.float64) ** 2) / (2.0 * sigma * sigma))
    weights = weights / weights.sum()
    angles = torch.deg2rad(angles_deg.detach().to("cpu", torch.float64))
    point_y, point_x = taps * torch.sin(angles), taps * torch.cos(angles)
    hypot = torch.hypot(point_y, point_x)
    index = torch.arange(taps, dtype=torch.float64)[:, None]
    dy = -torch.ceil(index * point_y / hypot - 0.5).long()  # [taps, B], imagecorruptions' sign convention
    dx = -torch.ceil(index * point_x / hypot - 0.5).long()
    inside = (dy.abs() < height) & (dx.abs() < width)
    active = torch.cumprod(inside.long(), dim=0).bool()  # the "break" of the reference loop, per image
    tap_weights = (weights[:, None] * active).to(x)  # [taps, B]
    base_rows = torch.arange(height, device=x.device)
    base_cols = torch.arange(width, device=x.device)
    dy, dx = dy.to(x.device), dx.to(x.device)
    out = torch.zeros_like(x)
    for i in range(taps):
        rows = (base_rows[None, :] - dy[i][:, None]).clamp(0, height - 1)
        cols = (base_cols[None, :] - dx[i][:, None]).clamp(0, width - 1)
        out.addcmul_(gather_shifted(x, rows, cols), tap_weights[i].view(batch, 1, 1, 1))
    return out
