"""Batched test-time augmentations for TTA methods (CoTTA, RoTTA, ROID, BBN), without gradients.

``augment(x, generator, strength)`` takes clients' batches ``x`` [N, B, C, H, W] (floats in [0, 1]) and returns an
augmented copy of the same shape; every random draw comes from ``generator`` (derive it with
``ftta_core.rng.torch_generator(seed, "augment", ..., step)``), so a call is reproducible and, since it runs outside
the client bank, identical for the loop and vectorized backends.

The pipeline follows ``augmentations/transforms_cotta.py`` of mariodoebler/test-time-adaptation, in this order:

1. clip to [0, 1];
2. colour jitter (ColorJitterPro): brightness, contrast, saturation, hue, gamma -- by default in this fixed order;
   ``jitter_order='shuffled'`` draws a random order of them per draw unit, as the reference's
   ``ColorJitterPro.forward`` does per call (``torch.randperm(5)`` over all five, gamma included; torchvision's
   ColorJitter shuffles its four). Saturation and hue only act on 3-channel images;
3. geometry as ONE bilinear resampling: random affine (rotation, zoom, translation), random resized crop, integer
   pad-and-crop shift and horizontal flip. Pixels outside the image come from ``padding_mode`` ('border' = the
   reference's edge padding of n/2 pixels before the affine and the centre crop after it; 'reflection'; 'zeros'),
   which is equivalent to pad + affine + centre crop as long as no sample falls beyond the n/2 padding (true for the
   presets). Translations are not rounded to whole pixels (torchvision rounds them); pad-and-crop shifts are whole
   pixels;
4. gaussian blur, kernel 5, sigma drawn per image (reflect padding);
5. gaussian noise; 6. clip to [0, 1].

Presets (``STRENGTHS``): 'cotta' (the CoTTA/RoTTA constants), 'soft' (the reference's soft variant), 'roid'
(``cotta_augs=False`` with reflect padding: jitter + affine + flip, no blur or noise), 'weak' (pad-and-crop by 1/8
of the size + flip), 'crop' (random resized crop of 50-100% of the area + flip). Pass an ``AugmentSpec`` for
anything else.

``share`` chooses who shares a draw: 'batch' (default: one draw per client batch, as the reference applies the
transform to the whole batch tensor) or 'image' (an independent draw per image).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, List, Optional, Tuple, Union

import torch
import torch.nn.functional as F

from ..validation import check_choice

Range = Tuple[float, float]
PADDING_MODES = ("border", "reflection", "zeros")
SHARE = ("batch", "image")
JITTER_ORDERS = ("fixed", "shuffled")
_GRAY = (0.2989, 0.587, 0.114)  # torchvision rgb_to_grayscale


@dataclass(frozen=True)
class AugmentSpec:
    """Ranges of one augmentation pipeline (identity ranges switch a transform off)."""

    brightness: Range = (1.0, 1.0)
    contrast: Range = (1.0, 1.0)
    saturation: Range = (1.0, 1.0)
    hue: Range = (0.0, 0.0)
    gamma: Range = (1.0, 1.0)
    degrees: float = 0.0              # rotation drawn in [-degrees, degrees]
    translate: float = 0.0            # shift drawn in [-t, t] x image size (continuous)
    scale: Range = (1.0, 1.0)         # isotropic zoom
    crop_area: Optional[Range] = None  # random resized crop: area fraction, aspect ratio in [3/4, 4/3]
    shift: float = 0.0                # pad-and-crop: whole-pixel shift in [-p, p], p = round(shift x size)
    padding_mode: str = "border"
    flip: float = 0.0                 # probability of a horizontal flip
    blur_sigma: Optional[Range] = None
    noise_std: float = 0.0

    def __post_init__(self) -> None:
        check_choice("padding_mode", self.padding_mode, PADDING_MODES)
        if not 0.0 <= self.flip <= 1.0:
            raise ValueError(f"flip must be a probability in [0, 1], got {self.flip}")
        if self.noise_std < 0 or self.degrees < 0 or self.translate < 0 or self.shift < 0:
            raise ValueError("noise_std, degrees, translate and shift must be non-negative")
        for name in ("brightness", "contrast", "saturation", "gamma", "scale"):
            lo, hi = getattr(self, name)
            if not 0 <= lo <= hi:
                raise ValueError(f"{name} must be a range 0 <= lo <= hi, got {(lo, hi)}")
        if self.crop_area is not None and not 0 < self.crop_area[0] <= self.crop_area[1] <= 1:
            raise ValueError(f"crop_area must satisfy 0 < lo <= hi <= 1, got {self.crop_area}")
        if self.blur_sigma is not None and not 0 < self.blur_sigma[0] <= self.blur_sigma[1]:
            raise ValueError(f"blur_sigma must satisfy 0 < lo <= hi, got {self.blur_sigma}")

    @property
    def geometric(self) -> bool:
        """True when the pipeline resamples the image (anything beyond a plain flip)."""
        return (self.degrees > 0 or self.translate > 0 or self.scale != (1.0, 1.0) or self.crop_area is not None
                or self.shift > 0)


_COTTA_COLOUR = dict(brightness=(0.6, 1.4), contrast=(0.7, 1.3), saturation=(0.5, 1.5), hue=(-0.06, 0.06),
                     gamma=(0.7, 1.3))
STRENGTHS = {
    "cotta": AugmentSpec(**_COTTA_COLOUR, degrees=15.0, translate=1 / 8, scale=(0.9, 1.1), padding_mode="border",
                         flip=0.5, blur_sigma=(0.001, 0.5), noise_std=0.005),
    "soft": AugmentSpec(brightness=(0.8, 1.2), contrast=(0.85, 1.15), saturation=(0.75, 1.25), hue=(-0.03, 0.03),
                        gamma=(0.85, 1.15), degrees=8.0, translate=1 / 8, scale=(0.95, 1.05), padding_mode="border",
                        flip=0.5, blur_sigma=(0.001, 0.25), noise_std=0.005),
    "roid": AugmentSpec(**_COTTA_COLOUR, degrees=15.0, translate=1 / 8, scale=(0.9, 1.1), padding_mode="reflection",
                        flip=0.5),
    "weak": AugmentSpec(shift=1 / 8, padding_mode="zeros", flip=0.5),
    "crop": AugmentSpec(crop_area=(0.5, 1.0), padding_mode="border", flip=0.5),
}


class _Draw:
    """Uniform draws from one generator, one value per draw unit, repeated over the images of a unit."""

    def __init__(self, generator: torch.Generator, units: int, repeat: int, device, dtype) -> None:
        self.generator, self.units, self.repeat, self.device, self.dtype = generator, units, repeat, device, dtype

    def uniform(self, lo: float, hi: float) -> torch.Tensor:
        u = torch.rand(self.units, generator=self.generator, device=self.generator.device, dtype=torch.float64)
        return (lo + (hi - lo) * u).repeat_interleave(self.repeat).to(self.device, self.dtype)

    def randint(self, lo: int, hi: int) -> torch.Tensor:
        r = torch.randint(lo, hi + 1, (self.units,), generator=self.generator, device=self.generator.device)
        return r.repeat_interleave(self.repeat).to(self.device, self.dtype)


def _view(t: torch.Tensor) -> torch.Tensor:
    return t.view(-1, 1, 1, 1)


def _grayscale(x: torch.Tensor) -> torch.Tensor:
    """Luma [M, 1, H, W] of [M, C, H, W] images (the channel itself when C != 3)."""
    if x.shape[1] != 3:
        return x.mean(1, keepdim=True)
    w = torch.tensor(_GRAY, dtype=x.dtype, device=x.device).view(1, 3, 1, 1)
    return (x * w).sum(1, keepdim=True)


def _rgb_to_hsv(x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    r, g, b = x.unbind(1)
    maxc, minc = x.amax(1), x.amin(1)
    same = maxc == minc
    ones = torch.ones_like(maxc)
    chroma = maxc - minc
    s = chroma / torch.where(same, ones, maxc)
    div = torch.where(same, ones, chroma)
    rc, gc, bc = (maxc - r) / div, (maxc - g) / div, (maxc - b) / div
    h = ((maxc == r) * (bc - gc) + ((maxc == g) & (maxc != r)) * (2.0 + rc - bc)
         + ((maxc != g) & (maxc != r)) * (4.0 + gc - rc))
    return torch.fmod(h / 6.0 + 1.0, 1.0), s, maxc


def _hsv_to_rgb(h: torch.Tensor, s: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    i = torch.floor(h * 6.0)
    f = h * 6.0 - i
    i = i.long() % 6
    p, q, t = ((v * (1 - s)).clamp(0, 1), (v * (1 - s * f)).clamp(0, 1), (v * (1 - s * (1 - f))).clamp(0, 1))
    sector = (i.unsqueeze(1) == torch.arange(6, device=h.device).view(1, 6, 1, 1)).to(h.dtype)  # [M, 6, H, W]
    table = torch.stack([torch.stack(c, 1) for c in ((v, q, p, p, t, v), (t, v, v, q, p, p), (p, p, t, v, v, q))], 1)
    return (table * sector.unsqueeze(1)).sum(2)


def _brightness(x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    return (x * _view(f)).clamp(0, 1)


def _contrast(x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    c = _view(f)
    return (c * x + (1 - c) * _grayscale(x).mean((1, 2, 3), keepdim=True)).clamp(0, 1)


def _saturation(x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    s = _view(f)
    return (s * x + (1 - s) * _grayscale(x)).clamp(0, 1)


def _hue(x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    h, s, v = _rgb_to_hsv(x)
    return _hsv_to_rgb(torch.remainder(h + f.view(-1, 1, 1), 1.0), s, v)


def _gamma(x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    return x.clamp_min(0).pow(_view(f)).clamp(0, 1)


def _colour_ops(spec: AugmentSpec, channels: int) -> List[Tuple[str, Range, Callable]]:
    """The active colour transforms in the canonical order (name, range, fn(images, factors))."""
    ops = [("brightness", spec.brightness, _brightness, spec.brightness != (1.0, 1.0)),
           ("contrast", spec.contrast, _contrast, spec.contrast != (1.0, 1.0)),
           ("saturation", spec.saturation, _saturation, channels == 3 and spec.saturation != (1.0, 1.0)),
           ("hue", spec.hue, _hue, channels == 3 and spec.hue != (0.0, 0.0)),
           ("gamma", spec.gamma, _gamma, spec.gamma != (1.0, 1.0))]
    return [(name, rng, fn) for name, rng, fn, active in ops if active]


def jitter_orders(generator: torch.Generator, units: int, n_ops: int) -> torch.Tensor:
    """A uniformly random order of ``n_ops`` colour transforms per draw unit: [units, n_ops] (row = a permutation)."""
    u = torch.rand(units, n_ops, generator=generator, device=generator.device, dtype=torch.float64)
    return u.argsort(1).cpu()


def _colour(x: torch.Tensor, spec: AugmentSpec, draw: _Draw, jitter_order: str = "fixed") -> torch.Tensor:
    """ColorJitterPro: brightness, contrast, saturation, hue, gamma (each clamped to [0, 1], as torchvision).

    The factors are drawn in that canonical order either way. ``jitter_order='fixed'`` applies the transforms in it;
    'shuffled' then draws a random order per draw unit (``jitter_orders``), as the reference's
    ``ColorJitterPro.forward`` does per call with ``torch.randperm(5)``.
    """
    ops = _colour_ops(spec, x.shape[1])
    if jitter_order == "fixed":
        for _, rng, fn in ops:
            x = fn(x, draw.uniform(*rng))
        return x
    factors = [draw.uniform(*rng) for _, rng, _ in ops]
    if len(ops) < 2:
        return ops[0][2](x, factors[0]) if ops else x
    order = jitter_orders(draw.generator, draw.units, len(ops)).repeat_interleave(draw.repeat, 0)  # [M, n_ops]
    for slot in range(len(ops)):
        done = x.clone()
        for j, (_, _, fn) in enumerate(ops):
            idx = (order[:, slot] == j).nonzero().flatten().to(x.device)
            if len(idx):
                done[idx] = fn(x[idx], factors[j][idx])
        x = done
    return x


def _geometry(x: torch.Tensor, spec: AugmentSpec, draw: _Draw) -> torch.Tensor:
    """Affine + resized crop + pad-and-crop + flip as one bilinear ``grid_sample`` (output pixel -> input pixel)."""
    m, _, h, w = x.shape
    ones = torch.ones(m, dtype=x.dtype, device=x.device)
    angle = draw.uniform(-spec.degrees, spec.degrees) * (math.pi / 180) if spec.degrees > 0 else 0 * ones
    zoom = draw.uniform(*spec.scale) if spec.scale != (1.0, 1.0) else ones
    kx, ky = 1 / zoom, 1 / zoom
    bx, by = 0 * ones, 0 * ones
    if spec.translate > 0:
        bx = bx + draw.uniform(-spec.translate, spec.translate) * w
        by = by + draw.uniform(-spec.translate, spec.translate) * h
    if spec.crop_area is not None:  # area fraction a, aspect r: crop of sqrt(a r) W x sqrt(a / r) H inside the image
        area = draw.uniform(*spec.crop_area)
        ratio = torch.exp(draw.uniform(math.log(3 / 4), math.log(4 / 3)))
        cw, ch = (area * ratio).sqrt().clamp(max=1.0), (area / ratio).sqrt().clamp(max=1.0)
        kx, ky = kx * cw, ky * ch
        bx = bx + (draw.uniform(-0.5, 0.5) * (1 - cw)) * w
        by = by + (draw.uniform(-0.5, 0.5) * (1 - ch)) * h
    if spec.shift > 0:
        p = max(1, round(spec.shift * w))
        bx, by = bx + draw.randint(-p, p), by + draw.randint(-p, p)
    if spec.flip > 0:
        kx = kx * torch.where(draw.uniform(0.0, 1.0) < spec.flip, -ones, ones)
    cos, sin = torch.cos(angle), torch.sin(angle)
    # pixel coordinates about the centre: in = R(angle) diag(kx, ky) out + b; normalised by 2/W, 2/H
    theta = torch.stack([torch.stack([cos * kx, -sin * ky * h / w, bx * 2 / w], 1),
                         torch.stack([sin * kx * w / h, cos * ky, by * 2 / h], 1)], 1)
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode=spec.padding_mode, align_corners=False)


def _flip(x: torch.Tensor, p: float, draw: _Draw) -> torch.Tensor:
    return torch.where(_view(draw.uniform(0.0, 1.0) < p), x.flip(-1), x)


def _blur(x: torch.Tensor, sigma_range: Range, draw: _Draw, size: int = 5) -> torch.Tensor:
    """Gaussian blur with a per-image sigma (separable, reflect padding, as torchvision's gaussian_blur)."""
    m, c, h, w = x.shape
    sigma = draw.uniform(*sigma_range)
    t = torch.linspace(-(size // 2), size // 2, size, dtype=x.dtype, device=x.device)
    k = torch.exp(-0.5 * (t[None, :] / sigma[:, None]) ** 2)
    k = (k / k.sum(1, keepdim=True)).repeat_interleave(c, 0)  # [M*C, size]
    y = F.pad(x.reshape(1, m * c, h, w), [size // 2] * 4, mode="reflect")
    y = F.conv2d(y, k.view(m * c, 1, size, 1), groups=m * c)
    y = F.conv2d(y, k.view(m * c, 1, 1, size), groups=m * c)
    return y.view(m, c, h, w)


@torch.no_grad()
def augment(x: torch.Tensor, generator: torch.Generator, strength: Union[str, AugmentSpec] = "cotta",
            share: str = "batch", jitter_order: str = "fixed") -> torch.Tensor:
    """An augmented copy of clients' batches ``x`` [N, B, C, H, W] in [0, 1] (see the module docstring).

    ``strength``: a preset name of ``STRENGTHS`` or an ``AugmentSpec``; ``share``: 'batch' (one draw per client
    batch) or 'image' (one draw per image); ``jitter_order``: 'fixed' (brightness, contrast, saturation, hue, gamma)
    or 'shuffled' (a random order per draw unit, as the reference). All draws come from ``generator`` (on any
    device; values are moved to ``x``'s device).
    """
    if x.dim() != 5:
        raise ValueError(f"augment expects x of shape [N, B, C, H, W], got {tuple(x.shape)}")
    if isinstance(strength, str):
        check_choice("strength", strength, tuple(STRENGTHS))
        strength = STRENGTHS[strength]
    check_choice("share", share, SHARE)
    check_choice("jitter_order", jitter_order, JITTER_ORDERS)
    spec = strength
    n, b = x.shape[:2]
    units, repeat = (n, b) if share == "batch" else (n * b, 1)
    draw = _Draw(generator, units, repeat, x.device, x.dtype)
    y = x.reshape(n * b, *x.shape[2:]).clamp(0, 1)
    y = _colour(y, spec, draw, jitter_order)
    if spec.geometric:
        y = _geometry(y, spec, draw)
    elif spec.flip > 0:
        y = _flip(y, spec.flip, draw)
    if spec.blur_sigma is not None:
        y = _blur(y, spec.blur_sigma, draw)
    if spec.noise_std > 0:
        noise = torch.randn(y.shape, generator=generator, device=generator.device, dtype=torch.float32)
        y = y + spec.noise_std * noise.to(y.device, y.dtype)
    return y.clamp(0, 1).view_as(x)


__all__ = ["augment", "AugmentSpec", "STRENGTHS", "PADDING_MODES", "JITTER_ORDERS", "jitter_orders"]
