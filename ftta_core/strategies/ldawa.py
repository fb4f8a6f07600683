"""L-DAWA (Rehman et al., ICCV 2023): layer-wise aggregation weighted by each client's cosine to the global layer."""
from __future__ import annotations

from typing import Dict, Optional

import torch

from .base import ServerInputs, StateDict, Strategy, clone_state, is_bn_stats, size_fractions, weighted_mean_state
from ..validation import check_choice

BN_STATS_MODES = ("fedavg", "layerwise")
REFERENCES = ("previous", "mean")


def layer_weights(state: StateDict, reference: StateDict, p: torch.Tensor, normalize: bool = True,
                  bn_stats: str = "fedavg") -> Dict[str, torch.Tensor]:
    """Per named tensor l: ``a_k = p_k c_k / sum_j p_j c_j`` with ``c_k = clip(cos(theta_k^l, ref^l), 0, 1)`` [N]."""
    out = {}
    for k, v in state.items():
        if bn_stats == "fedavg" and is_bn_stats(k, v):
            out[k] = p.clone()
            continue
        flat = v.detach().reshape(v.shape[0], -1).double()
        ref = reference[k].detach().reshape(1, -1).to(flat.device).double()
        norms = flat.norm(dim=1) * ref.norm()
        cos = torch.where(norms > 0, (flat @ ref.T).flatten() / norms.clamp_min(1e-300), torch.ones_like(norms))
        cos = torch.nan_to_num(cos.cpu(), nan=0.0).clamp(0.0, 1.0)  # rejected (NaN) rows have p_k = 0 anyway
        a = torch.where(p > 0, p * cos, torch.zeros_like(p))
        if normalize:
            a = a / a.sum() if a.sum() > 0 else p.clone()
        out[k] = a
    return out


class LDAWA(Strategy):
    """One global model mixed layer by layer with ``layer_weights``; W reported = the layer-average of those weights.

    The global reference is the model sent at the last mix ('previous', L-DAWA's w_g; the FedAvg mean at the first
    step) or the current FedAvg mean ('mean'). ``normalize=False`` is the official unnormalised scaling
    ``sum_k p_k c_k theta_k`` (shrinks layers; not a convex combination). BN statistics are averaged as in FedAvg
    by default (FedTSA: LDAWA equals FedAvg under TTA-bn); ``bn_stats='layerwise'`` applies the cosine rule to them.
    """

    name = "ldawa"
    robust_mixing_aware = True  # each layer's global value is ``mean_state`` (robust with robust mixing)

    def __init__(self, reference: str = "previous", normalize: bool = True, bn_stats: str = "fedavg") -> None:
        check_choice("reference", reference, REFERENCES)
        check_choice("bn_stats", bn_stats, BN_STATS_MODES)
        self.reference, self.normalize, self.bn_stats = reference, normalize, bn_stats
        self.global_model: Optional[StateDict] = None
        self._weights: Optional[Dict[str, torch.Tensor]] = None

    def reset(self, n_clients: int) -> None:
        super().reset(n_clients)
        self.global_model, self._weights = None, None

    def _reference(self, state: StateDict, p: torch.Tensor) -> StateDict:
        if self.reference == "previous" and self.global_model is not None and set(self.global_model) == set(state):
            return self.global_model
        return weighted_mean_state(state, p)

    def collaboration(self, inputs: ServerInputs) -> torch.Tensor:
        p = size_fractions(inputs)
        n = p.shape[0]
        if not inputs.state:
            self._weights = None
            return p.float().unsqueeze(0).repeat(n, 1)
        self._weights = layer_weights(inputs.state, self._reference(inputs.state, p), p, self.normalize,
                                      self.bn_stats)
        avg = torch.stack(list(self._weights.values())).mean(0)
        avg = avg / avg.sum() if avg.sum() > 0 else p
        return avg.float().unsqueeze(0).repeat(n, 1)

    def mix(self, state: Dict[str, torch.Tensor], weights: torch.Tensor) -> Dict[str, torch.Tensor]:
        per_layer = self._weights
        if per_layer is None or set(per_layer) != set(state):  # called without collaboration: use W's first row
            per_layer = {k: weights[0].double().cpu() for k in state}
        self._weights = None
        new_global = {k: self.mean_state({k: v}, per_layer[k])[k] for k, v in state.items()}
        self.global_model = new_global
        return {k: v.expand_as(state[k]).clone() for k, v in new_global.items()}

    def state_dict(self) -> dict:
        return {} if self.global_model is None else {"global": clone_state(self.global_model)}

    def load_state_dict(self, state: dict) -> None:
        self.global_model = clone_state(state["global"]) if "global" in state else None
