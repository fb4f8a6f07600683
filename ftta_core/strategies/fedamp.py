"""FedAMP (Huang et al., AAAI 2021), in the heuristic attentive-message-passing form the FTTA reference code uses."""
from __future__ import annotations

import torch

from ..validation import check_choice
from .base import (SIMILARITY_SOURCES, RemembersStates, ServerInputs, Strategy, cosine_from_gram, distance_from_gram,
                   masked_row_softmax, similarity_gram)

METRICS = ("euclidean", "cosine")


def attentive_weights(scores: torch.Tensor, valid: torch.Tensor, self_weight: float) -> torch.Tensor:
    """``W_ii = s``, ``W_ij = (1 - s) softmax_{j != i, valid}(scores_ij)``; a client with no valid peer keeps itself."""
    n = scores.shape[0]
    eye = torch.eye(n, dtype=torch.bool)
    valid = valid.cpu().bool()
    peers = masked_row_softmax(scores, valid[None, :] & ~eye)
    has_peer = (valid[None, :] & ~eye).any(1, keepdim=True)
    w = (1 - self_weight) * peers + self_weight * eye.to(scores.dtype)
    return torch.where(has_peer, w, eye.to(scores.dtype))


class FedAMP(RemembersStates, Strategy):
    """Personalised mixing: self weight s (0.3), the rest spread over peers by ``exp(score / temperature)``.

    score = ``-||a_i - a_j||`` (metric 'euclidean', the FTTA reference code, temperature 1) or ``cos(a_i, a_j)``
    (metric 'cosine', HeurFedAMP; its sigma = 1 / temperature), where a = the uploaded source-feature 'indicator'
    (reference code, default), the raw shared 'state', or its 'update' since the last mix (FedAMP compares models).
    """

    name = "fedamp"
    keep = ("received",)

    def __init__(self, self_weight: float = 0.3, similarity_on: str = "indicator", metric: str = "euclidean",
                 temperature: float = 1.0) -> None:
        if not 0.0 <= self_weight <= 1.0:
            raise ValueError(f"self_weight must be in [0, 1], got {self_weight}")
        check_choice("similarity_on", similarity_on, SIMILARITY_SOURCES)
        check_choice("metric", metric, METRICS)
        if not temperature > 0:
            raise ValueError(f"temperature must be positive, got {temperature}")
        self.self_weight, self.similarity_on, self.metric, self.temperature = (self_weight, similarity_on, metric,
                                                                               temperature)
        self.needs = ("indicator",) if similarity_on == "indicator" else ()
        self.keep = ("received",) if similarity_on == "update" else ()  # memory only where it is used

    def collaboration(self, inputs: ServerInputs) -> torch.Tensor:
        gram = similarity_gram(inputs, self.similarity_on, self.memory.get("received"))
        scores = -distance_from_gram(gram) if self.metric == "euclidean" else cosine_from_gram(gram)
        return attentive_weights(scores / self.temperature, inputs.valid, self.self_weight).float()
