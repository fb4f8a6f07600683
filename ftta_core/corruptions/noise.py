"""Noise corruptions (Gaussian, shot, impulse) with Hendrycks' CIFAR constants; random fields are drawn per image.

Every kernel takes its random field explicitly (``_<name>_with_field``), so a test can feed the same field to a
NumPy transcription of ``make_cifar_c.py``:

* gaussian_noise: a standard normal field z [3, H, W]; ``clip(x + sigma z)``.
* shot_noise: a uniform field u [3, H, W] mapped through the exact Poisson quantile function:
  ``k = min{k : P(Poisson(x c) <= k) >= u}`` is a Poisson(x c) draw, as ``np.random.poisson(x c)``; then
  ``clip(k / c)``. The rate uses the pixel's 8-bit level (the reference reads uint8 images), which lets the CDF be
  tabulated once per severity for the 256 levels and inverted exactly with a guide table on any device.
* impulse_noise: two uniform fields: a value is replaced when ``u1 < amount`` (skimage ``random_noise('s&p')``
  per-value Bernoulli) by salt (1) when ``u2 < 0.5`` else pepper (0).
"""
from __future__ import annotations

import math
from functools import lru_cache
from typing import Tuple

import torch

from ._spec import CorruptionSpec, Fields

GAUSSIAN_NOISE = (0.04, 0.06, 0.08, 0.09, 0.10)  # sigma
SHOT_NOISE = (500, 250, 100, 75, 50)  # Poisson rate per unit intensity
IMPULSE_NOISE = (0.01, 0.02, 0.03, 0.05, 0.07)  # fraction of values replaced
_SALT_VS_PEPPER = 0.5
_GUIDE_BUCKETS = 4096


def _draw_normal(gen: torch.Generator, _c: object, height: int, width: int) -> Fields:
    """A standard normal field [3, H, W] (float32 draws: float64 Box-Muller is 4x slower on CPU)."""
    return {"normal": torch.randn(3, height, width, generator=gen, dtype=torch.float32)}


def _draw_uniform(gen: torch.Generator, _c: object, height: int, width: int) -> Fields:
    """A U[0, 1) field [3, H, W]."""
    return {"uniform": torch.rand(3, height, width, generator=gen, dtype=torch.float64)}


def _draw_two_uniforms(gen: torch.Generator, _c: object, height: int, width: int) -> Fields:
    """Two U[0, 1) fields [3, H, W]: which values flip, and salt or pepper."""
    flip = torch.rand(3, height, width, generator=gen, dtype=torch.float64)
    salt = torch.rand(3, height, width, generator=gen, dtype=torch.float64)
    return {"flip_uniform": flip, "salt_uniform": salt}


def _gaussian_noise_with_field(x: torch.Tensor, sigma: float, normal: torch.Tensor) -> torch.Tensor:
    """``clip(x + sigma * normal)``."""
    return (x + sigma * normal.to(x)).clamp(0.0, 1.0)


@lru_cache(maxsize=None)
def _poisson_tables(rate: float) -> Tuple[torch.Tensor, torch.Tensor]:
    """CDF table P(Poisson(level/255 * rate) <= k) [256, K] (last column forced to 1) and its guide table [256, G].

    ``guide[l, m]`` is the smallest k with ``cdf[l, k] >= m / G``: a lower bound on the quantile of any u in
    [m/G, (m+1)/G), from which a short upward search finds the exact quantile (the classic guide-table method).
    """
    lam = torch.arange(256, dtype=torch.float64) / 255.0 * rate
    size = int(math.ceil(rate + 12.0 * math.sqrt(rate) + 20.0))
    k = torch.arange(size, dtype=torch.float64)
    cdf = torch.special.gammaincc(k[None, :] + 1.0, lam[:, None])
    cdf[0] = 1.0  # rate 0: always 0 counts
    cdf[:, -1] = 1.0
    buckets = torch.arange(_GUIDE_BUCKETS, dtype=torch.float64) / _GUIDE_BUCKETS
    guide = torch.searchsorted(cdf.contiguous(), buckets.expand(256, -1).contiguous())
    return cdf, guide


def poisson_quantile(uniform: torch.Tensor, levels: torch.Tensor, rate: float) -> torch.Tensor:
    """Smallest k with P(Poisson(levels/255 * rate) <= k) >= uniform (integer ``levels`` in 0..255), as float64."""
    cdf, guide = (t.to(uniform.device) for t in _poisson_tables(float(rate)))
    u = uniform.reshape(-1).to(torch.float64)
    row = levels.reshape(-1).long()
    bucket = (u * _GUIDE_BUCKETS).long().clamp(0, _GUIDE_BUCKETS - 1)
    k = guide.reshape(-1)[row * _GUIDE_BUCKETS + bucket]
    flat_cdf, row_start = cdf.reshape(-1), row * cdf.shape[1]
    pending = (flat_cdf[row_start + k] < u).nonzero().squeeze(1)
    while pending.numel():
        k[pending] += 1
        still = flat_cdf[row_start[pending] + k[pending]] < u[pending]
        pending = pending[still]
    return k.to(torch.float64).reshape(uniform.shape)


def _shot_noise_with_field(x: torch.Tensor, rate: float, uniform: torch.Tensor) -> torch.Tensor:
    """``clip(poisson_quantile(uniform, x*rate) / rate)`` with x taken at its 8-bit level."""
    levels = torch.round(x.clamp(0.0, 1.0) * 255.0)
    counts = poisson_quantile(uniform, levels, rate)
    return (counts / rate).to(x).clamp(0.0, 1.0)


def _impulse_noise_with_field(
    x: torch.Tensor, amount: float, flip_uniform: torch.Tensor, salt_uniform: torch.Tensor
) -> torch.Tensor:
    """Salt (1) where ``flip_uniform < amount`` and ``salt_uniform < 0.5``, pepper (0) where flipped otherwise."""
    flipped = flip_uniform < amount
    salted = salt_uniform < _SALT_VS_PEPPER
    out = torch.where(flipped & salted, torch.ones_like(x), x)
    return torch.where(flipped & ~salted, torch.zeros_like(x), out)


SPECS = (
    CorruptionSpec("gaussian_noise", GAUSSIAN_NOISE, _gaussian_noise_with_field, _draw_normal),
    CorruptionSpec("shot_noise", SHOT_NOISE, _shot_noise_with_field, _draw_uniform),
    CorruptionSpec("impulse_noise", IMPULSE_NOISE, _impulse_noise_with_field, _draw_two_uniforms),
)
