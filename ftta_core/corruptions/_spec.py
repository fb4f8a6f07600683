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

# Inputs this close (in 1/255 units) to the 8-bit grid are snapped onto it exactly (see ``snap_to_grid``).
_GRID_SNAP_TOLERANCE = 1e-4


@dataclass(frozen=True)
class CorruptionSpec:
    """One corruption: Hendrycks' CIFAR constants per severity, its random-field drawer and its batched kernel."""

    name: str
    constants: Sequence[Any]
    apply: Kernel
    draw: Optional[Drawer] = None
    rounding: str = "floor"  # "floor" = np.uint8 truncation as in make_cifar_c.py; "round" = 8-bit codec output
    output_dtype: torch.dtype = torch.float64  # dtype of the reference's float result (float32 for zoom, elastic)

    def constant(self, severity: int) -> Any:
        """The constant of ``severity`` (1-based)."""
        return self.constants[severity - 1]


def snap_to_grid(x: torch.Tensor) -> torch.Tensor:
    """``x`` as float64 with values within 1e-4 levels of k/255 replaced by exactly ``k/255``.

    The reference reads uint8 images and computes ``k / 255.`` in float64; a float32 ``k/255`` is off by up to
    ~8e-6 levels, enough to move results that are exact integers in the reference (e.g. brightness adds
    0.2 = 51/255) across a truncation boundary. Values off the grid are left as they are.
    """
    x64 = x.to(torch.float64)
    levels = torch.round(x64 * 255.0)
    return torch.where((x64 * 255.0 - levels).abs() <= _GRID_SNAP_TOLERANCE, levels / 255.0, x64)


def quantise(y: torch.Tensor, rounding: str = "floor", dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Clip to [0, 1] and snap to the 8-bit grid k/255 (float64): floor (np.uint8 truncation) or round-to-nearest.

    ``dtype`` is the precision in which the reference holds its result and multiplies by 255 before the cast.
    """
    scaled = (y.clamp(0.0, 1.0).to(dtype) * 255.0).to(torch.float64)
    if rounding == "floor":
        levels = torch.floor(scaled)
    elif rounding == "round":
        levels = torch.round(scaled)
    else:
        raise ValueError(f"rounding must be 'floor' or 'round', got {rounding!r}")
    return levels / 255.0
