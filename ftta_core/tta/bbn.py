r"""BBN / CWAN (pFedBBN, section 3.1): class-balanced BatchNorm from pseudo-labels + confident self-distillation.

The paper's formulas were lost in extraction; these are the equations implemented, rebuilt from its text.

**Balanced BN (CWAN), eqs. (1)-(4)**, per BN layer with C channels, for a client's batch of B images with
activations ``a_{b,c,s}`` (S spatial positions) and teacher pseudo-labels ``y_b`` (K classes). The paper keeps a
running mean/variance per class, updated from pseudo-labels with a momentum m "where B is the batch size and d the
feature dimension", and averages them over classes; we follow the per-sample form of TRIBE's Balanced BN
(Su et al., AAAI 2024), which the text matches:

    n_k       = sum_b 1[y_b = k],     lambda_k = min(1, m n_k)       (per-sample momentum m)              (3)
    mu^_k     = 1/(n_k S) sum_{b: y_b = k} sum_s a_{b,:,s},   var^_k = the same of (a - mu^_k)^2
    delta_k   = lambda_k (mu^_k - mu_k)                    (0 for classes absent from the batch)
    v_k       = lambda_k (var^_k + (mu^_k - mu_k)^2) - delta_k^2
    mu_k     <- mu_k + (1 - g) delta_k + g mean_{j present} delta_j                                        (1)
    var_k    <- var_k + (1 - g) 1[n_k > 0] (v_k - lambda_k var_k)
                      + g (mean_{j present} v_j - mean_{j present} lambda_j * var_k)                        (2)
    mu_bar    = 1/K sum_k mu_k,    var_bar = 1/K sum_k [var_k + (mu_k - mu_bar)^2]                          (4)
    BN(a)     = gamma (a - mu_bar) / sqrt(var_bar + eps) + beta

With g = 0 a present class's statistics become the exact mixture of (1 - lambda_k) x old and lambda_k x batch
class statistics (``var_k <- (1-l) var_k + l var^_k + l (1-l) (mu^_k - mu_k)^2``) and absent classes keep theirs;
g = ``agnostic`` (0.5) interpolates with a class-agnostic update that shifts every class by the average change of
the present ones. Without it (g = 0, the literal reading) a client whose pseudo-labels collapse onto a few classes
under a strong shift keeps (K - few)/K of the source statistics and stays at source accuracy (seen on the digits);
m = ``bn_momentum`` (0.01) and g are not given in the paper. ``mu_k, var_k`` start at the source running statistics.
``var_bar`` is the variance of the class-balanced mixture (law of total variance; TRIBE uses the unbiased variance
of the class means); ``mixture_variance=False`` gives the plain average ``1/K sum_k var_k``. Gradients flow through
the batch terms, as in RoTTA's RobustBN.

**Self-distillation, eqs. (5)-(6).** Teacher and student share the parameters (the paper's "confidence-filtered
self-distillation"): the teacher is the model on the clean batch x, the student the model on an augmented view
x~ (``augmentation``, CoTTA's by default); p = softmax of the logits, H the entropy:

    y_b     = argmax p^T(x_b)     (teacher forward with the statistics of the previous step, no update)
    L_KD    = 1/B sum_b 1[H(p^T(x_b)) < tau] CE(p^S(x~_b), y_b),        tau = entropy_threshold * ln K     (5)
    L_cons  = 1/B sum_b KL(p^src(x_b) || p^T(x_b))                                                        (6)
    L       = L_KD + lambda L_cons,                                      lambda = consistency (1.0)

``p^src`` is the frozen source model (source BN statistics; ``anchor_bn="balanced"`` uses the client's balanced
statistics with the source affine parameters instead). In eq. (6) ``p^T`` carries gradients (it anchors the
adapting teacher). The class statistics are updated in the same forward that computes L, from the clean half of
``[x, x~]`` with the pseudo-labels y; only BN affine parameters gamma, beta are trained (Adam, lr 1e-3, one step).
The local prediction is the clean half of that forward (balanced statistics including this batch).

Shared with the server: the BN affine parameters and, with ``mix_statistics``, the per-class statistics
(``bbn.<layer>`` [N, K, 2, C]); ``bn_statistics`` gives the balanced (mu_bar, var_bar) that pFedBBN compares.
"""
from __future__ import annotations

import math
from typing import Dict, Optional, Tuple

import torch
import torch.nn.functional as F

