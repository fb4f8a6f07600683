"""FROZEN verbatim copy of FedTSA's server round as of commit c9857d8 (the oracle of ``tests/test_oracle_ts_block.py``).

Do not edit: this is the reference the current implementation (``ftta_core.strategies.ts_block`` and the round of
``ftta_core.strategies.fedtsa``) is compared against. Made by copying
``git show c9857d8:ftta_core/strategies/ts_block.py`` (everything after its imports) and the round code of
``git show c9857d8:ftta_core/strategies/fedtsa.py`` (``FedTSADiagnostics``, ``_on_cpu``, ``_on_device``,
``detached_attention``, ``round_mse``, and the methods ``batched_rounds``, ``_iteration``, ``_masks``, ``_train``
of ``FedTSA``, here on ``FrozenRound``, a holder of the FedTSA options those methods read). Only the imports and
``FrozenRound.__init__`` are new.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

# ---------------------------------------------------------------- c9857d8: ftta_core/strategies/ts_block.py

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
        lead = () if self.rounds is None else (self.rounds,)
        if x.dim() != 3 + len(lead) or x.shape[:-3] != lead or x.shape[-1] != self.dim:
            raise ValueError(f"TS-Block expects X [{''.join(f'{r}, ' for r in lead)}T, N, {self.dim}], "
                             f"got {tuple(x.shape)}")
        p = self.project(x) if projections is None else projections
        spatial = p.spatial  # [N, T, 2D]: spatial Q|K of X
        if self.temporal:
            scores_t = self.temporal_scores(x, p) if temporal_scores is None else temporal_scores
            att_t = masked_softmax(scores_t, temporal_mask, mask_mode)  # [N, T, T]
            x_ta = (att_t @ p.values).transpose(-3, -2)  # Eq. 11 / 16: [T, N, D]
            spatial = att_t @ spatial  # the spatial Q|K of X_TA
        else:
            scores_t, att_t, x_ta = None, None, x
        if spatial_mask is not None and spatial_mask.dim() == x.dim() - 1:  # one [N, N] mask for every step
            spatial_mask = spatial_mask.unsqueeze(-3)
        sq, sk = spatial.transpose(-3, -2).split(self.dim, dim=-1)  # [T, N, D] each
        att_s = masked_softmax(sq @ sk.transpose(-1, -2) / math.sqrt(self.dim), spatial_mask, mask_mode)  # [T, N, N]
        return TSBlockOutput(att_s @ x_ta, x_ta, scores_t, att_t, att_s, p)  # Eq. 14 / 17


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


# ---------------------------------------------------------------- c9857d8: ftta_core/strategies/fedtsa.py

@dataclass
class FedTSADiagnostics:
    """What the last server round computed (replaced every round, so it never grows)."""

    step: int
    window_steps: np.ndarray  # step ids in the window, oldest first [T']
    weights: torch.Tensor  # W_t [N, N]
    spatial_attention: Optional[torch.Tensor]  # selected, unmasked softmax(A^(S)) [T', N, N]
    temporal_attention: Optional[torch.Tensor]  # selected, unmasked softmax(A^(T)) [N, T', T']
    current_mask: torch.Tensor  # M^cur [N, N] (Eq. 15)
    spatial_mask: Optional[torch.Tensor]  # last sampled M^spa [N, N]
    temporal_mask: Optional[torch.Tensor]  # last sampled M^tem [N, T', T']
    loss: np.ndarray  # L_tsa per server iteration [server_steps]
    loss_regularization: np.ndarray  # MSE(X_TSA, X) per iteration
    loss_robustness: np.ndarray  # MSE(X_TSA, X_TSA') per iteration (zeros without augmentation)
    selected_iteration: int  # iteration whose attention gave W (-1: after the last update / untrained)
    seconds: float  # wall time of this server round (of its computation on a server thread when computed ahead)



def _on_cpu(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    return None if t is None else t.cpu()


def _on_device(t: Optional[torch.Tensor], device: torch.device) -> Optional[torch.Tensor]:
    return None if t is None else t.to(device)


def detached_attention(out: TSBlockOutput) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Detached copies of a pass's (spatial [T, N, N], temporal [N, T, T] or None) attention."""
    temporal = None if out.temporal_attention is None else out.temporal_attention.detach().clone()
    return out.spatial_attention.detach().clone(), temporal


