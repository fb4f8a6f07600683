"""FedAvg on parameters while every client keeps its own normalisation statistics."""
from __future__ import annotations

from typing import Dict

import torch

from .base import is_bn_stats
from .basic import FedAvg


class FedAvgLocalStats(FedAvg):
    """FedAvg's W on the shared parameters; normalisation statistics (TTA-bn's [N, 2, C] entries, ``bn='running'``
    running statistics) stay each client's own, as FedBN (Li et al., ICLR 2021) keeps its BN layers local, here for
    the statistics only (BN affine parameters are averaged like every other parameter).

    It isolates what averaging the statistics does: FedAvg minus this strategy, paired by seed, is the effect of
    mixing the clients' statistics on top of mixing their parameters. The reported W is FedAvg's (the one applied to
    the parameters). Under TTA-bn only statistics are shared, so it equals Local.
    """

    name = "fedavg_localstats"
    robust_mixing_aware = True  # its mix is Strategy.mix (robust mixing of the parameters), statistics kept

    def mix(self, state: Dict[str, torch.Tensor], weights: torch.Tensor) -> Dict[str, torch.Tensor]:
        mixed = super().mix(state, weights)
        return {k: state[k].clone() if is_bn_stats(k, v) else v for k, v in mixed.items()}