from ..engine.bank import ClientBank, ForwardOutput, LossFn
from ..validation import check_choice
from .augment import STRENGTHS, augment
from .basic import entropy
from .normalised import NormalisedMethod, StatefulNormaliser, class_moments

ANCHOR_BN = ("source", "balanced")


def balanced_statistics(stats: torch.Tensor, mixture_variance: bool = True) -> Tuple[torch.Tensor, torch.Tensor]:
    """Class-balanced (mean, var) [n, C] from per-class statistics [n, K, 2, C] (eq. 4)."""
    means, variances = stats[:, :, 0], stats[:, :, 1]
    mean = means.mean(1)
    var = variances.mean(1)
    if mixture_variance:
        var = var + (means - mean[:, None]).square().mean(1)
    return mean, var


def update_class_statistics(stats: torch.Tensor, b_mean: torch.Tensor, b_var: torch.Tensor, counts: torch.Tensor,
                            momentum: float, agnostic: float) -> torch.Tensor:
    """Eqs. (1)-(3): per-class statistics [n, K, 2, C] after a batch with class moments [n, K, C] and counts [n, K]."""
    mean, var = stats[:, :, 0], stats[:, :, 1]
    seen = (counts > 0).to(mean.dtype)[..., None]                          # [n, K, 1]
    rate = (momentum * counts).clamp(max=1.0)[..., None] * seen            # lambda_k = min(1, m n_k)
    gap = b_mean - mean
    shift = rate * gap                                                     # delta_k
    spread = rate * (b_var + gap.square()) - shift.square()                # lambda_k E_k - delta_k^2
    n_seen = seen.sum(1, keepdim=True)                                     # [n, 1, 1] (>= 1: every batch has a class)
    mean = mean + (1 - agnostic) * shift + agnostic * shift.sum(1, keepdim=True) / n_seen
    var = var + (1 - agnostic) * seen * (spread - rate * var)
    var = var + agnostic * (spread.sum(1, keepdim=True) - rate.sum(1, keepdim=True) * var) / n_seen
    return torch.stack([mean, var], 2)


