"""FedTSA's temporal-spatial attention block (TS-Block) and its heterogeneity-aware augmentation masks.

Shapes: a memory window X [T, N, D] (T steps, oldest first; N clients; D indicator features). Temporal attention is
computed per client over its T steps ([N, T, T]), spatial attention per step over the N clients ([T, N, N]).
Masks are boolean: True = the entry takes part in the attention. A block of R rounds (``TSBlock(rounds=R)``) trains
R independent blocks at once on windows [R, T, N, D]; every shape above then gains a leading R.

Where we differ from the paper (see also ``strategies/fedtsa.py``):

- ``TSBlock.forward`` applies an [N, N] spatial mask to the spatial attention of every step of the window (FedTSA
  passes the one mask it samples from the current step); Eq. 17 writes a mask M^spa_t per step t. The authors' code
  broadcasts its [N, N] mask over T the same way.
- ``sample_spatial_mask(augmentation='count')`` adds ``int(non_edges * edge_add)`` non-edges (default
  ``edge_add = 0.2``). The authors' ``aug_spatiol`` uses ``add_percent = 1 - 0.8`` = 0.19999999999999996, which adds
  one fewer whenever the number of non-edges is a multiple of 5 (10 non-edges: 1, not 2); not reproduced here.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional, Protocol, Tuple

import torch
import torch.nn.functional as F
from torch import nn

MASK_MODES = ("exclude", "hadamard")
TEMPORAL_HEADS = ("temporal_query", "temporal_key")
SPATIAL_HEADS = ("spatial_query", "spatial_key")
AUGMENTATIONS = ("bernoulli", "count")


@dataclass
class TSBlockOutput:
    """What one pass of the TS-Block produced (attention matrices are row-stochastic over the last dimension)."""

    output: torch.Tensor  # X_TSA [T, N, D]
    temporal_output: torch.Tensor  # X_TA [T, N, D]
    temporal_scores: Optional[torch.Tensor]  # A^(T) before softmax [N, T, T] (None without temporal module)
    temporal_attention: Optional[torch.Tensor]  # softmax(A^(T) (masked)) [N, T, T]
    spatial_attention: torch.Tensor  # softmax(A^(S) (masked)) [T, N, N]
    projections: Optional["TSProjections"] = None  # the Q/K projections of X this pass used


def masked_softmax(scores: torch.Tensor, mask: Optional[torch.Tensor], mode: str = "exclude") -> torch.Tensor:
    """Softmax over the last dim; ``mask`` (bool, broadcastable) removes entries ('exclude': score -> -inf, as the
    FedTSA code does) or multiplies the scores by 0/1 before the softmax ('hadamard': Eqs. 16-17 read literally)."""
    if mask is None:
        return torch.softmax(scores, dim=-1)
    if mode == "exclude":
        return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    if mode == "hadamard":
        return torch.softmax(scores * mask.to(scores.dtype), dim=-1)
    raise ValueError(f"mask_mode must be one of {MASK_MODES}, got {mode!r}")


def masked_softmax_backward(attention: torch.Tensor, grad: torch.Tensor, mask: Optional[torch.Tensor],
                            mode: str = "exclude") -> torch.Tensor:
    """dL/d(scores) of ``attention = masked_softmax(scores, mask, mode)`` from dL/d(attention). 'exclude': masked
    entries have attention 0, so their gradient is 0 (as through ``masked_fill``); 'hadamard': times the mask."""
    out = attention * (grad - (attention * grad).sum(-1, keepdim=True))
    if mask is not None and mode == "hadamard":
        out = out * mask.to(out.dtype)
    return out


@dataclass
class TSProjections:
    """Every learnable projection of a window X, computed in one matmul (see ``TSBlock.project``).

    Client-major layout [N, T, D]: ``temporal_query``/``temporal_key`` (None without temporal module) are Q/K of
    Eq. 10; ``spatial`` [N, T, 2D] holds the spatial Q and K projections of X itself. Since a temporal attention
    row sums to one, Linear(a^(T) X) = a^(T) Linear(X) (bias included), so every pass over the same X (plain and
    augmented) gets the spatial Q/K of its X_TA by mixing these rows instead of projecting X_TA again.
    """

    values: torch.Tensor  # X in client-major layout [N, T, D]
    temporal_query: Optional[torch.Tensor]
    temporal_key: Optional[torch.Tensor]
    spatial: torch.Tensor


class Augmentation(Protocol):
    """Samples the augmented pass's masks from the first pass's attention (``TSBlock.forward_passes``)."""

    def temporal(self, attention: torch.Tensor) -> Optional[torch.Tensor]:
        """M^tem [N, T, T] from the first pass's a^(T) [N, T, T] (called first, with the temporal module only)."""

    def spatial(self, attention: torch.Tensor, temporal_output: torch.Tensor) -> torch.Tensor:
        """M^spa [N, N] from the first pass's a^(S) [T, N, N] and X_TA [T, N, D]."""