def round_mse(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The mean squared error of one round's windows [T, N, D] (a scalar), or of each of R rounds [R, T, N, D] ([R])."""
    if a.dim() == 3:
        return F.mse_loss(a, b)
    return F.mse_loss(a, b, reduction="none").flatten(1).mean(1)


# rounds per batch when ``rounds_per_batch`` is left to the device: batched rounds are what a GPU needs (one round
# is launch-bound there); on a CPU they are no faster than separate rounds (benchmarks/README.md)
AUTO_ROUNDS_PER_BATCH = {"cpu": 1, "cuda": 64}

class FrozenRound:
    """The FedTSA options the round reads (defaults: the paper's, as ``FedTSA``'s), and c9857d8's round methods."""

    def __init__(self, lam: float = 1.0, lr: float = 1e-3, server_steps: int = 100, augmentation: str = "bernoulli",
                 temporal_drop: float = 0.75, edge_drop: float = 0.8, edge_add: float = 0.2, temporal: bool = True,
                 augment: bool = True, trained: bool = True, mask_mode: str = "exclude", select: str = "final",
                 graph_on: str = "indicator") -> None:
        self.lam, self.lr, self.server_steps, self.augmentation = lam, lr, server_steps, augmentation
        self.temporal_drop, self.edge_drop, self.edge_add = temporal_drop, edge_drop, edge_add
        self.temporal, self.augment, self.trained, self.mask_mode = temporal, augment, trained, mask_mode
        self.select, self.graph_on = select, graph_on

    @property
    def batched_rounds(self) -> bool:
        """Whether rounds can be trained as one block of R rounds: the paper's defaults ('final' selection, M^cur
        from the raw indicators, Bernoulli masks drawn up front or no augmentation); the code's 'best' selection
        and counted masks read values on the host every iteration, so those variants run round by round."""
        augmented = self.augment and self.lam > 0
        return (self.select == "final" and self.graph_on == "indicator"
                and (not augmented or self.augmentation == "bernoulli"))

    def _iteration(self, block: TSBlock, x: torch.Tensor, indicator_mask: torch.Tensor,
                   generator: Optional[torch.Generator], temporal_u: Optional[torch.Tensor],
                   spatial_u: Optional[torch.Tensor]):
        """One server iteration's forward: the plain pass, the masks and the augmented pass, and L_tsa (Eq. 18)
        (per round [R] for a block of R rounds). Returns (loss, regularization, robustness, plain pass output,
        masks (M^cur, M^tem, M^spa))."""
        out = block(x)
        loss_reg = round_mse(out.output, x)
        loss_rob = torch.zeros(x.shape[:-3], device=x.device)
        masks = (indicator_mask, None, None)
        lam = self.lam if self.augment else 0.0
        if lam > 0:
            masks = self._masks(out, indicator_mask, generator, (temporal_u, spatial_u))
            aug = block(x, masks[1], masks[2], self.mask_mode, temporal_scores=out.temporal_scores,
                        projections=out.projections)
            loss_rob = round_mse(out.output, aug.output)
        return loss_reg + lam * loss_rob, loss_reg, loss_rob, out, masks

    def _masks(self, out: TSBlockOutput, indicator_mask: torch.Tensor, generator: Optional[torch.Generator],
               uniforms: Tuple[Optional[torch.Tensor], Optional[torch.Tensor]] = (None, None)):
        """M^cur, M^tem, M^spa for the augmented pass, from this iteration's (detached) unmasked attention;
        ``indicator_mask`` is M^cur of the raw current indicators (it does not change between iterations);
        ``uniforms``: this iteration's pre-drawn Bernoulli uniforms (temporal, spatial), else drawn here."""
        current = similarity_mask(out.temporal_output[-1]) if self.graph_on == "temporal" else indicator_mask
        temporal_mask = None
        if self.temporal:
            temporal_mask = sample_temporal_mask(out.temporal_attention, generator, self.augmentation,
                                                 self.temporal_drop, uniform=uniforms[0])
        spatial_mask = sample_spatial_mask(out.spatial_attention[..., -1, :, :], current, generator,
                                           self.augmentation, self.edge_drop, self.edge_add, uniform=uniforms[1])
        device = out.output.device  # the masks are drawn on the CPU generator (same draws on every device)
        return current, _on_device(temporal_mask, device), spatial_mask.to(device)


    def _train(self, x: torch.Tensor, generators: Sequence[torch.Generator], block: TSBlock) -> List[FedTSADiagnostics]:
        """Train ``block`` on one window X [T', N, D] (one generator), or a block of R rounds on windows
        [R, T', N, D] (one generator each, ``batched_rounds`` only); the diagnostics of each round, W included."""
        batched = x.dim() == 4
        if batched and not self.batched_rounds:
            raise ValueError("this FedTSA variant trains its rounds one at a time (see batched_rounds)")
        lam = self.lam if self.augment else 0.0
        steps = self.server_steps if self.trained else 0
        windows = x if batched else x[None]
        indicator_mask = torch.stack([similarity_mask(window[-1]) for window in windows])
        indicator_mask = indicator_mask if batched else indicator_mask[0]
        masks = (indicator_mask, None, None)
        selected = (float("inf"), None, -1)  # (loss, (spatial, temporal) attention, iteration)
        optimizer = torch.optim.Adam(block.parameters(), lr=self.lr, fused=True) if steps else None
        # no host round trip per iteration unless 'best' selection reads the loss: the Bernoulli masks' uniforms
        # are drawn up front from the same CPU generator in the same order (same masks as drawing them one
        # iteration at a time), and the losses stay on the device until the round ends
        predrawn = lam > 0 and self.augmentation == "bernoulli"
        temporal_u, spatial_u = None, None
        if predrawn:
            draws = [bernoulli_uniforms(steps, x.shape[-2], x.shape[-3], self.temporal, generator, x.device)
                     for generator in generators]
            temporal_u = None if draws[0][0] is None else torch.stack([d[0] for d in draws], 1)
            spatial_u = torch.stack([d[1] for d in draws], 1)
            if not batched:
                temporal_u, spatial_u = None if temporal_u is None else temporal_u[:, 0], spatial_u[:, 0]
        losses = np.zeros((3, steps))
        loss_log = []  # per iteration: (loss, regularization, robustness), kept on the device
        for it in range(steps):
            loss, loss_reg, loss_rob, out, masks = self._iteration(
                block, x, indicator_mask, None if predrawn else generators[0],
                None if temporal_u is None else temporal_u[it], None if spatial_u is None else spatial_u[it])
            loss_log.append(torch.stack([loss, loss_reg, loss_rob]).detach())
            if self.select == "best" and not batched:
                losses[:, it] = loss_log[-1].tolist()  # 'best' reads the loss: one host sync per iteration
                if losses[0, it] < selected[0]:
                    selected = (losses[0, it], detached_attention(out), it)
            optimizer.zero_grad()
            (loss.sum() if batched else loss).backward()
            optimizer.step()
        losses = (torch.stack(loss_log, dim=1).cpu().double().numpy() if steps
                  else np.zeros((3, steps, *x.shape[:-3])))  # [3, steps] or [3, steps, R]
        if selected[1] is None:  # 'final', or untrained: the attention of the block as it is now
            with torch.no_grad():
                selected = (float("nan"), detached_attention(block(x)), -1)
        spatial, temporal = (_on_cpu(a) for a in selected[1])
        masks = tuple(_on_cpu(m) for m in masks)
        if not batched:
            spatial, temporal, losses = spatial[None], None if temporal is None else temporal[None], losses[..., None]
            masks = tuple(None if m is None else m[None] for m in masks)
        diagnostics = []
        for r in range(windows.shape[0]):
            weights = spatial[r, -1].float()
            weights = weights / weights.sum(1, keepdim=True)  # exact row sums after float rounding
            diagnostics.append(FedTSADiagnostics(
                -1, np.zeros(0), weights, spatial[r], None if temporal is None else temporal[r], masks[0][r],
                None if masks[2] is None else masks[2][r], None if masks[1] is None else masks[1][r],
                losses[0, :, r], losses[1, :, r], losses[2, :, r], selected[2], 0.0))
        return diagnostics
