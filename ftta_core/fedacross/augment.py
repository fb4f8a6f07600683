"""Server-side transformation module T: horizontal flip, random resized crop, colour jitter (batched, seeded)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class AugmentSpec:
    """Ranges of the augmentation chain (torchvision-like; fixed order crop -> flip -> brightness/contrast/saturation)."""

    scale: Tuple[float, float] = (0.35, 1.0)
    ratio: Tuple[float, float] = (3 / 4, 4 / 3)
    jitter: float = 0.4
    flip: bool = True

    def __post_init__(self) -> None:
        if not 0 < self.scale[0] <= self.scale[1] <= 1:
            raise ValueError(f"scale must satisfy 0 < lo <= hi <= 1, got {self.scale}")
        if not 0 < self.ratio[0] <= self.ratio[1]:
            raise ValueError(f"ratio must satisfy 0 < lo <= hi, got {self.ratio}")
        if not 0 <= self.jitter < 1:
            raise ValueError(f"jitter must be in [0, 1), got {self.jitter}")


def _uniform(lo: float, hi: float, n: int, gen: torch.Generator) -> torch.Tensor:
    return lo + (hi - lo) * torch.rand(n, generator=gen)


def random_resized_crop_flip(x: torch.Tensor, spec: AugmentSpec, gen: torch.Generator) -> torch.Tensor:
    """Per-image random resized crop (area fraction in ``scale``, aspect in ``ratio``) and flip, one grid_sample."""
    b = x.shape[0]
    area = _uniform(*spec.scale, b, gen)
    log_ratio = _uniform(float(torch.tensor(spec.ratio[0]).log()), float(torch.tensor(spec.ratio[1]).log()), b, gen)
    aspect = log_ratio.exp()
    w = (area * aspect).sqrt().clamp(max=1.0)      # crop width / image width
    h = (area / aspect).sqrt().clamp(max=1.0)
    cx = (torch.rand(b, generator=gen) * 2 - 1) * (1 - w)  # crop centre in [-1, 1] coordinates, inside the image
    cy = (torch.rand(b, generator=gen) * 2 - 1) * (1 - h)
    sign = torch.where(torch.rand(b, generator=gen) < 0.5, -1.0, 1.0) if spec.flip else torch.ones(b)
    theta = torch.zeros(b, 2, 3)
    theta[:, 0, 0], theta[:, 0, 2] = w * sign, cx
    theta[:, 1, 1], theta[:, 1, 2] = h, cy
    grid = F.affine_grid(theta.to(x), list(x.shape), align_corners=False)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="reflection", align_corners=False)


def colour_jitter(x: torch.Tensor, strength: float, gen: torch.Generator) -> torch.Tensor:
    """Brightness, contrast and saturation factors drawn per image from [1 - strength, 1 + strength]."""
    if strength == 0:
        return x
    b = x.shape[0]
    f = [_uniform(1 - strength, 1 + strength, b, gen).to(x).view(b, 1, 1, 1) for _ in range(3)]
    x = (x * f[0]).clamp(0, 1)
    gray = (0.299 * x[:, 0] + 0.587 * x[:, 1] + 0.114 * x[:, 2]).unsqueeze(1)
    x = ((x - gray.mean((2, 3), keepdim=True)) * f[1] + gray.mean((2, 3), keepdim=True)).clamp(0, 1)
    gray = (0.299 * x[:, 0] + 0.587 * x[:, 1] + 0.114 * x[:, 2]).unsqueeze(1)
    return (gray + (x - gray) * f[2]).clamp(0, 1)


def transform(x: torch.Tensor, spec: AugmentSpec, gen: torch.Generator) -> torch.Tensor:
    """T(x): the augmentation chain on a float batch [B, 3, H, W] in [0, 1]; every draw from ``gen``."""
    return colour_jitter(random_resized_crop_flip(x, spec, gen), spec.jitter, gen).contiguous()
