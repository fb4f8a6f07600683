"""FedTHE / FedTHE+ (Jiang & Lin, "Test-Time Robust Personalization for Federated Learning", ICLR 2023), a
FedICON baseline (FedICON App. A.3: "no publicly available code ... its default hyperparameters").

The authors' code does exist: github.com/LINs-lab/FedTHE, ``codes/FedTHE_code_and_env/fl_code/`` (commit 699d55f);
this module follows it. What we took, with the file it comes from (paths under ``fl_code/``):

* **Training** (``pcode/local_training/THE_worker.py`` ``run``/``_brm_train``/``_personalized_train``,
  ``pcode/master.py``). A two-head model: the FL model (encoder + *global head* ``fc``) is trained locally with the
  balanced softmax loss (``--brm_loss BalancedSoftmax``: cross-entropy of ``logits + log(hist + 1)``, hist = the
  client's label histogram; ``pcode/utils/loss.py``) and averaged by FedAvg -- every parameter is shared. The
  *personalised head* (``Linear(d, C, bias=False)``, one per client, created once and kept across rounds, never
  sent) is trained every round for ``n_personalized_epochs`` = 1 epoch of cross-entropy on the *frozen features of
  the received global model* (``_personalized_train`` deep-copies ``self.model``, the received model, not the
  locally trained one), SGD at the round lr (0.01). The client's mean training feature ``h_l`` is sent with the
  model and the server averages them into ``h_g``. Clients are evaluated with the received global model + their
  personalised head, so the deployed model is the aggregated FL model.
* **Test-time head ensemble (THE)** (``THE_worker.py`` ``_validate_training``/``_calculate_samplewise_weight``/
  ``_multi_head_inference``). For each test batch, one ensemble weight per sample, parameterised as two logits
  (initialised equal: e = softmax = 0.5) so ``e`` (the global head's weight) stays in [0, 1]; the prediction is the
  argmax of the logit ensemble ``e g(z) + (1 - e) p(z)``. ``e`` minimises, over the batch mean,
  ``s H(softmax(e g + (1-e) p)) + (1 - s) (e ||z~ - h_g|| + (1 - e) ||z~ - h_l||)`` with ``s`` = cosine similarity of
  the two heads' softmax outputs (similarity-guided weighting of entropy vs feature alignment) and
  ``z~ = beta z + (1 - beta) hist``, ``hist`` an EMA of the test features over the stream
  (``hist_n = alpha z_n + (1 - alpha) hist_{n-1}``, alpha = 0.1, beta = 0.3, reset per test set since
  ``--is_rep_history_reused`` is False). Adam, lr 10 x round lr = 0.1, ``--THE_steps`` = 20 steps, stopping early
  when the gradient norm (over the batch's weights) falls below 1e-5; encoder and heads are frozen.
* **FedTHE+** (``THE_worker.py`` ``_test_time_tune``, ``THE_FT``): after THE, per test sample, 3 SGD steps (lr
  5e-4, no momentum) on the whole model and the personalised head minimising the marginal entropy (MEMO) of the
  ensemble (``e`` fixed) over 16 augmented views, predict that sample, then restore the weights.

Departures from the code: (1) the model average keeps this repo's data-size weights (eq. 4) and so does ``h_g``
(the code averages both uniformly; identical for equal client sizes); (2) features are taken in eval mode (matters
only for BatchNorm archs) and the personalised head's SGD uses ``TrainConfig``'s lr, momentum and weight decay like
the other baselines here (the CNN example runs lr 0.01, momentum 0); (3) after the last round every client
personalises once more on the final global model, and ``h_l``/``h_g`` come from its features (the code runs THE in
round ``R`` with the model received then, i.e. after ``R - 1`` averages, and an ``h_g`` from the round before);
(4) the test-feature EMA runs over every sample (the code's per-batch loop restarts from the last history value and
skips each later batch's first sample); (5) THE's Adam lr is fixed at 0.1 (the code: 10 x the training lr, 0.01 in
its runs) so it does not follow ``TrainConfig.lr``; (6) FedTHE+'s views are FedICON's colour-jitter + crop views
(``TrainConfig.views``), not MEMO's AugMix; (7) the global head keeps the repo CNN's bias (the code's
``--w_fc_bias`` defaults to False). The FedTHE paper's method section was not at hand: where the paper and the code
might differ, the code (the authors' own runs) is what is followed; the FedICON paper (App. A.3) instead rebuilt
FedTHE from the paper, believing no code was public.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from ..rng import derive_seed, torch_generator
from ..tta.augment import AugmentSpec, augment
from .data import ClientData
from .training import TrainConfig, aggregation_weights, federated_train, features, local_update


@dataclass(frozen=True)
class FedTHEConfig:
    """FedTHE settings (defaults: the authors' code, see the module docstring)."""

    personal_epochs: int = 1     # --n_personalized_epochs
    steps: int = 20              # --THE_steps
    lr: float = 0.1              # Adam, 10 x the round lr 0.01
    init: float = 0.5            # initial e (equal logits)
    alpha: float = 0.1           # test-feature EMA
    beta: float = 0.3            # z~ = beta z + (1 - beta) hist
    grad_tol: float = 1e-5       # stop when ||grad|| < grad_tol
    plus_steps: int = 3          # FedTHE+ per-sample steps
    plus_lr: float = 5e-4
    plus_views: int = 16

    def __post_init__(self) -> None:
        for name in ("personal_epochs", "steps", "plus_steps", "grad_tol"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("lr", "plus_lr", "plus_views"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        for name in ("init", "alpha"):
            if not 0 < getattr(self, name) < 1:
                raise ValueError(f"{name} must lie in (0, 1), got {getattr(self, name)}")
        if not 0 <= self.beta <= 1:
            raise ValueError(f"beta must lie in [0, 1], got {self.beta}")


class TwoHeadModel(nn.Module):
    """The FL model ``body`` (encoder + global head ``fc``), a client's personalised head, and the mean training
    features ``local_rep`` (h_l) and ``global_rep`` (h_g). ``forward`` is the equal-weight ensemble of the logits."""

    def __init__(self, body: nn.Module, personal: nn.Linear, local_rep: torch.Tensor,
                 global_rep: torch.Tensor) -> None:
        super().__init__()
        self.body, self.personal = body, personal
        self.register_buffer("local_rep", local_rep.detach().clone())
        self.register_buffer("global_rep", global_rep.detach().clone())

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.body.forward_features(x)

    def heads(self, z: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """(global head logits, personalised head logits) of features ``z``."""
        return self.body.fc(z), self.personal(z)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g, p = self.heads(self.forward_features(x))
        return 0.5 * (g + p)


def _head_ce(head: nn.Module, f: torch.Tensor, y: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    return F.cross_entropy(head(f), y)


def fedthe_train(clients: Sequence[ClientData], arch: str, cfg: TrainConfig, the: FedTHEConfig,
                 seed: int) -> List[TwoHeadModel]:
    """FedTHE's training: FedAvg of the whole model under the balanced softmax, each client's personalised head
    trained for ``the.personal_epochs`` on the received model's frozen features before every local update and once
    more on the final model; returns one ``TwoHeadModel`` per client."""
    heads: Dict[int, nn.Linear] = {}

    def personalise(r: int, i: int, model: nn.Module) -> None:
        if i not in heads:  # created on first use, like the code's worker; nn.Linear draws its init globally
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(derive_seed(seed, "fedthe-personal-init", i))
                heads[i] = nn.Linear(model.fc.in_features, model.fc.out_features, bias=False)
        if the.personal_epochs:
            local_update(heads[i], features(model, clients[i].x_train), clients[i].y_train, the.personal_epochs,
                         cfg, torch_generator(seed, "fedthe-personal", r, i), _head_ce, lr=cfg.lr)

    models = federated_train(clients, arch, "bsm", cfg, seed, share="all", tag="the", before_local=personalise)
    for i, m in enumerate(models):
        personalise(cfg.rounds, i, m)
    local_reps = [features(m, c.x_train).mean(0) for m, c in zip(models, clients)]
    weights = aggregation_weights([len(c) for c in clients])
    global_rep = (weights.view(-1, 1) * torch.stack(local_reps).double()).sum(0).float()
    return [TwoHeadModel(m, heads[i], rep, global_rep).eval() for i, (m, rep) in enumerate(zip(models, local_reps))]


def feature_history(z: torch.Tensor, alpha: float, previous: Optional[torch.Tensor] = None) -> torch.Tensor:
    """EMA of the test features along the stream, ``hist_n = alpha z_n + (1 - alpha) hist_{n-1}``, starting from
    ``previous`` (the last value of the previous batch) or, for the first batch, from ``z_0``; one row per sample."""
    h = z[0] if previous is None else previous
    rows = []
    for zn in z:
        h = alpha * zn + (1 - alpha) * h
        rows.append(h)
    return torch.stack(rows)


def ensemble_weights(g: torch.Tensor, p: torch.Tensor, z_mix: torch.Tensor, local_rep: torch.Tensor,
                     global_rep: torch.Tensor, the: FedTHEConfig) -> torch.Tensor:
    """THE: per-sample weights ``e`` [B] in [0, 1] of the global head (logits ``g``) against the personalised head
    (``p``), minimising ``s H(e g + (1-e) p) + (1-s)(e ||z_mix - h_g|| + (1-e) ||z_mix - h_l||)`` (batch mean)."""
    g, p, z_mix = g.detach(), p.detach(), z_mix.detach()
    sim = F.cosine_similarity(g.softmax(1), p.softmax(1), dim=1, eps=1e-6)
    fa = torch.stack([(z_mix - global_rep).norm(dim=1), (z_mix - local_rep).norm(dim=1)], dim=1)
    logits = torch.tensor([math.log(the.init), math.log(1 - the.init)], dtype=g.dtype, device=g.device)
    logits = logits.repeat(len(g), 1)
    logits.requires_grad_(True)
    opt = torch.optim.Adam([logits], lr=the.lr)
    for _ in range(the.steps):
        e = logits.softmax(1)
        agg = e[:, :1] * g + e[:, 1:] * p
        entropy = -(agg.softmax(1) * agg.log_softmax(1)).sum(1)
        loss = (sim * entropy + (1 - sim) * (e * fa).sum(1)).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if float(logits.grad.norm()) < the.grad_tol:
            break
        opt.step()
    return logits.detach().softmax(1)[:, 0]


def marginal_entropy(logits: torch.Tensor) -> torch.Tensor:
    """MEMO's entropy of the mean softmax over the views (rows) of one image."""
    log_mean = torch.logsumexp(logits.log_softmax(1), dim=0) - math.log(len(logits))
    return -(log_mean.exp() * log_mean).sum()


def _plus_logits(model: TwoHeadModel, x: torch.Tensor, e: torch.Tensor, the: FedTHEConfig, views: AugmentSpec,
                 gen: torch.Generator) -> Tuple[torch.Tensor, torch.Tensor]:
    """FedTHE+: each image's (global, personal) logits after ``plus_steps`` of marginal-entropy SGD on a copy of
    the whole two-head model (restored after every image)."""
    tuned = copy.deepcopy(model).eval()
    start = copy.deepcopy(tuned.state_dict())
    params = [q for q in tuned.parameters()]
    for q in params:
        q.requires_grad_(True)
    opt = torch.optim.SGD(params, lr=the.plus_lr)
    gs, ps = [], []
    for i in range(len(x)):
        for _ in range(the.plus_steps):
            batch = augment(x[i].expand(the.plus_views, *x.shape[1:])[None], gen, views, share="image")[0]
            g, p = tuned.heads(tuned.forward_features(batch))
            loss = marginal_entropy(e[i] * g + (1 - e[i]) * p)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        with torch.no_grad():
            g, p = tuned.heads(tuned.forward_features(x[i:i + 1]))
        gs.append(g)
        ps.append(p)
        tuned.load_state_dict(start)
    return torch.cat(gs), torch.cat(ps)


def the_predict(model: TwoHeadModel, x: torch.Tensor, the: FedTHEConfig, batch_size: int,
                plus_views: Optional[AugmentSpec] = None,
                gen: Optional[torch.Generator] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """(predictions, ensemble weights e) of FedTHE over the test stream ``x`` in batches of ``batch_size``; with
    ``plus_views`` (and ``gen`` for the views) it is FedTHE+. ``model`` is left unchanged."""
    if plus_views is not None and gen is None:
        raise ValueError("FedTHE+ (plus_views) needs a generator for its augmented views")
    model.eval()
    preds, weights, last = [], [], None
    for s in range(0, len(x), batch_size):
        xb = x[s:s + batch_size]
        with torch.no_grad():
            z = model.forward_features(xb)
            g, p = model.heads(z)
            hist = feature_history(z, the.alpha, last)
        last = hist[-1]
        e = ensemble_weights(g, p, the.beta * z + (1 - the.beta) * hist, model.local_rep, model.global_rep, the)
        if plus_views is not None:
            g, p = _plus_logits(model, xb, e, the, plus_views, gen)
        preds.append((e[:, None] * g + (1 - e[:, None]) * p).argmax(1))
        weights.append(e)
    return torch.cat(preds), torch.cat(weights)


__all__ = ["FedTHEConfig", "TwoHeadModel", "fedthe_train", "feature_history", "ensemble_weights", "marginal_entropy",
           "the_predict"]