@dataclass
class TSPasses:
    """k = 1 or 2 passes of the block over one X (the pass under the given masks, then the augmented one), stacked
    along the step axis: each tensor holds pass 0's T steps, then pass 1's. What ``TSBlock.backward_passes`` needs.
    Without the temporal module X_TA = X and the spatial scores are the same for both passes (not stacked)."""

    projections: TSProjections
    temporal_scores: Optional[torch.Tensor]  # A^(T) [N, T, T] (shared by the passes; None without temporal module)
    temporal_attention: Optional[torch.Tensor]  # [N, kT, T]
    temporal_output: torch.Tensor  # X_TA client-major [N, kT, D] ([N, T, D] = X without the temporal module)
    mixed_spatial: torch.Tensor  # the spatial Q|K of X_TA [N, kT, 2D] ([N, T, 2D] without the temporal module)
    spatial_attention: torch.Tensor  # [kT, N, N]
    output: torch.Tensor  # X_TSA [kT, N, D]
    temporal_masks: Tuple[Optional[torch.Tensor], ...]  # per pass
    spatial_masks: Tuple[Optional[torch.Tensor], ...]  # per pass, broadcastable to [T, N, N]
    mask_mode: str = "exclude"

    @property
    def passes(self) -> int:
        return len(self.spatial_masks)

    def steps(self, i: int) -> slice:
        """Pass ``i``'s rows along the stacked step axis."""
        t = self.spatial_attention.shape[-3] // self.passes
        return slice(i * t, (i + 1) * t)

    def pass_output(self, i: int) -> TSBlockOutput:
        """Pass ``i`` alone (views)."""
        rows = self.steps(i)
        stacked = self.temporal_attention is not None
        x_ta = (self.temporal_output[..., rows, :] if stacked else self.temporal_output).transpose(-3, -2)
        att_t = self.temporal_attention[..., rows, :] if stacked else None
        return TSBlockOutput(self.output[..., rows, :, :], x_ta, self.temporal_scores, att_t,
                             self.spatial_attention[..., rows, :, :], self.projections)


