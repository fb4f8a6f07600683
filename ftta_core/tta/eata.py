"""EATA (Niu et al., ICML'22): entropy minimisation on reliable, non-redundant samples with an EWC anchor.

Follows ``classification/methods/eata.py`` of mariodoebler/test-time-adaptation (constants for CIFAR-10-C from
``cfgs/cifar10_c/eata.yaml``, see ``../shared/reference/tta-methods-and-cifar-c.md`` section 2.3):

- reliable: entropy ``H < E0`` with ``E0 = e_margin * ln C`` (0.4 ln C);
- non-redundant: ``|cos(p_bar, p)| < d_margin`` (0.4) against the client's moving average ``p_bar`` of the softmax of
  the selected samples (momentum 0.9; no redundancy filter before the first average exists);
- loss: mean over the selected samples of ``exp(E0 - H) * H`` plus ``fisher_alpha * sum F (theta - theta_0)^2``
  (alpha 1.0), the Fisher ``F`` being the mean over source batches of squared gradients of the cross-entropy on
  the model's own argmax, with BN on batch statistics (``fisher_alpha=0`` is ETA).

Per-client state (moving average, Fisher, anchor) has a leading client dimension.

``select_samples`` (default True, EATA): False drops the sample selection and the re-weighting -- every sample
counts with weight 1, the loss is Tent's batch-mean entropy plus the Fisher term -- i.e. EATA's Fisher (EWC)
regulariser on its own ("Tent + Fisher anchor"; with ``fisher_alpha=0`` it is Tent exactly). The moving average
and the ``last_*`` diagnostics are then over all samples.

``skip_empty``: what a client with no selected sample does. Default False, today's behaviour: it gets a zero loss
(EWC term included) and still takes the optimiser step with the others, so plain SGD leaves it alone but Adam (and
SGD with momentum) still moves it by its moments and advances its step count. It stays the default so that the
stored runs under ``figures/`` that used EATA remain exactly valid (with it the results are bit-identical to the code
before the option existed). True is the paper's / reference's: ``EATA.forward_and_adapt`` (and the authors'
``forward_and_adapt_eata``) only calls ``loss.backward(); optimizer.step()`` when some sample is selected
(``imgs_test[ids1][ids2].size(0) != 0``), so such a client is left exactly unchanged --
parameters and optimiser state (Adam moments and step count, momentum buffers) -- while the others step (a strategy
regulariser's step is skipped with it). The bank steps all clients together (one optimiser over stacked parameters
in the vectorized bank, one per client in the loop bank), so ``ClientOptimizerRows`` snapshots every client's rows
before the step and writes the skipped clients' rows back after it. In the vectorized bank Adam's step count is one
scalar per stacked tensor, so once clients have skipped different numbers of steps their counts differ: EATA keeps
them (``client_steps``, part of its state with this option) and re-runs the optimiser step, from the same
gradients, once per distinct count, which gives each client exactly the update of its own optimiser in the loop
bank. Our default agrees with the reference within 0.2 points of mean error on the one continual CIFAR-10-C stream
compared (batch 200); small client batches make empty selections, hence skipped steps, more likely.
"""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F

from ..engine.bank import ClientBank, ForwardOutput, LoopBank, LossFn, VectorizedBank
from ..rng import numpy_generator
from ..training import SOURCE_MODELS
from ..validation import check_choice
from .base import combine
from .basic import entropy
from .client_params import AnchoredMethod, Params, param_grads


def eata_selection(logits: torch.Tensor, probs: Optional[torch.Tensor], has_probs: Optional[torch.Tensor],
                   e0: float, d_margin: float) -> Tuple[torch.Tensor, torch.Tensor]:
    """Masks [n,B] of reliable samples (``H < e0``) and of selected ones (reliable and ``|cos| < d_margin``).

    ``probs`` [n,K] is each client's moving average of the softmax; clients with ``has_probs`` False (or
    ``probs`` None) have no average yet and skip the redundancy filter.
    """
    reliable = entropy(logits) < e0
    if probs is None:
        return reliable, reliable
    cos = F.cosine_similarity(probs[:, None, :], logits.softmax(-1), dim=-1)
    fresh = cos.abs() < d_margin
    return reliable, reliable & (fresh | ~has_probs[:, None])


def sample_weights(ent: torch.Tensor, e0: float) -> torch.Tensor:
    """EATA's re-weighting ``1 / exp(H - E0)`` (detached)."""
    return torch.exp(e0 - ent.detach())


