"""Weather corruptions (snow, frost, fog) with Hendrycks' CIFAR constants; random fields are drawn per image.

* snow: a N(loc, scale) layer, ``clipped_zoom``, zero below a threshold, truncated to uint8 (the 'L' PNG the
  reference hands to ImageMagick), motion-blurred with the line kernel of ``blur.py`` at an angle ~ U(-135, -45)
  instead of MagickMotionBlurImage (no ImageMagick), rounded to 8 bits (ImageMagick's PNG output), then
  ``x = b x + (1-b) max(x, 1.5 gray(x) + 0.5)`` and ``clip(x + snow + rot180(snow))``.
* frost: texture frost1..frost5 (frost6 is unreachable in the reference) from the ``imagecorruptions`` package
  folder, decoded with Pillow (identical pixels to cv2.imread, alpha dropped) and resized by 0.2 as
  ``cv2.resize(fx=fy=0.2)`` with its default INTER_LINEAR: at exactly 1/5 with half-pixel centres every output pixel
  lands on source pixel 5i+2 with zero fractional weight, so the resize is the exact subsample ``[2::5, 2::5]``
  (sizes 120x180, 63x112, 63x112, 70x105, 99x132; checked against OpenCV). Random crop offsets follow
  ``np.random.randint(0, size - n)``; ``clip(a x + b frost)``. Images too large for a texture (crop needs
  size >= n + 1) use the full-resolution texture resized with Pillow BILINEAR just enough to fit.
* fog: a diamond-square plasma fractal per image on a map of the next power of two >= max(H, W) (32 for CIFAR,
  as in the reference), cropped to H x W; ``clip((x + s fog) max(x) / (max(x) + s))``.
"""
from __future__ import annotations

import importlib.util
import math
from functools import lru_cache
from pathlib import Path
from typing import Tuple

import numpy as np
import torch
from PIL import Image

from ._color import rgb_to_gray
from ._filters import line_blur
from ._resample import clipped_zoom
from ._spec import CorruptionSpec, Fields, quantise

# (loc, scale, zoom, threshold, blur radius, blur sigma, blend)
SNOW = (
    (0.1, 0.2, 1, 0.6, 8, 3, 0.95),
    (0.1, 0.2, 1, 0.5, 10, 4, 0.9),
    (0.15, 0.3, 1.75, 0.55, 10, 4, 0.9),
    (0.25, 0.3, 2.25, 0.6, 12, 6, 0.85),
    (0.3, 0.3, 1.25, 0.65, 14, 12, 0.8),
)
SNOW_ANGLE_RANGE = (-135.0, -45.0)
FROST = ((1, 0.2), (1, 0.3), (0.9, 0.4), (0.85, 0.4), (0.75, 0.45))  # (image weight, frost weight)
FROST_FILES = ("frost1.png", "frost2.png", "frost3.png", "frost4.jpg", "frost5.jpg")
FROST_STRIDE = 5  # cv2.resize(fx=fy=0.2): output pixel i <- source pixel 5 i + 2
FOG = ((0.2, 3), (0.5, 3), (0.75, 2.5), (1, 2), (1.5, 1.75))  # (fog strength, wibble decay)
_PLASMA_START_WIBBLE = 100.0


def _draw_snow(gen: torch.Generator, c: Tuple[float, ...], height: int, width: int) -> Fields:
    """The N(loc, scale) layer [H, W] and a blur angle ~ U(-135, -45) degrees."""
    loc, scale = c[0], c[1]
    layer = loc + scale * torch.randn(height, width, generator=gen, dtype=torch.float64)
    low, high = SNOW_ANGLE_RANGE
    angle = low + (high - low) * torch.rand((), generator=gen, dtype=torch.float64)
    return {"layer": layer, "angle": angle}


def _snow_with_fields(x: torch.Tensor, c: Tuple[float, ...], layer: torch.Tensor, angle: torch.Tensor) -> torch.Tensor:
    """Snow from the normal ``layer`` [B, H, W] and blur ``angle`` [B]."""
    _, _, zoom, threshold, radius, sigma, blend = c
    flakes = clipped_zoom(layer[:, None].to(x.device, torch.float64), zoom)
    flakes = quantise(torch.where(flakes < threshold, torch.zeros_like(flakes), flakes))
    flakes = quantise(line_blur(flakes, radius, sigma, angle), "round").to(x)
    whitened = torch.maximum(x, rgb_to_gray(x) * 1.5 + 0.5)
    x = blend * x + (1.0 - blend) * whitened
    return (x + flakes + flakes.flip(-2, -1)).clamp(0.0, 1.0)


def frost_folder() -> Path:
    """The ``frost/`` folder of the installed ``imagecorruptions`` package (located without importing it)."""
    spec = importlib.util.find_spec("imagecorruptions")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "the frost corruption needs the texture images shipped by the PyPI package imagecorruptions: "
            "pip install --no-deps imagecorruptions==1.1.2 (it is never imported, so OpenCV is not needed)"
        )
    return Path(list(spec.submodule_search_locations)[0]) / "frost"


@lru_cache(maxsize=None)
def _frost_original(index: int) -> np.ndarray:
    """Full-resolution texture ``index`` (0..4) as uint8 RGB [H, W, 3]."""
    with Image.open(frost_folder() / FROST_FILES[index]) as image:
        return np.asarray(image.convert("RGB"))


