"""The 15 CIFAR-10-C corruptions in Hendrycks' order, per-image seeding, and the public ``corrupt`` entry points."""
from __future__ import annotations

from typing import Dict, List, Sequence, Union

import numpy as np
import torch

from ..rng import derive_seed, torch_generator
from . import blur, digital, noise, weather
from ._spec import CorruptionSpec, Fields, quantise, snap_to_grid

_SPECS: Dict[str, CorruptionSpec] = {
    spec.name: spec for module in (noise, blur, weather, digital) for spec in module.SPECS
}
CORRUPTIONS: tuple[str, ...] = (
    "gaussian_noise",
    "shot_noise",
    "impulse_noise",
    "defocus_blur",
    "glass_blur",
    "motion_blur",
    "zoom_blur",
    "snow",
    "frost",
    "fog",
    "brightness",
    "contrast",
    "elastic_transform",
    "pixelate",
    "jpeg_compression",
)
SEVERITIES: tuple[int, ...] = (1, 2, 3, 4, 5)
MIN_SIZE = 16
SEED_PURPOSE = "corruption"

Seed = Union[int, Sequence[int], torch.Tensor]


def get_spec(name: str) -> CorruptionSpec:
    """The spec of corruption ``name``; ValueError listing the valid names otherwise."""
    if name not in _SPECS:
        raise ValueError(f"unknown corruption {name!r}; valid names: {', '.join(CORRUPTIONS)}")
    return _SPECS[name]


def check_severity(severity: int) -> int:
    """``severity`` as an int in SEVERITIES; ValueError listing the valid ones otherwise."""
    if isinstance(severity, bool) or not isinstance(severity, (int, np.integer)) or int(severity) not in SEVERITIES:
        raise ValueError(f"severity must be one of {SEVERITIES}, got {severity!r}")
    return int(severity)


def image_seeds(seed: Seed, batch: int) -> List[int]:
    """Per-image seeds: ``derive_seed(seed, i)`` for an int ``seed``, else the ``batch`` given seeds."""
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
        return [derive_seed(int(seed), i) for i in range(batch)]
    values = seed.detach().cpu().reshape(-1).tolist() if isinstance(seed, torch.Tensor) else list(seed)
    if len(values) != batch:
        raise ValueError(f"got {len(values)} per-image seeds for a batch of {batch} images")
    if not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in values):
        raise TypeError("per-image seeds must be integers")
    return [int(v) for v in values]


def image_generator(seed: int, name: str, severity: int) -> torch.Generator:
    """The CPU generator of one image for one (corruption, severity)."""
    return torch_generator(seed, SEED_PURPOSE, name, severity)


def draw_fields(spec: CorruptionSpec, severity: int, seeds: Sequence[int], height: int, width: int) -> Fields:
    """Every image's random fields drawn on CPU from its own generator, stacked along a new batch dim."""
    if spec.draw is None:
        return {}
    constant = spec.constant(severity)
    per_image = [spec.draw(image_generator(s, spec.name, severity), constant, height, width) for s in seeds]
    return {key: torch.stack([fields[key] for fields in per_image]) for key in per_image[0]}


def _check_images(images: torch.Tensor) -> None:
    """Raise unless ``images`` is a float tensor [B, 3, H, W] with H, W >= MIN_SIZE."""
    if not isinstance(images, torch.Tensor):
        raise TypeError(f"images must be a torch.Tensor, got {type(images).__name__} (use corrupt_uint8 for arrays)")
    if not images.is_floating_point():
        raise TypeError(f"images must be float in [0, 1], got {images.dtype} (use corrupt_uint8 for uint8 arrays)")
    if images.ndim != 4 or images.shape[1] != 3:
        raise ValueError(f"images must be [B, 3, H, W], got shape {tuple(images.shape)}")
    if min(images.shape[-2:]) < MIN_SIZE:
        raise ValueError(f"images must be at least {MIN_SIZE}x{MIN_SIZE}, got {tuple(images.shape[-2:])}")


def corrupt(images: torch.Tensor, name: str, severity: int, seed: Seed) -> torch.Tensor:
    """Corrupt float images [B, 3, H, W] in [0, 1] (CPU or CUDA); returns same shape/dtype/device on the k/255 grid."""
    spec = get_spec(name)
    severity = check_severity(severity)
    _check_images(images)
    batch, _, height, width = images.shape
    seeds = image_seeds(seed, batch)
    if batch == 0:
        return images.clone()
    fields = {k: v.to(images.device) for k, v in draw_fields(spec, severity, seeds, height, width).items()}
    # float64 on the exact 8-bit grid, like the reference's NumPy arithmetic, so truncation falls on the same side
    out = spec.apply(snap_to_grid(images), spec.constant(severity), **fields)
    return quantise(out, spec.rounding, spec.output_dtype).to(images.dtype)


def corrupt_uint8(images_uint8_nhwc: np.ndarray, name: str, severity: int, seed: Seed) -> np.ndarray:
    """Corrupt uint8 images [N, H, W, 3] (or one [H, W, 3]) into uint8 of the same shape, like make_cifar_c.py."""
    array = np.asarray(images_uint8_nhwc)
    if array.dtype != np.uint8:
        raise TypeError(f"expected uint8 images, got {array.dtype}")
    single = array.ndim == 3
    batch = array[None] if single else array
    x = torch.from_numpy(np.array(batch)).permute(0, 3, 1, 2).to(torch.float32) / 255.0
    y = corrupt(x, name, severity, seed)
    out = torch.round(y * 255.0).to(torch.uint8).permute(0, 2, 3, 1).numpy()
    return out[0] if single else out