class ClassBalancedBN(StatefulNormaliser):
    """Per-class running statistics [N, K, 2, C] per layer, updated from pseudo-labels; normalises balanced."""

    def __init__(self, momentum: float = 0.01, agnostic: float = 0.5, mixture_variance: bool = True) -> None:
        super().__init__()
        if not 0.0 < momentum <= 1.0:
            raise ValueError(f"bn_momentum must be in (0, 1], got {momentum}")
        if not 0.0 <= agnostic <= 1.0:
            raise ValueError(f"agnostic must be in [0, 1], got {agnostic}")
        self.momentum, self.agnostic, self.mixture_variance = momentum, agnostic, bool(mixture_variance)
        self.n_classes = 0
        self.labels: Optional[torch.Tensor] = None  # [N, B_l]: update from the first B_l samples; None = no update

    def __call__(self, layer: str, x: torch.Tensor, clients: slice, source_mean: torch.Tensor,
                 source_var: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        if self.labels is None:
            if layer not in self.state:  # K copies of the source statistics balance to the source statistics
                n = x.shape[0]
                return source_mean.expand(n, -1).clone(), source_var.expand(n, -1).clone()
            return balanced_statistics(self.state[layer][clients].clone(), self.mixture_variance)
        if self.n_classes < 1:
            raise RuntimeError("set n_classes before updating class-balanced statistics")
        stats = self.get(layer, lambda: self.source_init(source_mean, source_var, self.n_classes))
        labels = self.labels[clients]
        b_mean, b_var, counts = class_moments(x[:, :labels.shape[1]], labels, self.n_classes)
        new = update_class_statistics(stats[clients].clone(), b_mean, b_var, counts, self.momentum, self.agnostic)
        stats[clients] = new.detach()
        return balanced_statistics(new, self.mixture_variance)


class BBN(NormalisedMethod):
    """BBN / CWAN: class-balanced BN + confident self-distillation + source consistency (see the module doc)."""

    name = "bbn"
    stats_prefix = "bbn."

    def __init__(self, bn_momentum: float = 0.01, agnostic: float = 0.5, entropy_threshold: float = 0.4,
                 consistency: float = 1.0, anchor_bn: str = "source", augmentation: str = "cotta",
                 mixture_variance: bool = True,
                 optimizer: str = "adam", lr: float = 1e-3, momentum: float = 0.0, weight_decay: float = 0.0,
                 mix_statistics: bool = True, seed: int = 0) -> None:
        if entropy_threshold <= 0:
            raise ValueError(f"entropy_threshold must be positive (a fraction of ln K), got {entropy_threshold}")
        if consistency < 0:
            raise ValueError(f"consistency must be >= 0, got {consistency}")
        check_choice("anchor_bn", anchor_bn, ANCHOR_BN)
        check_choice("augmentation", augmentation, tuple(STRENGTHS))
        super().__init__(ClassBalancedBN(bn_momentum, agnostic, mixture_variance), optimizer, lr, momentum, weight_decay,
                         mix_statistics, seed)
        self.entropy_threshold, self.consistency = entropy_threshold, consistency
        self.anchor_bn, self.augmentation = anchor_bn, augmentation
        self.source: Dict[str, torch.Tensor] = {}  # the source's BN affine parameters [N, ...] (the anchor)
        self._target: Optional[Tuple[torch.Tensor, ...]] = None

    def loss(self, out: ForwardOutput, params: Dict[str, torch.Tensor], x: torch.Tensor, clients: slice) -> torch.Tensor:
        """``L_KD + lambda L_cons`` per client on outputs of ``[x, x~]`` (eqs. 5-6)."""
        if self._target is None:
            raise RuntimeError("BBN.loss is only defined during adapt()")
        pseudo, confident, p_src, logp_src = (t[clients] for t in self._target)
        b = pseudo.shape[1]
        clean, aug = out.logits[:, :b], out.logits[:, b:]
        ce = F.cross_entropy(aug.flatten(0, 1), pseudo.flatten(), reduction="none").view(pseudo.shape)
        distill = (confident * ce).sum(1) / b
        cons = (p_src * (logp_src - clean.log_softmax(-1))).sum(-1).mean(1)
        return distill + self.consistency * cons

    def adapt(self, bank: ClientBank, x: torch.Tensor, regularizer: Optional[LossFn] = None) -> ForwardOutput:
        norm = self.install(bank)
        norm.labels = None
        if not self.source:
            self.source = bank.get_params()
        with torch.no_grad():
            teacher = bank.forward(x, "custom").logits
            anchor = bank.forward(x, "source" if self.anchor_bn == "source" else "custom", params=self.source).logits
        n_classes = teacher.shape[-1]
        norm.n_classes = n_classes
        pseudo = teacher.argmax(-1)
        confident = (entropy(teacher) < self.entropy_threshold * math.log(n_classes)).to(teacher.dtype)
        self._target = (pseudo, confident, anchor.softmax(-1), anchor.log_softmax(-1))
        b = x.shape[1]
        both = torch.cat([x, augment(x, self.generator("augment"), self.augmentation)], 1)

        def loss(out: ForwardOutput, params: Dict[str, torch.Tensor], x_: torch.Tensor, clients: slice) -> torch.Tensor:
            total = self.loss(out, params, x_, clients)
            if regularizer is not None:  # strategy terms see the clean view, as for the other methods
                clean = ForwardOutput(out.logits[:, :b], out.features[:, :b])
                total = total + regularizer(clean, params, x_[:, :b], clients)
            return total

        norm.labels = pseudo
        try:
            out = bank.adapt(both, loss, "custom")
        finally:
            norm.labels, self._target = None, None
        self.step += 1
        return ForwardOutput(out.logits[:, :b], out.features[:, :b])

    @torch.no_grad()
    def predict(self, bank: ClientBank, x: torch.Tensor) -> ForwardOutput:
        """The (mixed) model with its balanced statistics (no update)."""
        self.install(bank).labels = None
        return bank.forward(x, "custom")

    def bn_statistics(self, bank: ClientBank) -> Dict[str, torch.Tensor]:
        """Balanced (mean, var) per layer [N, 2, C] (eq. 4): what clients upload to pFedBBN."""
        norm = self.normaliser
        return {k: torch.stack(balanced_statistics(v, norm.mixture_variance), 1) for k, v in norm.state.items()}

    def state_dict(self) -> dict:
        return {**super().state_dict(), "n_classes": self.normaliser.n_classes,
                "source": {k: v.clone() for k, v in self.source.items()}}

    def load_state_dict(self, state: dict) -> None:
        if not state:
            return
        super().load_state_dict(state)
        self.normaliser.n_classes = int(state["n_classes"])
        self.source = {k: v.clone() for k, v in state["source"].items()}
