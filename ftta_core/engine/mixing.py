"""The mixing kernel and the server's checks of what clients upload."""
from __future__ import annotations

from typing import Dict, Mapping, Optional, Sequence, Tuple

import torch


def finite_rows(t: torch.Tensor) -> torch.Tensor:
    """Boolean [N]: rows of ``t`` [N, ...] whose every value is finite.

    Fast path: a row sum is finite only if every term is (NaN or +-Inf propagate), and a sum is ~20x cheaper than
    an element-wise ``isfinite``; rows whose sum is not finite (a bad value, or a finite overflow) are checked
    element by element, so the answer is exact.
    """
    rows = t.reshape(t.shape[0], -1)
    ok = rows.sum(1).isfinite() if rows.is_floating_point() else torch.ones(rows.shape[0], dtype=torch.bool)
    if not bool(ok.all()):
        suspect = torch.nonzero(~ok).flatten()
        ok[suspect] = torch.isfinite(rows[suspect]).all(1)
    return ok


def common_row(weights: torch.Tensor) -> Optional[torch.Tensor]:
    """W's row [1, N] when every row of W [N, N] is that same row with no zero in it (FedAvg's uniform W), else
    None: then every client's mixed tensor is one and the same weighted mean, and a non-finite value of any client
    reaches every row (nothing to shield with a zero weight)."""
    row = weights[:1]
    if bool((weights == row).all()) and bool((row != 0).all()):
        return row
    return None


def mix_state(state: Mapping[str, torch.Tensor], weights: torch.Tensor) -> Dict[str, torch.Tensor]:
    """``theta_i <- sum_j W_ij theta_j`` for every named tensor [N, ...] (one matmul per tensor).

    When all rows of W are the same row without zeros (``common_row``) the mean is computed once ([1, N] @ [N, M])
    and every client gets it as a broadcast view of it (the same values as W @ theta to float rounding, without N
    copies; read-only: clone it before writing into it)."""
    if not state:
        return {}
    n = weights.shape[0]
    row = common_row(weights)
    if row is not None:
        return {k: (row @ t.reshape(n, -1).to(weights.dtype)).to(t.dtype).expand(n, -1).view(t.shape)
                for k, t in state.items()}
    broken = torch.zeros(n, dtype=torch.bool, device=weights.device)
    for t in state.values():
        broken |= ~finite_rows(t).to(weights.device)
    takes_broken = (weights[:, broken] != 0).any(1) if bool(broken.any()) else None
    out = {}
    for k, t in state.items():
        flat = t.reshape(n, -1).to(weights.dtype)
        if takes_broken is None:
            mixed = weights @ flat
        else:
            # a rejected client's NaN/Inf must not leak through a zero weight (0 * NaN = NaN); rows that really
            # take from a broken client (its own row, kept as is) still get the honest non-finite result
            mixed = weights @ torch.where(broken[:, None], torch.zeros((), dtype=flat.dtype), flat)
            mixed[takes_broken] = weights[takes_broken] @ flat
        out[k] = mixed.reshape(t.shape).to(t.dtype)
    return out


def mix_state_rows(state: Mapping[str, torch.Tensor], weights: torch.Tensor) -> Dict[str, torch.Tensor]:
    """``mix_state`` for W [M, N] with M <= N rows (padded to [N, N] with identity rows, the first M kept)."""
    m, n = weights.shape
    if m == n:
        return mix_state(state, weights)
    square = torch.eye(n, dtype=weights.dtype, device=weights.device)
    square[:m] = weights
    return {k: v[:m] for k, v in mix_state(state, square).items()}


def finite_clients(tensors: Mapping[str, torch.Tensor], n_clients: int) -> torch.Tensor:
    """Boolean [N]: clients whose every uploaded value is finite."""
    ok = torch.ones(n_clients, dtype=torch.bool)
    for t in tensors.values():
        ok &= finite_rows(t.reshape(n_clients, -1)).cpu()
    return ok


def validate_uploads(uploads: Sequence[Mapping[str, torch.Tensor]], shapes: Mapping[str, Tuple[int, ...]]
                     ) -> Tuple[Dict[str, torch.Tensor], torch.Tensor, Dict[int, str]]:
    """Per-client form of ``uploads.validate_uploads`` (the one set of checks): check a list of per-client uploads
    against ``shapes`` and stack them (rejected clients get zeros).

    Returns the stacked tensors [N, ...], the boolean [N] of accepted clients and a reason per rejected client
    (missing key, shape, NaN/Inf, negative BN variance, magnitude: ``uploads.UploadPolicy``'s defaults).
    """
    from .uploads import UploadSchema, by_name, stack_uploads
    from .uploads import validate_uploads as check

    schema = UploadSchema({k: (tuple(shape), None) for k, shape in shapes.items()})
    tensors = {k: v for k, v in by_name(uploads).items() if k in shapes}
    tensors.update({k: [None] * len(uploads) for k in shapes if k not in tensors})
    valid, reasons = check(tensors, {}, n_clients=len(uploads), schema=schema)
    stacked = stack_uploads(tensors, valid, schema, rejected_rows="zeros")
    stacked.update({k: torch.zeros((len(uploads), *shape)) for k, shape in shapes.items() if k not in stacked})
    return stacked, valid, reasons


def restrict_to_valid(weights: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Drop rejected clients from W: no one mixes them in, they keep their own model; rows re-normalised."""
    if bool(valid.all()):
        return weights
    v = valid.to(weights.device)
    w = weights * v[None, :].to(weights.dtype)
    eye = torch.eye(len(v), dtype=weights.dtype, device=weights.device)
    sums = w.sum(1, keepdim=True)
    w = torch.where(sums > 0, w / sums.clamp_min(1e-30), eye)
    return torch.where(v[:, None], w, eye)
