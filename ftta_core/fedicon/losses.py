"""FedICON's contrastive losses: supervised contrastive (eq. 2-3) and unsupervised NT-Xent (eq. 5).

Both take representations ``z`` and L2-normalise them first (as SupCon/SimCLR do; the paper writes ``z_x . z_p``
with ``z = h(x)``). The paper's sums over the dataset become means over the anchors of a batch (a constant factor).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def supcon_loss(z: torch.Tensor, labels: torch.Tensor, tau: float) -> torch.Tensor:
    """Eq. 2-3: mean over anchors x of ``-1/|P(x)| sum_{p in P(x)} log(exp(z_x.z_p/tau) / sum_{a in A(x)} exp(z_x.z_a/tau))``.

    ``z`` [M, D] (the 2B augmented views of a batch), ``labels`` [M]; ``A(x)`` = every other sample of the batch,
    ``P(x)`` = those with x's label. Anchors with an empty ``P(x)`` are left out of the mean.
    """
    if not tau > 0:
        raise ValueError(f"tau (temperature) must be positive, got {tau}")
    if z.dim() != 2 or labels.shape != (z.shape[0],):
        raise ValueError(f"z must be [M, D] and labels [M], got {tuple(z.shape)} and {tuple(labels.shape)}")
    z = F.normalize(z, dim=1)
    m = z.shape[0]
    self_mask = torch.eye(m, dtype=torch.bool, device=z.device)
    logits = (z @ z.T / tau).masked_fill(self_mask, float("-inf"))   # a = x is not in A(x)
    log_prob = logits - torch.logsumexp(logits, dim=1, keepdim=True)
    positive = (labels[:, None] == labels[None, :]) & ~self_mask      # P(x), eq. 3
    count = positive.sum(1)
    per_anchor = -(log_prob.masked_fill(~positive, 0.0)).sum(1) / count.clamp_min(1)
    has = count > 0
    if not bool(has.any()):
        return z.sum() * 0.0
    return per_anchor[has].mean()


def ntxent_loss(z1: torch.Tensor, z2: torch.Tensor, tau: float) -> torch.Tensor:
    """Eq. 5 (SimCLR's NT-Xent): the positive of a view is the other view of the same image, ``A(x)`` = the other
    2B-1 views; this is ``supcon_loss`` with every image its own class."""
    if z1.shape != z2.shape:
        raise ValueError(f"z1 and z2 must have the same shape, got {tuple(z1.shape)} and {tuple(z2.shape)}")
    ids = torch.arange(z1.shape[0], device=z1.device)
    return supcon_loss(torch.cat([z1, z2]), torch.cat([ids, ids]), tau)
