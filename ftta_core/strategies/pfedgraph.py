"""pFedGraph (Ye et al., ICML 2023): a collaboration graph from a per-client QP on model similarity and data size."""
from __future__ import annotations

import torch

from .base import SIMILARITY_SOURCES, RemembersStates, ServerInputs, Strategy, cosine_from_gram, similarity_gram, \
    size_fractions
from .simplex import graph_weights
from ..validation import check_choice


class PFedGraph(RemembersStates, Strategy):
    """Row i = ``argmin_{x in simplex} lam x^T x + (d_i - 2 lam p)^T x`` = ``proj_simplex(p - d_i / (2 lam))``.

    ``d_ij = -cos(a_i, a_j)``, set to -1 where below ``-clip`` (pFedGraph code: -0.9), p = sample fractions,
    lam = 0.8. a = the shared state's 'update' since the client's last received model (default; pFedGraph
    compares parameter updates, at the first step deviations from the FedAvg mean), the raw 'state', or the
    source-feature 'indicator' upload.
    """

    name = "pfedgraph"
    keep = ("received",)

    def __init__(self, lam: float = 0.8, similarity_on: str = "update", clip: float = 0.9) -> None:
        if not lam > 0:
            raise ValueError(f"lam must be positive, got {lam}")
        check_choice("similarity_on", similarity_on, SIMILARITY_SOURCES)
        if not 0.0 <= clip <= 1.0:
            raise ValueError(f"clip must be in [0, 1], got {clip}")
        self.lam, self.similarity_on, self.clip = lam, similarity_on, clip
        self.needs = ("indicator",) if similarity_on == "indicator" else ()
        self.keep = ("received",) if similarity_on == "update" else ()  # memory only where it is used

    def difference(self, inputs: ServerInputs) -> torch.Tensor:
        """pFedGraph's model difference matrix d [N, N] (negative cosine similarity, clipped to -1 near -1)."""
        d = -cosine_from_gram(similarity_gram(inputs, self.similarity_on, self.memory.get("received")))
        return torch.where(d < -self.clip, torch.full_like(d, -1.0), d)

    def collaboration(self, inputs: ServerInputs) -> torch.Tensor:
        return graph_weights(self.difference(inputs), size_fractions(inputs), self.lam, inputs.valid).float()
