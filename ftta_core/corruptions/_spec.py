"""The record that describes one corruption (constants, random-field drawer, batched kernel) and output quantisation."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Sequence

import torch

Fields = Dict[str, torch.Tensor]
# draw(generator, constant, height, width) -> the random fields of ONE image (CPU tensors)
Drawer = Callable[[torch.Generator, Any, int, int], Fields]
# apply(images [B,3,H,W] float, constant, **fields stacked to [B, ...] on the images' device) -> float images
Kernel = Callable[..., torch.Tensor]

# Added (in 1/255 units) before truncation so that a value that is an exact integer in exact arithmetic, e.g.
# 255 * (k/255 + 0.2 * m/255) with m a multiple of 5, is not truncated one level down by float rounding.
# It is far above float32 round-off (~3e-5 after a handful of operations) and far below one level.
_TRUNCATION_EPS = {torch.float32: 5e-4, torch.float64: 1e-7}


@dataclass(frozen=True)
class CorruptionSpec:
    """One corruption: Hendrycks' CIFAR constants per severity, its random-field drawer and its batched kernel."""

    name: str
    constants: Sequence[Any]
    apply: Kernel
    draw: Optional[Drawer] = None
    rounding: str = "floor"  # "floor" = np.uint8 truncation as in make_cifar_c.py; "round" = 8-bit codec output

    def constant(self, severity: int) -> Any:
        """The constant of ``severity`` (1-based)."""
        return self.constants[severity - 1]


def quantise(y: torch.Tensor, rounding: str = "floor") -> torch.Tensor:
    """Clip to [0, 1] and snap to the 8-bit grid k/255: floor (np.uint8 truncation) or round-to-nearest."""
    scaled = y.clamp(0.0, 1.0) * 255.0
    if rounding == "floor":
        levels = torch.floor(scaled + _TRUNCATION_EPS.get(y.dtype, 5e-4))
    elif rounding == "round":
        levels = torch.round(scaled)
    else:
        raise ValueError(f"rounding must be 'floor' or 'round', got {rounding!r}")
    return levels.clamp_(0.0, 255.0) / 255.0