class TSBlock(nn.Module):
    """Temporal self-attention per client (Eqs. 9-11), then spatial self-attention per step (Eqs. 12-14).

    Q and K are learnable ``Linear(D, D)`` maps initialised to the identity; V is the identity and stays fixed (the
    code's frozen ``fc_v``/``geo_v``), so values are the inputs themselves. ``temporal=False`` drops the temporal
    module (ablation 'w/o time': X_TA = X). ``bias`` adds learnable Q/K biases (the code has them, the paper not).

    Storage and cost: the Q/K weights are one parameter ``qk_weight`` [H*D, D] (H = 4 heads, in the order temporal
    Q, temporal K, spatial Q, spatial K; H = 2 without the temporal module), so the block projects X with one matmul
    and no per-pass concatenation, and its optimiser updates one tensor (Adam is element-wise: the same update as
    four separate weights). ``head_weight(name)`` gives one head's [D, D] view. All projections are linear in X and
    the attention mixes rows with weights summing to one, so the block projects X once and mixes projected rows
    after that (``TSProjections``): the same function as projecting X_TA (equal up to float reassociation), with a
    third of the matmul work for a plain plus an augmented pass, forward and backward.

    Training (FedTSA's server round): ``forward_passes`` computes the plain and the augmented pass together (their
    rows stacked, one product of each kind for both), and ``backward_passes`` sets the weights' gradient derived by
    hand, with no autograd graph (tests/test_oracle_ts_block.py checks both against the autograd round they
    replaced, in float64). ``forward`` is one pass and stays differentiable.

    Rounds at once: ``rounds=R`` holds R independent blocks (``qk_weight`` [R, H*D, D], ``qk_bias`` [R, H*D]) that
    map windows [R, T, N, D]; trained on the sum of their losses with Adam (element-wise), each block takes the
    steps it would take alone. A pass then launches as many kernels for R rounds as for one, which is what a GPU
    needs (there a round is launch-bound).
    """

    def __init__(self, dim: int, temporal: bool = True, bias: bool = False, rounds: Optional[int] = None) -> None:
        super().__init__()
        if rounds is not None and rounds < 1:
            raise ValueError(f"rounds must be >= 1 or None, got {rounds}")
        self.dim, self.temporal, self.rounds = dim, temporal, rounds
        self.heads = (TEMPORAL_HEADS if temporal else ()) + SPATIAL_HEADS
        lead = () if rounds is None else (rounds,)
        self.qk_weight = nn.Parameter(self._identity().expand(*lead, -1, -1).clone())
        self.qk_bias = nn.Parameter(torch.zeros(*lead, len(self.heads) * dim)) if bias else None

    def _identity(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """The identity initialisation of one block's Q/K weights [H*D, D]."""
        return torch.eye(self.dim, device=device).repeat(len(self.heads), 1)

    def reset_parameters(self) -> None:
        """Back to the identity initialisation, in place (the module and its parameter objects stay the same)."""
        with torch.no_grad():
            self.qk_weight.copy_(self._identity(self.qk_weight.device).expand_as(self.qk_weight))
            if self.qk_bias is not None:
                self.qk_bias.zero_()

    def head_weight(self, name: str) -> torch.Tensor:
        """The [D, D] weight of one Q/K head (one of ``self.heads``: 'temporal_query', ..., 'spatial_key'), a view
        ([R, D, D] in a block of R rounds)."""
        if name not in self.heads:
            raise KeyError(f"unknown head {name!r}; this block has {self.heads}")
        i = self.heads.index(name)
        return self.qk_weight[..., i * self.dim:(i + 1) * self.dim, :]

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:  # type: ignore[override]
        """Also load blocks saved with one ``Linear`` per head (``spatial_query.weight``, ...; before the fusion)."""
        if prefix + "qk_weight" not in state_dict and prefix + f"{self.heads[0]}.weight" in state_dict:
            state_dict[prefix + "qk_weight"] = torch.cat([state_dict.pop(prefix + f"{h}.weight") for h in self.heads])
            if prefix + f"{self.heads[0]}.bias" in state_dict:
                state_dict[prefix + "qk_bias"] = torch.cat([state_dict.pop(prefix + f"{h}.bias") for h in self.heads])
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def project(self, x: torch.Tensor) -> TSProjections:
        """All Q/K projections of X [T, N, D] in one matmul, client-major."""
        values = x.transpose(-3, -2).contiguous()  # [N, T, D]
        if self.rounds is None:
            proj = F.linear(values, self.qk_weight, self.qk_bias)
        else:  # one bmm: [R, N*T, D] @ [R, D, H*D] (a broadcast matmul would copy each weight N times)
            r, n, t, d = values.shape
            rows, weight = values.view(r, n * t, d), self.qk_weight.transpose(-1, -2)
            proj = (torch.bmm(rows, weight) if self.qk_bias is None
                    else torch.baddbmm(self.qk_bias.unsqueeze(-2), rows, weight)).view(r, n, t, -1)
        if self.temporal:  # split (not slicing): its backward is one concatenation, not zero-filled copies
            query, key, spatial = proj.split([self.dim, self.dim, 2 * self.dim], dim=-1)
            return TSProjections(values, query, key, spatial)
        return TSProjections(values, None, None, proj)

    def temporal_scores(self, x: torch.Tensor, projections: Optional[TSProjections] = None) -> torch.Tensor:
        """A^(T)_i = Q_i K_i^T / sqrt(D) for every client i (Eq. 10): [T, N, D] -> [N, T, T]."""
        p = self.project(x) if projections is None else projections
        return p.temporal_query @ p.temporal_key.transpose(-1, -2) / math.sqrt(self.dim)

    def forward(self, x: torch.Tensor, temporal_mask: Optional[torch.Tensor] = None,
                spatial_mask: Optional[torch.Tensor] = None, mask_mode: str = "exclude",
                temporal_scores: Optional[torch.Tensor] = None,
                projections: Optional[TSProjections] = None) -> TSBlockOutput:
        """X [T, N, D] -> X_TSA; masks [N, T, T] and [N, N] (or [T, N, N]) give the augmented pass (Eqs. 16-17).

        ``temporal_scores`` and ``projections`` let a second (masked) pass reuse the first pass's A^(T) and
        projections (``TSBlockOutput.projections``): both see the same X.
        """
        return self.forward_passes(x, temporal_mask, spatial_mask, mask_mode, None, temporal_scores,
                                   projections).pass_output(0)

    def forward_passes(self, x: torch.Tensor, temporal_mask: Optional[torch.Tensor] = None,
                       spatial_mask: Optional[torch.Tensor] = None, mask_mode: str = "exclude",
                       augment: Optional[Augmentation] = None, temporal_scores: Optional[torch.Tensor] = None,
                       projections: Optional[TSProjections] = None) -> TSPasses:
        """The pass of ``forward`` and, with ``augment``, the augmented pass under the masks it samples from that
        pass's attention, computed together: both passes' temporal mixing, spatial scores and outputs are one
        batched product each (rows stacked along the step axis), on one projection of X and one A^(T)."""
        lead = () if self.rounds is None else (self.rounds,)
        if x.dim() != 3 + len(lead) or x.shape[:-3] != lead or x.shape[-1] != self.dim:
            raise ValueError(f"TS-Block expects X [{''.join(f'{r}, ' for r in lead)}T, N, {self.dim}], "
                             f"got {tuple(x.shape)}")
        p = self.project(x) if projections is None else projections
        t, root = x.shape[-3], math.sqrt(self.dim)
        temporal_masks: List[Optional[torch.Tensor]] = [temporal_mask]
        scores_t, att_t, x_ta, mixed = None, None, p.values, p.spatial  # [N, T, D], [N, T, 2D]
        if self.temporal:
            scores_t = self.temporal_scores(x, p) if temporal_scores is None else temporal_scores
            att_t = masked_softmax(scores_t, temporal_mask, mask_mode)  # [N, T, T]
            if augment is not None:
                temporal_masks.append(augment.temporal(att_t))
                att_t = torch.cat([att_t, masked_softmax(scores_t, temporal_masks[-1], mask_mode)], dim=-2)
            x_ta = att_t @ p.values  # Eq. 11 / 16: [N, kT, D]
            mixed = att_t @ p.spatial  # the spatial Q|K of X_TA (Linear(a X) = a Linear(X))
        elif augment is not None:
            temporal_masks.append(None)
        sq, sk = mixed.transpose(-3, -2).split(self.dim, dim=-1)  # [kT, N, D] each
        scores_s = sq @ sk.transpose(-1, -2) / root  # [kT, N, N]
        spatial_masks = [_per_step(spatial_mask, x)]
        att_s = masked_softmax(scores_s[..., :t, :, :], spatial_masks[0], mask_mode)  # [T, N, N]
        if augment is not None:
            spatial_masks.append(_per_step(augment.spatial(att_s, x_ta[..., :t, :].transpose(-3, -2)), x))
            att_s = torch.cat([att_s, masked_softmax(scores_s[..., -t:, :, :], spatial_masks[-1], mask_mode)], dim=-3)
        if self.temporal or augment is None:
            output = att_s @ x_ta.transpose(-3, -2)  # Eq. 14 / 17: [kT, N, D]
        else:  # X_TA = X for both passes
            output = (att_s.unflatten(-3, (2, t)) @ x_ta.transpose(-3, -2).unsqueeze(-4)).flatten(-4, -3)
        return TSPasses(p, scores_t, att_t, x_ta, mixed, att_s, output, tuple(temporal_masks), tuple(spatial_masks),
                        mask_mode)

    def backward_passes(self, passes: TSPasses, grad: torch.Tensor) -> None:
        """Set ``qk_weight.grad`` (and ``qk_bias.grad``) to the gradient of <G, X_TSA> for stacked passes
        (``forward_passes``, e.g. under ``torch.no_grad``) and G = dL/dX_TSA [kT, N, D]: autograd's gradient,
        derived by hand.

        Why by hand: a server round is 100 iterations of a small graph, where autograd's bookkeeping (graph, saved
        tensors, view/expand backward nodes, gradient accumulation) and one kernel per pass are overhead. Here every
        product runs once for both passes (stacked rows), the passes' gradients meet in dL/dA^(T) and dL/d(spatial
        Q|K of X), and dL/dP [N, T, H*D] goes through one matmul with X (dW = dP^T X), as the one projection matmul
        of the forward (a round 1.16x faster on a 2-core CPU, benchmarks/results/fedtsa_speed_target_cpu.md).
        """
        p, k, t, root = passes.projections, passes.passes, passes.output.shape[-3] // passes.passes, math.sqrt(self.dim)
        hadamard = passes.mask_mode == "hadamard"
        att_s = passes.spatial_attention
        x_ta = passes.temporal_output  # [N, kT, D] (or [N, T, D] = X)
        d_att_s = grad @ x_ta.transpose(-3, -2).transpose(-1, -2) if self.temporal or k == 1 else (
            grad.unflatten(-3, (k, t)) @ x_ta.transpose(-3, -2).transpose(-1, -2).unsqueeze(-4)).flatten(-4, -3)
        d_scores_s = _stacked_softmax_backward(att_s, d_att_s, passes.spatial_masks if hadamard else (), -3) / root
        if not self.temporal and k > 1:  # one spatial score tensor for both passes
            d_scores_s = d_scores_s.unflatten(-3, (k, t)).sum(-4)
        sq, sk = passes.mixed_spatial.transpose(-3, -2).split(self.dim, dim=-1)
        d_mixed = torch.cat([d_scores_s @ sk, d_scores_s.transpose(-1, -2) @ sq], dim=-1).transpose(-3, -2)
        d_proj = d_mixed  # [N, T, 2D] without the temporal module
        if self.temporal:  # through X_TA = a^(T) X and the mixed spatial Q|K = a^(T) (X W_s^T)
            att_t = passes.temporal_attention  # [N, kT, T]
            d_x_ta = (att_s.transpose(-1, -2) @ grad).transpose(-3, -2)  # [N, kT, D]
            d_att_t = torch.baddbmm(d_x_ta @ p.values.transpose(-1, -2), d_mixed, p.spatial.transpose(-1, -2)) \
                if d_x_ta.dim() == 3 else d_x_ta @ p.values.transpose(-1, -2) + d_mixed @ p.spatial.transpose(-1, -2)
            d_scores_t = _stacked_softmax_backward(att_t, d_att_t, passes.temporal_masks if hadamard else (), -2)
            d_scores_t = d_scores_t.unflatten(-2, (k, t)).sum(-3) / root if k > 1 else d_scores_t / root
            d_proj = torch.cat([d_scores_t @ p.temporal_key, d_scores_t.transpose(-1, -2) @ p.temporal_query,
                                att_t.transpose(-1, -2) @ d_mixed], dim=-1)  # the heads' order in qk_weight
        rows = d_proj.flatten(-3, -2)  # [N*T, H*D]
        self.qk_weight.grad = rows.transpose(-1, -2) @ p.values.flatten(-3, -2)  # [H*D, D]
        if self.qk_bias is not None:
            self.qk_bias.grad = rows.sum(-2)


def _per_step(mask: Optional[torch.Tensor], x: torch.Tensor) -> Optional[torch.Tensor]:
    """A spatial mask [N, N] (one for every step) as [1, N, N]; [T, N, N] as it is."""
    return mask.unsqueeze(-3) if mask is not None and mask.dim() == x.dim() - 1 else mask


def _stacked_softmax_backward(attention: torch.Tensor, grad: torch.Tensor, masks: Tuple[Optional[torch.Tensor], ...],
                              dim: int) -> torch.Tensor:
    """``masked_softmax_backward`` of passes stacked along ``dim`` (-3: [kT, N, N]; -2: [N, kT, T]); ``masks`` per
    pass for 'hadamard' (empty for 'exclude', where masked entries have attention 0 and so gradient 0)."""
    out = masked_softmax_backward(attention, grad, None)
    if any(m is not None for m in masks):
        parts = out.unflatten(dim, (len(masks), -1))  # the passes along dim - 1 (not ``chunk``/``split``: export
        # keeps T symbolic through ``unflatten``)
        out = torch.stack([part if m is None else part * m.to(part.dtype)
                           for part, m in zip(parts.unbind(dim - 1), masks)], dim - 1).flatten(dim - 1, dim)
    return out


# ----------------------------------------------------------------------------------------------------------------
# Heterogeneity-aware augmentation (Sec. 4.4.2): which attention entries the augmented pass keeps.


def similarity_mask(indicators: torch.Tensor) -> torch.Tensor:
    """M^cur (Eq. 15): ``cos(p_i, p_j) >= tau`` with tau = the mean of the N x N cosine matrix (diagonal included)."""
    flat = indicators.detach().double()
    norms = flat.norm(dim=1)
    denom = (norms[:, None] * norms[None, :]).clamp_min(1e-12)
    cos = torch.where(denom > 1e-12, flat @ flat.T / denom, torch.zeros(()).double())
    return cos >= cos.mean()


def weighted_choice(weights: torch.Tensor, k: int, generator: torch.Generator,
                    candidates: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Bool mask [..., M] of ``k`` entries per row drawn without replacement, each draw proportional to ``weights``
    among the remaining ``candidates`` (Efraimidis-Spirakis keys log(u)/w; same law as numpy ``choice(p=...)``).

    Weights are clamped to >= 1e-12 so that zero-weight candidates are drawn last rather than never.
    """
    u = torch.rand(weights.shape, generator=generator, dtype=torch.float64).clamp_min(1e-300)
    keys = u.log() / weights.detach().double().cpu().clamp_min(1e-12)
    if candidates is not None:
        keys = keys.masked_fill(~candidates, float("-inf"))
    out = torch.zeros(weights.shape, dtype=torch.bool)
    if k <= 0:
        return out
    top = keys.topk(k, dim=-1).indices
    return out.scatter(-1, top, True)


def sample_temporal_mask(attention: torch.Tensor, generator: torch.Generator, augmentation: str = "bernoulli",
                         drop: float = 0.75, uniform: Optional[torch.Tensor] = None) -> torch.Tensor:
    """M^tem [N, T, T] from the temporal attention a^(T) [N, T, T] ('bernoulli': any leading dims, e.g. [R, N, T, T]);
    the diagonal is always kept.

    'bernoulli' (paper): entry kept with probability a_{t_i t_j}. 'count' (code ``aug_temporal``): per client,
    ``int(T*T*drop)`` of the T*T entries are masked, drawn without replacement with probability proportional to
    1 - a, then the diagonal is restored (so between that count and that count minus T off-diagonal entries go).
    'bernoulli' compares float64 uniforms with a: drawn here from ``generator`` (CPU), or given as ``uniform``
    (drawn earlier from the same generator, ``bernoulli_uniforms``); then the mask is built on a's device with no
    host round trip. 'count' draws on the CPU.
    """
    t = attention.shape[-1]
    if augmentation == "bernoulli":  # any leading dims (rounds at once: [R, N, T, T])
        a = attention.detach().double()
        u = torch.rand(a.shape, generator=generator, dtype=torch.float64) if uniform is None else uniform
        keep = u.to(a.device) < a
        return keep | torch.eye(t, dtype=torch.bool, device=a.device).expand(a.shape)
    n = attention.shape[0]
    a = attention.detach().double().cpu()
    eye = torch.eye(t, dtype=torch.bool).expand(n, t, t)
    if augmentation == "count":
        dropped = weighted_choice((1 - a).reshape(n, t * t), int(t * t * drop), generator).view(n, t, t)
        keep = ~dropped
    else:
        raise ValueError(f"augmentation must be one of {AUGMENTATIONS}, got {augmentation!r}")
    return keep | eye


def bernoulli_uniforms(iterations: int, n_clients: int, window: int, temporal: bool, generator: torch.Generator,
                       device: torch.device | str = "cpu") -> Tuple[Optional[torch.Tensor], torch.Tensor]:
    """The float64 uniforms that ``iterations`` rounds of 'bernoulli' mask sampling would draw from ``generator``,
    in the same order (per iteration: the temporal mask's [N, T, T], then the spatial mask's [N, N]), stacked and
    moved to ``device`` once: (temporal [iterations, N, T, T] or None, spatial [iterations, N, N]). The draws do not
    depend on the attention, so drawing them up front gives the same masks with no host round trip per iteration."""
    temporal_u, spatial_u = [], []
    for _ in range(iterations):
        if temporal:
            temporal_u.append(torch.rand((n_clients, window, window), generator=generator, dtype=torch.float64))
        spatial_u.append(torch.rand((n_clients, n_clients), generator=generator, dtype=torch.float64))
    stacked_t = torch.stack(temporal_u).to(device) if temporal_u else None
    spatial = torch.stack(spatial_u) if spatial_u else torch.zeros((0, n_clients, n_clients), dtype=torch.float64)
    return stacked_t, spatial.to(device)


def sample_spatial_mask(attention: torch.Tensor, current: torch.Tensor, generator: torch.Generator,
                        augmentation: str = "bernoulli", edge_drop: float = 0.8, edge_add: float = 0.2,
                        uniform: Optional[torch.Tensor] = None) -> torch.Tensor:
    """M^spa [N, N] refining M^cur (``current``) with the spatial attention a^(S) [N, N]; self-edges always kept.
    'bernoulli' also takes leading dims (a block of R rounds: attention and ``current`` [R, N, N]).

    'bernoulli' (paper): an edge of M^cur is dropped with probability 1 - a_ij, a non-edge is added with probability
    a_ij. (Read literally, both make entry ij present with probability a_ij, whatever M^cur says.)
    'count' (code ``aug_spatiol``): ``int(edges*edge_drop)`` off-diagonal edges are dropped, drawn proportional to
    1 - a_ij, and ``int(non_edges*edge_add)`` non-edges are added, drawn proportional to a_ij.
    """
    n = attention.shape[-1]
    bernoulli = augmentation == "bernoulli"  # built on the attention's device (``uniform``: see the temporal mask)
    a = attention.detach().double() if bernoulli else attention.detach().double().cpu()
    eye = torch.eye(n, dtype=torch.bool, device=a.device)
    edges = current.to(a.device).bool() & ~eye
    non_edges = ~current.to(a.device).bool() & ~eye
    if bernoulli:
        u = (torch.rand(a.shape, generator=generator, dtype=torch.float64) if uniform is None else uniform).to(a.device)
        kept = edges & (u >= 1 - a)  # dropped with probability 1 - a_ij
        added = non_edges & (u < a)  # added with probability a_ij
    elif augmentation == "count":
        dropped = weighted_choice((1 - a).reshape(-1), int(int(edges.sum()) * edge_drop), generator,
                                  edges.reshape(-1)).view(n, n)
        added = weighted_choice(a.reshape(-1), int(int(non_edges.sum()) * edge_add), generator,
                                non_edges.reshape(-1)).view(n, n)
        kept = edges & ~dropped
    else:
        raise ValueError(f"augmentation must be one of {AUGMENTATIONS}, got {augmentation!r}")
    return kept | added | eye
