"""pFedBBN (section 3.2): personalised mixing weighted by the distance between clients' balanced BN statistics.

Equations implemented (rebuilt from the text; the paper's formulas were lost in extraction). Client i uploads, for
every BN layer l of the set L, its balanced global mean ``mu_i^l`` and variance ``var_i^l`` ([C_l] each; from a
local method that declares them, ``tta.base.BNStatisticsSource.bn_statistics(bank)`` -- BBN's class-balanced ones,
RoTTA's teacher RobustBN ones -- or else the statistics of the client's last BN forward, ``bank.bn_stats()``):

    d_ij   = sum_{l in L} ( ||mu_i^l - mu_j^l||_2 + ||var_i^l - var_j^l||_2 )          (7)
    W_ij   = exp(-d_ij / T) / sum_k exp(-d_ik / T)        (d_ii = 0: the largest weight is the client's own)  (8)
    theta_i <- sum_j W_ij theta_j                          (the engine's mixing kernel on the shared state)  (9)

Rejected clients (NaN/Inf uploads) take no part in anyone's softmax and keep their own model; a local method
without BN statistics (the frozen source) uploads nothing and gets the uniform W (it shares nothing to mix either).
``temperature`` T is not given in the paper; distances grow with the number and width of the layers, so T sets how
personal the mixing is (T -> 0: Local, T -> inf: FedAvg). ``scale`` brings d to a scale T can be set for once
(``strategies.base.scale_distances``): "none" (Eq. 7 as it is, the default), "count" (divided by the 2|L| summed
terms), "row_median" (each row divided by its median distance to the other clients). The rule for choosing T and
``scale``, stated before any accuracy is looked at: the setting whose W puts the largest share of weight on clients
of the same domain on a held-out stream (``workbook.same_domain_weight``), FedAvg's share being the baseline.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Dict

import torch

from ..engine.bank import ClientBank
from ..validation import check_choice
from .base import (DISTANCE_SCALES, ClientHooks, ServerInputs, Strategy, distance_from_gram, gram_matrix,
                   masked_row_softmax, scale_distances)

if TYPE_CHECKING:
    from ..tta.base import LocalMethod

UPLOAD_PREFIX = "bbn_stats."


def bn_statistics_distance(stats: Dict[str, torch.Tensor], valid: torch.Tensor) -> torch.Tensor:
    """Eq. (7): ``d_ij = sum_l ||mu_i^l - mu_j^l|| + ||var_i^l - var_j^l||`` [N, N] float64 from stats [N, 2, C_l]."""
    if not stats:
        raise ValueError("bn_statistics_distance needs the statistics of at least one BN layer")
    total = None
    for s in stats.values():
        for part in (s[:, 0], s[:, 1]):
            d = distance_from_gram(gram_matrix([part], valid))
            total = d if total is None else total + d
    return total


class PFedBBN(ClientHooks, Strategy):
    """W = row softmax of ``-d / temperature`` over the distances of the clients' balanced BN statistics."""

    name = "pfedbbn"

    def __init__(self, temperature: float = 1.0, scale: str = "none") -> None:
        if not temperature > 0:
            raise ValueError(f"temperature must be positive, got {temperature}")
        check_choice("scale", scale, DISTANCE_SCALES)
        self.temperature, self.scale = temperature, scale

    @torch.no_grad()
    def probe_uploads(self, bank: ClientBank, local: "LocalMethod", x: torch.Tensor,
                      step: int) -> Dict[str, torch.Tensor]:
        """Every client's (mean, var) [N, 2, C] per BN layer, as ``bbn_stats.<layer>`` (none if none recorded)."""
        from ..tta.base import BNStatisticsSource

        stats = local.bn_statistics(bank) if isinstance(local, BNStatisticsSource) else bank_statistics(bank)
        return {UPLOAD_PREFIX + k: v.detach() for k, v in stats.items()}

    def client_uploads(self, context: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        return {k: v for k, v in context.items() if k.startswith(UPLOAD_PREFIX)}

    def collaboration(self, inputs: ServerInputs) -> torch.Tensor:
        valid = inputs.valid.cpu().bool()
        n = valid.shape[0]
        if inputs.uploads:
            distance = scale_distances(bn_statistics_distance(inputs.uploads, valid), valid, self.scale,
                                       2 * len(inputs.uploads))
        else:  # a local method without BN statistics (the frozen source): no information, all distances 0
            distance = torch.zeros(n, n, dtype=torch.float64)
        mask = (valid[:, None] & valid[None, :]) | torch.eye(n, dtype=torch.bool)  # rejected: keep own model
        return masked_row_softmax(-distance / self.temperature, mask).float()


def bank_statistics(bank: ClientBank) -> Dict[str, torch.Tensor]:
    """The statistics of the clients' last batch/custom-mode BN forward, or {} if a layer recorded none."""
    try:
        stats = bank.bn_stats()
    except TypeError:  # the loop bank cannot stack missing statistics
        return {}
    return stats if all(v is not None for v in stats.values()) else {}