def update_moving_probs(probs: torch.Tensor, has_probs: torch.Tensor, softmax: torch.Tensor, selected: torch.Tensor,
                        momentum: float) -> Tuple[torch.Tensor, torch.Tensor]:
    """Per client: ``p_bar <- m p_bar + (1-m) mean(selected softmax)``; the first average is the plain mean.

    A client without selected samples keeps its average (and its ``has_probs`` flag).
    """
    count = selected.sum(1)
    mean = (softmax * selected[..., None]).sum(1) / count.clamp_min(1)[:, None]
    blended = torch.where(has_probs[:, None], momentum * probs + (1 - momentum) * mean, mean)
    some = count > 0
    return torch.where(some[:, None], blended, probs), has_probs | some


def ewc_penalty(params: Params, anchor: Params, fisher: Params, clients: slice) -> torch.Tensor:
    """Per-client ``sum_k F_k (theta_k - theta0_k)^2`` [n] for the clients selected by ``clients``."""
    terms = [(fisher[k][clients] * (p - anchor[k][clients]) ** 2).flatten(1).sum(1) for k, p in params.items()]
    return torch.stack(terms).sum(0)


def source_images_cache(source_model: str, samples: int, seed: int) -> Path:
    """Where ``load_source_images`` keeps the images it drew (under ``data.cache_dir()``)."""
    from ..data import cache_dir

    return cache_dir() / "eata_source" / f"{source_model}_n{samples}_seed{seed}.npz"


