"""Mixing whole client models with the engine's kernel (``mixing.mix_state``), and the one rule for integer tensors.

Every weighted average of client models in ftta -- the engine's mix (``Strategy.mix``), FedICON's eq. 4 averaging of
its training phase, FedAcross+'s FedAvg merge of the adaptation module -- goes through ``mix_models``:

* floating-point tensors: ``theta_i <- sum_j W_ij theta_j`` by ``mix_state`` (one matmul per tensor, in W's dtype,
  cast back to the tensor's dtype; a broken client's NaN/Inf does not leak through a zero weight);
* integer (and boolean) tensors are **counters** (BatchNorm's ``num_batches_tracked``), not averaged: a mixed model
  takes the **largest** value among the clients it takes a nonzero weight from (``mix_counters``). A weighted mean
  of counts truncated to an integer would lose a batch to float rounding (0.3 * 10 + 0.7 * 10 = 9.999... -> 9).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Dict, Mapping, Optional, Sequence

import torch

from .mixing import mix_state, mix_state_rows

if TYPE_CHECKING:  # annotations only
    from .robust import RobustMixing


def mix_counters(counts: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Integer tensors [N, ...] mixed by W [N, N]: row i gets the element-wise maximum over the clients j with
    ``W_ij != 0`` (its own value if it takes from none)."""
    n = counts.shape[0]
    takes = (weights != 0).to(counts.device)  # [N, N]
    takes = takes | ~takes.any(1, keepdim=True) & torch.eye(n, dtype=torch.bool, device=counts.device)
    flat = counts.reshape(n, -1)
    out = torch.stack([flat[takes[i]].amax(0) for i in range(n)])
    return out.reshape(counts.shape).to(counts.dtype)


def mix_models(state: Mapping[str, torch.Tensor], weights: torch.Tensor,
               robust: Optional["RobustMixing"] = None) -> Dict[str, torch.Tensor]:
    """Every named tensor [N, ...] mixed by W [M, N] (M mixed models from N clients): floating-point tensors by
    ``mix_state`` (with ``robust``: by that robust statistic of each row, ``engine.robust``; W [N, N]), integer ones
    as counters (``mix_counters``). Keys keep their order."""
    floats = {k: v for k, v in state.items() if v.is_floating_point() or v.is_complex()}
    if robust is not None:
        if weights.shape[0] != weights.shape[1]:
            raise ValueError(f"robust mixing needs a square W [N, N], got {tuple(weights.shape)}")
        mixed = robust.mix(floats, weights)
    else:
        mixed = mix_state(floats, weights) if weights.shape[0] == weights.shape[1] else mix_state_rows(floats, weights)
    return {k: mixed[k] if k in mixed else _counters_rows(v, weights) for k, v in state.items()}


def _counters_rows(counts: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    m, n = weights.shape
    if m == n:
        return mix_counters(counts, weights)
    square = torch.eye(n, dtype=weights.dtype, device=weights.device)
    square[:m] = weights
    return mix_counters(counts, square)[:m]


def average_models(states: Sequence[Mapping[str, torch.Tensor]], weights: torch.Tensor | Sequence[float],
                   keys: Optional[Sequence[str]] = None) -> Dict[str, torch.Tensor]:
    """One model ``sum_i w_i state_i`` from per-client state dicts (``keys``: the names averaged, default all of
    the first client's) with weights ``w`` [N] (float64 unless given as a tensor), by ``mix_models``: integer buffers
    take the largest count among the clients with a nonzero weight."""
    if not states:
        raise ValueError("average_models needs at least one client state")
    w = weights if isinstance(weights, torch.Tensor) else torch.as_tensor(list(weights), dtype=torch.float64)
    if w.shape != (len(states),):
        raise ValueError(f"weights must be {len(states)} numbers (one per client), got shape {tuple(w.shape)}")
    names = list(states[0]) if keys is None else list(keys)
    stacked = {k: torch.stack([s[k].detach() for s in states]) for k in names}
    return {k: v[0] for k, v in mix_models(stacked, w.view(1, -1)).items()}
