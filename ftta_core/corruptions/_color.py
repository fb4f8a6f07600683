"""Colour conversions on [B, 3, H, W] tensors, written to match skimage.color and cv2.cvtColor formula for formula."""
from __future__ import annotations

import torch

# cv2.COLOR_RGB2GRAY weights
_GRAY_WEIGHTS = (0.299, 0.587, 0.114)
# skimage.color.hsv2rgb: per sector floor(6H) mod 6, which of (v, p, q, t) each of R, G, B takes
_SECTOR_TABLE = torch.tensor([[0, 3, 1], [2, 0, 1], [1, 0, 3], [1, 2, 0], [3, 1, 0], [0, 1, 2]])


def rgb_to_gray(x: torch.Tensor) -> torch.Tensor:
    """Luma 0.299 R + 0.587 G + 0.114 B as [B, 1, H, W] (cv2.cvtColor RGB2GRAY on float images)."""
    r, g, b = x.unbind(1)
    return (_GRAY_WEIGHTS[0] * r + _GRAY_WEIGHTS[1] * g + _GRAY_WEIGHTS[2] * b).unsqueeze(1)


def rgb_to_hsv(x: torch.Tensor) -> torch.Tensor:
    """skimage.color.rgb2hsv: H, S, V in [0, 1]; on ties blue beats green beats red; grey pixels get H = S = 0."""
    r, g, b = x.unbind(1)
    value = x.amax(1)
    delta = value - x.amin(1)
    grey = delta == 0
    safe_delta = delta.masked_fill(grey, 1.0)
    saturation = delta / value.masked_fill(grey, 1.0)  # 0 for grey pixels
    hue = (g - b) / safe_delta  # red is the max unless overridden below
    hue = torch.where(g == value, 2.0 + (b - r) / safe_delta, hue)
    hue = torch.where(b == value, 4.0 + (r - g) / safe_delta, hue)
    hue = torch.remainder(hue / 6.0, 1.0).masked_fill_(grey, 0.0)
    return torch.stack((hue, saturation, value), dim=1)


def hsv_to_rgb(hsv: torch.Tensor) -> torch.Tensor:
    """skimage.color.hsv2rgb: the six-sector formula with sector ``floor(6 H) mod 6``."""
    hue, saturation, value = hsv.unbind(1)
    sector = torch.floor(hue * 6.0)
    f = hue * 6.0 - sector
    p = value * (1.0 - saturation)
    q = value * (1.0 - f * saturation)
    t = value * (1.0 - (1.0 - f) * saturation)
    candidates = torch.stack((value, p, q, t), dim=1)  # [B, 4, H, W]
    index = _SECTOR_TABLE.to(hsv.device)[torch.remainder(sector.long(), 6)].permute(0, 3, 1, 2)
    return candidates.gather(1, index)