def load_source_images(source_model: str, samples: int, seed: int) -> torch.Tensor:
    """``samples`` random training images [M,C,H,W] in [0,1] of the data the source model ``source_model`` was
    trained on (its ``SourceSpec`` dataset and loader arguments).

    The drawn images are kept, as stored (e.g. uint8), in ``source_images_cache`` and read from there next time,
    converted exactly as ``Dataset.tensors`` converts them: a machine without the training set (a lent GPU carrying
    only the test split, ``benchmarks/device_bundle.py``) computes the same Fisher from the cached draw."""
    from ..data import load_dataset

    path = source_images_cache(source_model, samples, seed)
    if path.is_file():
        with np.load(path) as cached:
            images = cached["images"]
        return torch.from_numpy(np.ascontiguousarray(images)).permute(0, 3, 1, 2).float().div_(255.0).contiguous()
    spec = SOURCE_MODELS[source_model]
    data = load_dataset(spec.dataset, "train", **spec.dataset_kwargs)
    idx = numpy_generator(seed, "eata-fisher", source_model).choice(len(data), min(samples, len(data)), replace=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp.npz")  # several workers may draw the same images at once
    np.savez(tmp, images=np.asarray(data.images[idx]), indices=idx, dataset=spec.dataset, total=len(data))
    tmp.replace(path)
    return data.tensors(idx)[0]


def fisher_information(bank: ClientBank, images: torch.Tensor, batch_size: int) -> Params:
    """Diagonal Fisher [N, ...] of the bank's trainable parameters: mean over batches of images [M,C,H,W] of the
    squared gradient of the batch-mean cross-entropy on the model's own argmax (BN on batch statistics)."""
    n = bank.n_clients
    total: Dict[str, torch.Tensor] = {}
    batches = 0
    for start in range(0, len(images), batch_size):
        xb = images[start:start + batch_size]
        xb = xb.unsqueeze(0).expand(n, *xb.shape)

        def loss_of(p: Params, xb: torch.Tensor = xb) -> torch.Tensor:
            logits = bank.forward(xb, "batch", params=p).logits
            target = logits.argmax(-1).detach()
            ce = F.cross_entropy(logits.flatten(0, 1), target.flatten(), reduction="none")
            return ce.view(target.shape).mean(1)

        for k, g in param_grads(bank, loss_of).items():
            total[k] = total[k] + g ** 2 if k in total else g ** 2
        batches += 1
    return {k: v / batches for k, v in total.items()}


def _opt_params(opt: torch.optim.Optimizer) -> List[torch.Tensor]:
    return [p for group in opt.param_groups for p in group["params"]]


def _state_copy(opt: torch.optim.Optimizer, p: torch.Tensor) -> Dict[str, torch.Tensor]:
    return {k: v.clone() if torch.is_tensor(v) else v for k, v in opt.state[p].items()} if p in opt.state else {}


class ClientOptimizerRows:
    """Every client's trainable parameters and optimiser state, saved before a step of ``bank.adapt``, so that the
    step can be undone for some clients (EATA's ``skip_empty``).

    ``LoopBank``: client i's parameters and its own optimiser's state. ``VectorizedBank``: row i of the stacked
    parameters and of every optimiser state tensor shaped like them (Adam moments, momentum buffers); Adam's
    ``step`` is one scalar per stacked tensor, so the clients' own step counts are passed in (``client_steps`` [N],
    what each client's own optimiser would hold), the most common one is used by ``bank.adapt``, and ``finish`` re-runs
    the step once per other count among the stepping clients (from the gradients ``bank.adapt`` left on the
    parameters) and keeps each client's rows from the run with its own count.
    A state created by the step (the first one) is restored as zeros, which torch's Adam and SGD (dampening 0) treat
    exactly as a fresh state.
    """

    def __init__(self, bank: ClientBank, client_steps: torch.Tensor) -> None:
        if isinstance(bank, LoopBank):
            self.optimizers = list(bank.optimizers)
        elif isinstance(bank, VectorizedBank):
            self.optimizers = [] if bank.optimizer is None else [bank.optimizer]
        else:
            raise TypeError(f"skip_empty works with LoopBank and VectorizedBank, got {type(bank).__name__}")
        if not self.optimizers:
            raise RuntimeError("skip_empty needs trainable parameters and an optimizer")
        self.loop = isinstance(bank, LoopBank)
        self.saved = [[(p.detach().clone(), _state_copy(opt, p)) for p in _opt_params(opt)] for opt in self.optimizers]
        self.steps = client_steps.clone()
        if not self.loop:
            opt = self.optimizers[0]
            if not any(len(opt.state.get(p, {})) for p in _opt_params(opt)):
                self.steps.zero_()  # a fresh (or reset) optimiser: every client is at step 0
            self.shared = int(torch.mode(self.steps).values) if len(self.steps) else 0
            for p in _opt_params(opt):  # step the most common count in one go
                if "step" in opt.state.get(p, {}):
                    opt.state[p]["step"].fill_(self.shared)
        else:
            for i, opt in enumerate(self.optimizers):
                if not any(len(opt.state.get(p, {})) for p in _opt_params(opt)):
                    self.steps[i] = 0

    def finish(self, stepped: torch.Tensor) -> torch.Tensor:
        """After ``bank.adapt``: keep the step of the clients ``stepped`` [N] (bool), restore the others exactly.
        Returns the clients' optimiser step counts after the step (zeros for an optimiser without one, e.g. SGD)."""
        stepped = stepped.cpu()
        counted = any("step" in opt.state.get(p, {}) for opt in self.optimizers for p in _opt_params(opt))
        after = self.steps + stepped.to(self.steps.dtype) if counted else torch.zeros_like(self.steps)
        if self.loop:
            for i, opt in enumerate(self.optimizers):
                if not bool(stepped[i]):
                    self._restore(opt, self.saved[i], None)
            return after
        opt, saved = self.optimizers[0], self.saved[0]
        others = sorted({int(t) for t in self.steps[stepped]} - {self.shared}) if counted else []
        if others:  # clients whose own step count differs from the one just used: step them again from the snapshot
            final = [(p.detach().clone(), _state_copy(opt, p)) for p in _opt_params(opt)]
            for t in others:
                self._restore(opt, saved, None)
                for p in _opt_params(opt):
                    if p.grad is None:
                        raise RuntimeError("skip_empty: the bank's step left no gradient to step again with")
                    opt.state[p]["step"].fill_(t)
                opt.step()
                self._keep_rows(opt, final, stepped & (self.steps == t))
            self._restore(opt, final, None)
        self._restore(opt, saved, ~stepped)
        for p in _opt_params(opt):  # the scalar is set again before the next step; keep the largest count meanwhile
            if "step" in opt.state.get(p, {}):
                opt.state[p]["step"].fill_(int(after.max()))
        return after

    @staticmethod
    def _keep_rows(opt: torch.optim.Optimizer, into: list, rows: torch.Tensor) -> None:
        """Copy rows ``rows`` [N] of the current parameters and per-client state tensors into the snapshot ``into``."""
        with torch.no_grad():
            for p, (value, state) in zip(_opt_params(opt), into):
                value[rows.to(value.device)] = p.detach()[rows.to(p.device)]
                for k, v in opt.state.get(p, {}).items():
                    if k != "step" and torch.is_tensor(v):
                        state[k][rows.to(v.device)] = v[rows.to(v.device)]

    @staticmethod
    def _restore(opt: torch.optim.Optimizer, saved: list, rows: Optional[torch.Tensor]) -> None:
        """Write the snapshot back: everything (``rows`` None) or the client rows ``rows`` [N] of stacked tensors."""
        with torch.no_grad():
            for p, (value, state) in zip(_opt_params(opt), saved):
                live = opt.state.get(p, {})
                if rows is None:
                    p.copy_(value)
                    if state:
                        for k, v in state.items():
                            if torch.is_tensor(v) and torch.is_tensor(live.get(k)):
                                live[k].copy_(v)
                            else:
                                live[k] = v.clone() if torch.is_tensor(v) else v
                    else:
                        opt.state.pop(p, None)
                    continue
                r = rows.to(p.device)
                p[r] = value[r]
                for k, v in live.items():
                    if k == "step" or not torch.is_tensor(v):
                        continue
                    if v.shape != p.shape:
                        raise NotImplementedError(f"skip_empty: optimiser state {k!r} is not per client")
                    v[r] = state[k][r] if k in state else 0


class EATA(AnchoredMethod):
    """EATA: entropy-filtered, redundancy-filtered, re-weighted entropy minimisation with a Fisher (EWC) anchor.

    ``fisher_source`` names a source model of ``training.SOURCE_MODELS``: the Fisher is computed on the bank's
    first ``adapt`` from ``fisher_samples`` random images of its training set, in batches of ``fisher_batch``.
    ``skip_empty`` (default False): True skips the step of a client with no selected sample, as the paper (see the
    module docstring). ``select_samples=False``: no selection or re-weighting, the Fisher regulariser on its own.
    ``bn`` 'batch' (EATA) or 'running' (Tent's option: the reference clients' running statistics, adapted in
    training forwards and used for prediction, kept in ``state_dict``).
    """

    name = "eata"
    state_names = ("source", "probs", "has_probs", "fisher")

    def __init__(self, params: str = "bn_affine", optimizer: str = "adam", lr: float = 1e-3, momentum: float = 0.0,
                 weight_decay: float = 0.0, steps: int = 1, e_margin: float = 0.4, d_margin: float = 0.4,
                 probs_momentum: float = 0.9, fisher_alpha: float = 1.0, fisher_source: Optional[str] = None,
                 fisher_samples: int = 500, fisher_batch: int = 200, skip_empty: bool = False, seed: int = 0,
                 select_samples: bool = True, bn: str = "batch", bn_momentum: float = 0.1) -> None:
        super().__init__(seed=seed, params=params, optimizer=optimizer, lr=lr, momentum=momentum,
                         weight_decay=weight_decay, steps=steps, bn=bn, bn_momentum=bn_momentum)
        if not e_margin > 0:
            raise ValueError(f"e_margin (E0 / ln C) must be positive, got {e_margin}")
        if not d_margin > 0:
            raise ValueError(f"d_margin must be positive, got {d_margin}")
        if not 0 <= probs_momentum < 1:
            raise ValueError(f"probs_momentum must be in [0, 1), got {probs_momentum}")
        if fisher_alpha < 0:
            raise ValueError(f"fisher_alpha must be >= 0, got {fisher_alpha}")
        if fisher_samples < 1 or fisher_batch < 1:
            raise ValueError(f"fisher_samples and fisher_batch must be >= 1, got {fisher_samples}, {fisher_batch}")
        if fisher_alpha > 0 and fisher_source is None:
            raise ValueError("fisher_source: EATA's Fisher regulariser (fisher_alpha > 0) needs source images; name "
                             f"the source model whose training set gives them ({sorted(SOURCE_MODELS)}), or set "
                             "fisher_alpha=0 (ETA)")
        if fisher_source is not None:
            check_choice("fisher_source", fisher_source, sorted(SOURCE_MODELS))
        self.e_margin, self.d_margin, self.probs_momentum = e_margin, d_margin, probs_momentum
        self.fisher_alpha, self.fisher_source = fisher_alpha, fisher_source
        self.fisher_samples, self.fisher_batch = fisher_samples, fisher_batch
        self.skip_empty = bool(skip_empty)
        self.select_samples = bool(select_samples)
        if self.skip_empty:  # only then part of the state: checkpoints of default runs keep their keys
            self.state_names = EATA.state_names + ("client_steps",)
        self.client_steps: Optional[torch.Tensor] = None  # [N] each client's optimiser step count (skip_empty)
        self._count: Optional[torch.Tensor] = None  # selected samples per client of the last loss call
        self.probs: Optional[torch.Tensor] = None
        self.has_probs: Optional[torch.Tensor] = None
        self.fisher: Optional[Params] = None
        self.last_reliable: Optional[torch.Tensor] = None  # [N] counts of the last step (diagnostics)
        self.last_selected: Optional[torch.Tensor] = None

    def initialize(self, bank: ClientBank, x: torch.Tensor) -> None:
        if self.fisher_alpha > 0:
            images = load_source_images(self.fisher_source, self.fisher_samples, self.seed).to(x.device, x.dtype)
            self.fisher = fisher_information(bank, images, self.fisher_batch)

    def e0(self, n_classes: int) -> float:
        """The entropy margin ``E0 = e_margin * ln C``."""
        return self.e_margin * math.log(n_classes)

    def _select(self, logits: torch.Tensor, clients: slice) -> Tuple[torch.Tensor, torch.Tensor]:
        probs = None if self.probs is None else self.probs[clients]
        has = None if self.has_probs is None else self.has_probs[clients]
        reliable, selected = eata_selection(logits.detach(), probs, has, self.e0(logits.shape[-1]), self.d_margin)
        return (reliable, selected) if self.select_samples else (torch.ones_like(reliable), torch.ones_like(selected))

    def loss(self, out: ForwardOutput, params: Dict[str, torch.Tensor], x: torch.Tensor, clients: slice) -> torch.Tensor:
        ent = entropy(out.logits)
        _, selected = self._select(out.logits, clients)
        count = selected.sum(1)
        self._count = count.detach()
        weights = sample_weights(ent, self.e0(out.logits.shape[-1])) if self.select_samples else 1.0
        loss = (ent * weights * selected).sum(1) / count.clamp_min(1)
        if self.fisher is not None:
            loss = loss + self.fisher_alpha * ewc_penalty(params, self.source, self.fisher, clients)
        return torch.where(count > 0, loss, loss * 0)

    def adapt(self, bank: ClientBank, x: torch.Tensor, regularizer: Optional[LossFn] = None) -> ForwardOutput:
        self.prepare(bank, x)
        out = self._adapt_skipping(bank, x, regularizer) if self.skip_empty else super().adapt(bank, x, regularizer)
        reliable, selected = self._select(out.logits, slice(None))
        if self.probs is None:
            self.probs = torch.zeros(out.logits.shape[0], out.logits.shape[-1], device=out.logits.device,
                                     dtype=out.logits.dtype)
            self.has_probs = torch.zeros(out.logits.shape[0], dtype=torch.bool, device=out.logits.device)
        self.probs, self.has_probs = update_moving_probs(self.probs, self.has_probs, out.logits.softmax(-1), selected,
                                                         self.probs_momentum)
        self.last_reliable, self.last_selected = reliable.sum(1), selected.sum(1)
        self.step += 1
        return out

    def _adapt_skipping(self, bank: ClientBank, x: torch.Tensor, regularizer: Optional[LossFn]) -> ForwardOutput:
        """``GradientMethod.adapt`` where each step leaves the clients without a selected sample exactly unchanged."""
        loss = combine(self.loss, regularizer)
        with self.training(bank):
            first = self._step_skipping(bank, x, loss)
            for _ in range(self.steps - 1):
                self._step_skipping(bank, x, loss)
        return first

    def _step_skipping(self, bank: ClientBank, x: torch.Tensor, loss: LossFn) -> ForwardOutput:
        n = bank.n_clients
        if self.client_steps is None:
            self.client_steps = torch.zeros(n, dtype=torch.long)
        counts = torch.zeros(n, dtype=torch.long)

        def counting(out: ForwardOutput, params: Dict[str, torch.Tensor], x: torch.Tensor,
                     clients: slice) -> torch.Tensor:
            value = loss(out, params, x, clients)
            counts[clients] = self._count.cpu()
            return value

        rows = ClientOptimizerRows(bank, self.client_steps.cpu())
        out = bank.adapt(x, counting, self.bn_mode)
        self.client_steps = rows.finish(counts > 0).to(x.device)
        return out