@lru_cache(maxsize=None)
def frost_texture(index: int, min_height: int = 32, min_width: int = 32) -> torch.Tensor:
    """Texture ``index`` resized by 0.2 as uint8 [3, h, w], h > min_height and w > min_width (upscaled if needed)."""
    original = _frost_original(index)
    height, width = (int(np.rint(n / FROST_STRIDE)) for n in original.shape[:2])  # cv2: round(n * 0.2)
    if height > min_height and width > min_width:
        offset = FROST_STRIDE // 2
        texture = original[offset::FROST_STRIDE, offset::FROST_STRIDE][:height, :width]
    else:
        factor = max((min_height + 1) / height, (min_width + 1) / width)
        size = (math.ceil(width * factor), math.ceil(height * factor))
        texture = np.asarray(Image.fromarray(original).resize(size, Image.Resampling.BILINEAR))
    return torch.from_numpy(np.array(texture)).permute(2, 0, 1).contiguous()


def _draw_frost(gen: torch.Generator, _c: object, height: int, width: int) -> Fields:
    """Texture index ~ randint(5), then the crop offsets; returns the [3, H, W] crop in [0, 1]."""
    index = int(torch.randint(0, len(FROST_FILES), (), generator=gen))
    texture = frost_texture(index, height, width)
    top = int(torch.randint(0, texture.shape[1] - height, (), generator=gen))
    left = int(torch.randint(0, texture.shape[2] - width, (), generator=gen))
    return {"frost": texture[:, top : top + height, left : left + width].to(torch.float64) / 255.0}


def _frost_with_crop(x: torch.Tensor, c: Tuple[float, float], frost: torch.Tensor) -> torch.Tensor:
    """``clip(a x + b frost)`` with the texture crop ``frost`` [B, 3, H, W], in 0..255 units like the reference."""
    return (c[0] * (x * 255.0) + c[1] * (frost.to(x) * 255.0)).clamp(0.0, 255.0) / 255.0


def plasma_size(height: int, width: int) -> int:
    """Side of the plasma map: the next power of two >= max(H, W)."""
    return 1 << (max(height, width) - 1).bit_length()


def plasma_uniform_count(mapsize: int) -> int:
    """Number of U[0, 1) draws one plasma map consumes (three grids per octave)."""
    return sum(3 * (mapsize // (mapsize >> level)) ** 2 for level in range(int(math.log2(mapsize))))


def _draw_plasma(gen: torch.Generator, _c: object, height: int, width: int) -> Fields:
    """All U[0, 1) draws of one plasma map, in the order the reference consumes them."""
    count = plasma_uniform_count(plasma_size(height, width))
    return {"uniforms": torch.rand(count, generator=gen, dtype=torch.float64)}


def plasma_fractal(uniforms: torch.Tensor, mapsize: int, wibbledecay: float) -> torch.Tensor:
    """Hendrycks' diamond-square ``plasma_fractal`` for a batch: ``uniforms`` [B, N] -> maps [B, m, m] in [0, 1].

    ``np.random.uniform(-w, w, shape)`` is ``-w + 2w u``; each octave consumes three grids of u (squares, then the
    two diamond grids), in that order.
    """
    batch = uniforms.shape[0]
    maparray = torch.zeros(batch, mapsize, mapsize, dtype=torch.float64, device=uniforms.device)
    stepsize, wibble, used = mapsize, _PLASMA_START_WIBBLE, 0
    while stepsize >= 2:
        n, half = mapsize // stepsize, stepsize // 2
        draws = uniforms[:, used : used + 3 * n * n].reshape(batch, 3, n, n).to(torch.float64)
        used += 3 * n * n

        def wibbled_mean(total: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
            return total / 4 + wibble * (-wibble + (wibble - -wibble) * u)

        corners = maparray[:, 0::stepsize, 0::stepsize]
        square = corners + corners.roll(-1, 1)
        square = square + square.roll(-1, 2)
        maparray[:, half::stepsize, half::stepsize] = wibbled_mean(square, draws[:, 0])
        centres = maparray[:, half::stepsize, half::stepsize]
        corners = maparray[:, 0::stepsize, 0::stepsize]
        left_total = (centres + centres.roll(1, 1)) + (corners + corners.roll(-1, 2))
        maparray[:, 0::stepsize, half::stepsize] = wibbled_mean(left_total, draws[:, 1])
        top_total = (centres + centres.roll(1, 2)) + (corners + corners.roll(-1, 1))
        maparray[:, half::stepsize, 0::stepsize] = wibbled_mean(top_total, draws[:, 2])
        stepsize //= 2
        wibble /= wibbledecay
    maparray = maparray - maparray.amin((1, 2), keepdim=True)
    return maparray / maparray.amax((1, 2), keepdim=True)


def _fog_with_field(x: torch.Tensor, c: Tuple[float, float], fractal: torch.Tensor) -> torch.Tensor:
    """``clip((x + s fractal) max(x) / (max(x) + s))`` with the plasma ``fractal`` [B, H, W]."""
    strength = c[0]
    peak = x.amax((1, 2, 3), keepdim=True)
    fogged = x + strength * fractal[:, None].to(x)
    return (fogged * peak / (peak + strength)).clamp(0.0, 1.0)


def _fog(x: torch.Tensor, c: Tuple[float, float], uniforms: torch.Tensor) -> torch.Tensor:
    """Fog from the plasma draws ``uniforms`` [B, N]."""
    height, width = x.shape[-2:]
    fractal = plasma_fractal(uniforms, plasma_size(height, width), c[1])[:, :height, :width]
    return _fog_with_field(x, c, fractal)


SPECS = (
    CorruptionSpec("snow", SNOW, _snow_with_fields, _draw_snow),
    CorruptionSpec("frost", FROST, _frost_with_crop, _draw_frost),
    CorruptionSpec("fog", FOG, _fog, _draw_plasma),
)
