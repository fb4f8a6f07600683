"""Robust mixing: a robust per-row statistic in place of the weighted mean ``theta_i <- sum_j W_ij theta_j``.

W is unchanged (the strategy computes it, the record stores it); only how row i combines the clients' values
changes, with row i of W as the weights. Modes (``RobustMixing``; the config's ``robust_mixing`` field):

* ``median`` -- per row and per coordinate, the **weighted median** of the clients' values (Yin et al. 2018's
  coordinate-wise median, weighted by the row): sort the values, accumulate their weights; the median is the
  midpoint of the lower weighted median (the first value at which the cumulative weight reaches half the row's
  weight) and the upper one (the first value at which it exceeds half). With equal weights that is the usual
  median (the mean of the two middle values for an even count); a zero weight never selects a value.
* ``trimmed:BETA`` -- the **weighted trimmed mean**: per coordinate, the weight ``BETA`` (a fraction of the row's
  weight, 0 <= BETA < 0.5) is cut from each end of the sorted values (a client straddling a cut keeps the part of
  its weight inside), and the rest is averaged with its weights. BETA = 0 is the weighted mean.
* ``clip:C`` -- **norm clipping** (Sun et al. 2019, "Can you really backdoor federated learning?"): per named entry,
  each client's deviation from the source model's value of the entry (the server knows the source model; entries
  without a namesake there: from the coordinate-wise median of the clients) is scaled down to at most ``C`` times
  the median deviation norm (the lower median over the clients whose value another client takes), then rows are
  the weighted means of the clipped values, except that each client's own term ``W_ii theta_i`` stays unclipped
  (clipping guards what others receive; a client's own model is its own).

A row whose weights sum to s != 1 (an unnormalised strategy, L-DAWA's ``normalize=False``) gets s times the robust
statistic of the normalised row, as the weighted sum is s times the weighted mean. Computed in float64, cast back
to each tensor's dtype. Floating-point tensors only: integer tensors are counters (``average.mix_counters``).
Rows of W that are equal are computed once (FedAvg's W: one row for all clients, returned as a broadcast view).
A non-finite value (a rejected client's) reaches a row only through a nonzero weight, as in ``mixing.mix_state``.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Dict, Mapping, Optional, Tuple

import torch

from .mixing import mix_state, mix_state_rows
from .uploads import namesake

ROBUST_MODES = ("off", "median", "trimmed", "clip")
DEFAULT_TRIM = 0.1  # trimmed mean: weight cut per side (the largest attacker fraction of the benchmark, 2 of 20)
DEFAULT_CLIP = 2.0  # norm clipping: multiple of the median deviation norm
TIE_TOL = 1e-9      # relative tolerance of "the cumulative weight reaches half the row's weight" (float64 sums)
SPEC_HELP = ("'off', 'median', 'trimmed[:BETA]' (0 <= BETA < 0.5, default 0.1) or 'clip[:C]' (C > 0, "
             "default 2)")

StateDict = Dict[str, torch.Tensor]


@dataclass(frozen=True)
class RobustMixing:
    """A robust mixing mode (``median``, ``trimmed`` with ``trim``, ``clip`` with ``clip``) and, for ``clip``, the
    source model's values by name (``uploads.reference_values``): the centre deviations are measured from."""

    mode: str
    trim: float = DEFAULT_TRIM
    clip: float = DEFAULT_CLIP
    reference: Optional[Mapping[str, torch.Tensor]] = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.mode not in ROBUST_MODES[1:]:
            raise ValueError(f"robust mixing mode must be one of {ROBUST_MODES[1:]}, got {self.mode!r}")
        if not (math.isfinite(self.trim) and 0.0 <= self.trim < 0.5):
            raise ValueError(f"trimmed mean: the weight cut per side must be in [0, 0.5), got {self.trim!r}")
        if not (math.isfinite(self.clip) and self.clip > 0):
            raise ValueError(f"norm clipping: the multiple of the median norm must be > 0, got {self.clip!r}")

    @property
    def spec(self) -> str:
        """The mode as the config writes it ('median', 'trimmed:0.1', 'clip:2')."""
        return {"median": "median", "trimmed": f"trimmed:{_short(self.trim)}",
                "clip": f"clip:{_short(self.clip)}"}[self.mode]

    def mix(self, state: Mapping[str, torch.Tensor], weights: torch.Tensor) -> StateDict:
        """Every floating-point tensor [N, ...] mixed by W [N, N] with this mode (the module docstring)."""
        if not state:
            return {}
        if self.mode == "clip":
            return _clip_mix(state, weights, self.reference, self.clip)
        return {k: _rows(t, weights, self.mode, self.trim) for k, t in state.items()}

    def mean(self, state: Mapping[str, torch.Tensor], row: torch.Tensor) -> StateDict:
        """One model [1, ...] per floating-point tensor [N, ...] from the weights ``row`` [N] (a server's global
        model: FedAvgM, L-DAWA): the robust statistic of the clients' values (``clip``: the weighted mean of the
        clipped values, nobody's own term kept)."""
        w = row.reshape(1, -1)
        if self.mode == "clip":
            takes = (w != 0).flatten().cpu()
            clipped, _ = _clipped(state, takes, self.reference, self.clip)
            return mix_state_rows(clipped, w)
        return {k: _rows(t, w, self.mode, self.trim) for k, t in state.items()}


