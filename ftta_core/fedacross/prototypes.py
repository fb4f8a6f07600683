"""Class prototypes (eq. 4) and nearest-prototype inference by Euclidean distance (eq. 5)."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Prototypes:
    """Per-class mean embeddings ``centres`` [L, D]; ``present`` [L] marks classes with at least one support point."""

    centres: torch.Tensor
    present: torch.Tensor

    @property
    def num_bytes(self) -> int:
        """Bytes of the prototypes of the classes present (what a client upstreams)."""
        return int(self.present.sum()) * self.centres.shape[1] * self.centres.element_size()


def class_prototypes(embeddings: torch.Tensor, labels: torch.Tensor, num_classes: int) -> Prototypes:
    """omega^(n) = mean of tau(x_l) over the support points of class n (eq. 4); absent classes get zeros."""
    if embeddings.dim() != 2 or labels.shape != embeddings.shape[:1]:
        raise ValueError(f"embeddings must be [n, D] and labels [n], got {tuple(embeddings.shape)} and "
                         f"{tuple(labels.shape)}")
    if len(labels) and (labels.min() < 0 or labels.max() >= num_classes):
        raise ValueError(f"labels must lie in [0, {num_classes}), got [{int(labels.min())}, {int(labels.max())}]")
    onehot = torch.nn.functional.one_hot(labels.long(), num_classes).to(embeddings.dtype)  # [n, L]
    counts = onehot.sum(0)
    centres = onehot.T @ embeddings / counts.clamp_min(1)[:, None]
    return Prototypes(centres, counts > 0)


def prototype_distances(embeddings: torch.Tensor, protos: Prototypes) -> torch.Tensor:
    """Euclidean distances [m, L] from each embedding to each prototype (inf for absent classes)."""
    dist = torch.cdist(embeddings, protos.centres.to(embeddings.dtype))
    return dist.masked_fill(~protos.present.to(dist.device)[None, :], float("inf"))


def nearest_prototype(embeddings: torch.Tensor, protos: Prototypes) -> torch.Tensor:
    """y_hat = argmin_n ||tau(x) - omega^(n)||_2 over the classes present (eq. 5)."""
    if not bool(protos.present.any()):
        raise ValueError("nearest_prototype needs at least one class with support points")
    return prototype_distances(embeddings, protos).argmin(1)