def _short(x: float) -> str:
    """``x`` written as short as it reads back exactly ('2', '0.1', '0.123456789')."""
    text = f"{x:g}"
    return text if float(text) == x else repr(float(x))


def parse_robust_mixing(spec: str, reference: Optional[Mapping[str, torch.Tensor]] = None
                        ) -> Optional[RobustMixing]:
    """``RobustMixing`` of a spec (``SPEC_HELP``); None for 'off'. An invalid spec raises ``ValueError`` saying
    what is valid."""
    if not isinstance(spec, str):
        raise ValueError(f"must be {SPEC_HELP}, got {spec!r}")
    m = re.fullmatch(r"\s*(off|median|trimmed|clip)\s*(?::\s*([^\s:]+)\s*)?", spec)
    if m is None or (m.group(2) is not None and m.group(1) in ("off", "median")):
        raise ValueError(f"must be {SPEC_HELP}, got {spec!r}")
    mode, arg = m.group(1), m.group(2)
    if mode == "off":
        return None
    try:
        value = float(arg) if arg is not None else None
    except ValueError:
        raise ValueError(f"must be {SPEC_HELP}, got {spec!r} ({arg!r} is not a number)") from None
    try:
        if mode == "trimmed":
            return RobustMixing("trimmed", trim=DEFAULT_TRIM if value is None else value, reference=reference)
        if mode == "clip":
            return RobustMixing("clip", clip=DEFAULT_CLIP if value is None else value, reference=reference)
        return RobustMixing("median", reference=reference)
    except ValueError as err:
        raise ValueError(f"must be {SPEC_HELP}, got {spec!r} ({err})") from None


# ---------------------------------------------------------------------------------------------------------------
# the per-row statistics

def _half_positions(w: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For weights ``w`` [..., N] in sorted order: their cumulative sums, and the positions [..., 1] of the lower
    (cumulative weight reaches half the total) and upper (exceeds half) weighted medians."""
    cum = w.cumsum(-1)
    total = cum[..., -1:]
    half, tol = total / 2, TIE_TOL * total
    lo = (cum >= half - tol).to(torch.int8).argmax(-1, keepdim=True)
    hi = (cum > half + tol).to(torch.int8).argmax(-1, keepdim=True)
    return cum, lo, hi


def _row_statistic(values: torch.Tensor, w: torch.Tensor, mode: str, trim: float) -> torch.Tensor:
    """``mode``'s statistic of ``values`` [N, M] with weights ``w`` [N] (float64, CPU), times sum(w): float64 [M].

    Clients with weight 0 are left out first. When the others' weights are all equal (FedAvg's W with equal batch
    sizes) the statistic only depends on ranks: the values are sorted once and combined at positions (and with
    kept weights) computed once for all columns; otherwise each column gets its own cumulative weights."""
    total = w.sum()
    if not bool(total > 0):
        return torch.zeros(values.shape[1], dtype=torch.float64, device=values.device)
    keep = torch.nonzero(w > 0).flatten()
    w = w[keep]
    rows = values.index_select(0, keep.to(values.device))
    if bool((w == w[0]).all()):  # ranks decide: sort once, positions and kept weights shared by every column
        v = rows.T.contiguous().sort(1).values  # [M, k] (a sort is exact in any dtype)
        cum, lo, hi = _half_positions(w)
        if mode == "median":
            return (v[:, int(lo)].double() + v[:, int(hi)].double()) / 2 * total
        kept = (torch.minimum(cum, (1 - trim) * total) - torch.maximum(cum - w, trim * total)).clamp_min(0)
        nz = torch.nonzero(kept > 0).flatten()
        return v[:, nz.to(v.device)].double() @ kept[nz].to(v.device) / (1 - 2 * trim)
    v, order = rows.double().sort(0)
    ws = w.to(v.device)[order]  # [k, M]: the weights in each column's sorted order
    if mode == "median":
        _, lo, hi = _half_positions(ws.T)
        return ((v.gather(0, lo.T) + v.gather(0, hi.T)) / 2 * total).squeeze(0)
    cum = ws.cumsum(0)
    kept = (torch.minimum(cum, (1 - trim) * total) - torch.maximum(cum - ws, trim * total)).clamp_min(0)
    terms = torch.where(kept > 0, kept * v, torch.zeros((), dtype=v.dtype, device=v.device))
    return terms.sum(0) / (1 - 2 * trim)


def weighted_median(values: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Per row r of ``weights`` [R, N] and column m of ``values`` [N, M]: the weighted median of ``values[:, m]``
    with weights ``weights[r]`` (the module docstring), times the row's weight sum; float64 [R, M]."""
    return torch.stack([_row_statistic(values, w, "median", 0.0) for w in weights.double().cpu()])


def weighted_trimmed_mean(values: torch.Tensor, weights: torch.Tensor, trim: float) -> torch.Tensor:
    """Per row r of ``weights`` [R, N] and column m of ``values`` [N, M]: the mean of ``values[:, m]`` weighted by
    ``weights[r]`` after cutting the weight ``trim`` x the row's sum from each end of the sorted values, times the
    row's weight sum; float64 [R, M]."""
    return torch.stack([_row_statistic(values, w, "trimmed", trim) for w in weights.double().cpu()])


def _rows(t: torch.Tensor, weights: torch.Tensor, mode: str, trim: float) -> torch.Tensor:
    """``t`` [N, ...] combined by each row of ``weights`` [R, N] with ``mode`` -> [R, ...] in ``t``'s dtype; equal
    rows are computed once (one row for all: a broadcast view)."""
    n = t.shape[0]
    flat = t.reshape(n, -1)
    unique, inverse = torch.unique(weights.detach().double().cpu(), dim=0, return_inverse=True)
    stat = torch.stack([_row_statistic(flat, w, mode, trim) for w in unique]).to(t.dtype)
    r = weights.shape[0]
    mixed = stat.expand(r, -1) if len(unique) == 1 else stat[inverse.to(stat.device)]
    return mixed.reshape(r, *t.shape[1:])


# ---------------------------------------------------------------------------------------------------------------
# norm clipping

def _clipped(state: Mapping[str, torch.Tensor], takes: torch.Tensor, reference: Optional[Mapping[str, torch.Tensor]],
             multiple: float) -> Tuple[StateDict, Dict[str, torch.Tensor]]:
    """Each tensor [N, ...] with every client's deviation from the centre clipped to ``multiple`` x the lower median
    deviation norm over the clients in ``takes`` [N] (those with finite norms); and, per name, which clients were
    clipped [N]. Clients whose deviation is within the bound, or not finite, keep their values exactly (the same
    tensor when nobody is clipped); clipped rows are computed in float64."""
    out: StateDict = {}
    clipped: Dict[str, torch.Tensor] = {}
    for k, t in state.items():
        n = t.shape[0]
        flat = t.reshape(n, -1)
        ref = namesake(reference, k, tuple(t.shape[1:]))
        sel = takes.to(flat.device)
        if ref is not None:
            centre = ref.reshape(1, -1).to(flat.device, flat.dtype)
        elif bool(sel.any()):
            centre = flat[sel].nan_to_num(nan=0.0).median(0, keepdim=True).values
        else:
            centre = flat.new_zeros(1, flat.shape[1])
        norms = torch.linalg.vector_norm(flat - centre, dim=1).double()
        counted = sel & norms.isfinite()
        over = torch.zeros(n, dtype=torch.bool, device=flat.device)
        if bool(counted.any()):
            bound = multiple * norms[counted].median()
            over = norms.isfinite() & (norms > bound)
        clipped[k] = over
        if not bool(over.any()):
            out[k] = t
            continue
        rows = torch.nonzero(over).flatten()
        c64 = centre.double()
        dev = flat.index_select(0, rows).double() - c64
        new = flat.clone()
        new[rows] = (c64 + dev * (bound / norms[rows])[:, None]).to(flat.dtype)
        out[k] = new.reshape(t.shape)
    return out, clipped


def _clip_mix(state: Mapping[str, torch.Tensor], weights: torch.Tensor,
              reference: Optional[Mapping[str, torch.Tensor]], multiple: float) -> StateDict:
    """Norm-clipped mixing by W [N, N]: ``sum_j W_ij clip(theta_j) + W_ii (theta_i - clip(theta_i))``."""
    n = weights.shape[0]
    others = (weights != 0) & ~torch.eye(n, dtype=torch.bool, device=weights.device)
    takes = others.any(0)  # clients someone else takes from
    if not bool(takes.any()):  # nobody mixes anybody in (Local): nothing to guard
        return mix_state(state, weights)
    clipped, which = _clipped(state, takes.cpu(), reference, multiple)
    mixed = mix_state(clipped, weights)
    diag = weights.diagonal().double().cpu()
    out = {}
    for k, t in state.items():
        fix = torch.nonzero(which[k].cpu() & (diag != 0)).flatten()
        if not len(fix):
            out[k] = mixed[k]
            continue
        flat, got = t.reshape(n, -1), mixed[k].reshape(n, -1).clone()
        rows = fix.to(flat.device)
        own = diag[fix].to(flat.device)[:, None] * (flat.index_select(0, rows).double()
                                                    - clipped[k].reshape(n, -1).index_select(0, rows).double())
        got[rows] = (got.index_select(0, rows).double() + own).to(got.dtype)
        out[k] = got.reshape(t.shape)
    return out
