"""FedCTTA (Rajib et al.): similarity-aware aggregation from the clients' outputs on probe inputs.

The rule, at every aggregation step t (every ``interval``-th step: ``(t + 1) % interval == 0``):

1. Probes: M inputs shaped like the clients' images. Default: uniform [0, 1) noise, M = 64, drawn from
   ``torch_generator(seed, "fedctta-probes", t)`` and shared by all clients (``probes="shared"``, the paper's
   "a set of noise data points ... used as a reference dataset"); ``probes="per_client"`` draws client i's set from
   ``torch_generator(seed, "fedctta-probes", t, i)`` (the reference code draws fresh noise per client per step);
   ``probe_images`` replaces the noise by a fixed tensor of clean images [M, C, H, W] (paper Table IV).
2. Client statistic (the upload, K floats for logits): ``o_i = 1/M sum_m f_{theta_i}(z_m)``, the mean logits
   (``on="logits"``, paper Eq. 6) or mean penultimate features (``on="features"``, Table IV) of client i's adapted
   model, computed before mixing. BatchNorm on the probes (``probe_bn``):
     - "client" (default): the statistics the client normalised its real batch with at this step (the bank's
       ``bn_stats()`` = those of the adapting forward), installed with ``set_bn_stats`` and used in "given" mode.
       This is "eval mode = the model's own statistics": for TTA-bn it compares the clients' adapted statistics,
       for TTA-grad the clients' current (post-step) parameters under their real-batch statistics. Local methods
       with source BN (``bn_mode == "source"``) use the source statistics.
     - "probes": normalise the probes with their own batch statistics (no reference client does this; with TTA-bn
       every client then has the same function on the probes, so W is uniform = FedAvg for shared probes).
     - "eval": as the reference clients (rajibrhasan/FedCTTA, ``model.eval()`` on the probes): TTA-grad clients
       with ``bn='running'`` normalise with their running statistics, TTA-bn clients with the statistics of the
       previous aggregation (the source statistics before the first); ``LocalMethod.eval_forward``.
3. Optional EMA (``ema=alpha``, 0.9 in the reference code): ``s_i <- alpha s_i + (1 - alpha) o_i`` over
   aggregation steps, ``s_i = o_i`` at a client's first accepted upload; ``ema=None`` (paper) uses ``s_i = o_i``.
4. Similarity ``S_ij`` (``distance``): "euclidean" ``-||s_i - s_j||_2`` (paper Eq. 5, default); "kl"
   ``-KL(p_i || p_j)`` and "cross_entropy" ``sum_k p_i(k) log p_j(k)`` with ``p = softmax(s)`` (logits only);
   "cosine" ``cos(s_i, s_j)``; "cosine_exp" ``exp(cos(s_i, s_j))`` and "kl_exp" ``exp(-KL(p_i || p_j))`` are the
   reference code's forms (its W = softmax(exp(cos)), softmax(exp(-KL))). Note: cross entropy = H(p_i) + KL(p_i || p_j), and H(p_i) is constant along row i,
   so after the row softmax "cross_entropy" and "kl" give the same W (Table IV: 61.60 vs 61.62).
5. ``W_i. = softmax_j(S_ij / temperature)`` over accepted clients j (paper Eq. 7: temperature 1); ``scale=
   "row_median"`` first divides each row of euclidean distances by its median (default "none": the paper; the rule
   for choosing T and scale is pFedBBN's, ``strategies.pfedbbn``: largest same-domain weight share on a held-out
   stream, stated before accuracy is looked at). A rejected
   client (non-finite upload) gets no weight and keeps its own model. Between aggregation steps W = I and the
   clients compute and upload no probe statistic.

No server training; server memory is the EMA state [N, K] (+ a flag [N]) when ``ema`` is set, else nothing.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Dict, Optional, Tuple

import torch

from ..engine.bank import ClientBank, ForwardOutput
from ..rng import torch_generator
from .base import (DISTANCE_SCALES, ClientHooks, ServerInputs, Strategy, cosine_from_gram, distance_from_gram,
                   gram_matrix, is_bn_stats, masked_row_softmax, scale_distances)
from ..validation import check_choice

if TYPE_CHECKING:
    from ..tta.base import LocalMethod

PROBE_UPLOAD = "probe_mean"  # the client's probe statistic [N, K] (logits) or [N, D] (features)
DISTANCES = ("euclidean", "kl", "cross_entropy", "cosine", "cosine_exp", "kl_exp")
STATISTICS = ("logits", "features")
PROBE_SETS = ("shared", "per_client")
PROBE_BN = ("client", "probes", "eval")


def similarity_matrix(stats: torch.Tensor, distance: str = "euclidean") -> torch.Tensor:
    """Similarities S [N, N] (float64) between the rows of ``stats`` [N, K]; larger = more similar.

    euclidean: ``-||s_i - s_j||``; kl: ``-KL(softmax s_i || softmax s_j)``; cross_entropy:
    ``sum_k softmax(s_i)_k log softmax(s_j)_k``; cosine: ``cos(s_i, s_j)`` (0 against a zero vector).
    """
    s = stats.detach().double().cpu()
    if distance.endswith("_exp"):  # the reference code's exp(cos) and exp(-KL)
        return similarity_matrix(s, distance[:-4]).exp()
    if distance in ("euclidean", "cosine"):
        gram = gram_matrix([s])
        return -distance_from_gram(gram) if distance == "euclidean" else cosine_from_gram(gram)
    if distance in ("kl", "cross_entropy"):
        logp = torch.log_softmax(s, dim=1)
        cross = logp.exp() @ logp.T  # sum_k p_i(k) log p_j(k) = -CE(p_i, p_j)
        if distance == "cross_entropy":
            return cross
        kl = cross.diagonal()[:, None] - cross  # KL(p_i || p_j) = CE(p_i, p_j) - H(p_i)
        kl.fill_diagonal_(0)
        return -kl.clamp_min(0)
    raise ValueError(f"distance must be one of {DISTANCES}, got {distance!r}")


def similarity_weights(stats: torch.Tensor, valid: torch.Tensor, distance: str = "euclidean",
                       temperature: float = 1.0, scale: str = "none") -> torch.Tensor:
    """W [N, N] (float64): row softmax of ``similarity / temperature`` over valid columns; rejected rows = identity.
    ``scale`` "row_median" divides a euclidean distance row by its median (``strategies.base.scale_distances``)."""
    n = stats.shape[0]
    valid = valid.detach().cpu().bool()
    clean = torch.where(valid[:, None], stats.detach().double().cpu(), torch.zeros((), dtype=torch.float64))
    similarity = similarity_matrix(clean, distance)
    if scale != "none":
        if distance != "euclidean":
            raise ValueError(f"scale {scale!r} rescales distances: it needs distance='euclidean'")
        similarity = -scale_distances(-similarity, valid, scale)
    scores = similarity / temperature
    w = masked_row_softmax(scores, valid[None, :].expand(n, n))
    return torch.where(valid[:, None], w, torch.eye(n, dtype=w.dtype))


class FedCTTA(ClientHooks, Strategy):
    """FedCTTA: ``W = row_softmax(-||s_i - s_j|| / T)`` from each client's mean output on probe inputs.

    Parameters (defaults = the paper): ``n_probes`` M (64), ``probes`` "shared" | "per_client", ``probe_images``
    (a fixed [M, C, H, W] tensor instead of noise; shared), ``on`` "logits" | "features", ``distance`` "euclidean" |
    "kl" | "cross_entropy" | "cosine", ``temperature`` (1), ``ema`` (None; the reference code uses 0.9),
    ``interval`` (aggregate every k-th step, W = I in between), ``probe_bn`` "client" | "probes" | "eval", ``seed`` (of the
    probe draws). See the module docstring for the exact rule.
    """

    name = "fedctta"
    needs = (PROBE_UPLOAD,)
    # probes shared by all clients run through ``ClientBank.forward_shared`` (the layers before the first
    # client-dependent one once, not N times); False: the reference pass over N copies (tests/test_speed_levers.py)
    _shared_pass = True

    def __init__(self, n_probes: int = 64, probes: str = "shared", on: str = "logits", distance: str = "euclidean",
                 temperature: float = 1.0, ema: Optional[float] = None, interval: int = 1, probe_bn: str = "client",
                 probe_images: Optional[torch.Tensor] = None, seed: int = 0, scale: str = "none") -> None:
        if int(n_probes) != n_probes or n_probes < 1:
            raise ValueError(f"n_probes must be a positive integer, got {n_probes}")
        check_choice("probes", probes, PROBE_SETS)
        check_choice("on", on, STATISTICS)
        check_choice("distance", distance, DISTANCES)
        if distance in ("kl", "cross_entropy", "kl_exp") and on != "logits":
            raise ValueError(f"distance {distance!r} compares class distributions: it needs on='logits'")
        if not temperature > 0:
            raise ValueError(f"temperature must be positive, got {temperature}")
        if ema is not None and not 0.0 <= ema < 1.0:
            raise ValueError(f"ema must be None or in [0, 1), got {ema}")
        if int(interval) != interval or interval < 1:
            raise ValueError(f"interval must be a positive integer, got {interval}")
        check_choice("probe_bn", probe_bn, PROBE_BN)
        check_choice("scale", scale, DISTANCE_SCALES)
        if scale == "count" or (scale != "none" and distance != "euclidean"):
            raise ValueError(f"scale {scale!r} needs distance='euclidean' and is 'none' or 'row_median' for fedctta")
        if probe_images is not None:
            probe_images = torch.as_tensor(probe_images).detach().clone().float()
            if probe_images.dim() != 4 or probe_images.shape[0] < 1:
                raise ValueError(f"probe_images must be [M, C, H, W] with M >= 1, got {tuple(probe_images.shape)}")
            if probes != "shared":
                raise ValueError("probe_images is one fixed set for all clients: it needs probes='shared'")
        self.n_probes, self.probes, self.on, self.distance = int(n_probes), probes, on, distance
        self.temperature, self.ema, self.interval, self.probe_bn = float(temperature), ema, int(interval), probe_bn
        self.probe_images, self.seed, self.scale = probe_images, int(seed), scale
        self._ema: Optional[torch.Tensor] = None  # [N, K] float64
        self._seen: Optional[torch.Tensor] = None  # [N] bool: client has an EMA value
        self._mixed: Optional[Dict[str, torch.Tensor]] = None  # TTA-bn statistics of the last mix (probe_bn="eval")

    # ------------------------------------------------------------------ client side

    def aggregates(self, step: int) -> bool:
        """Whether the server aggregates at ``step`` (every ``interval``-th step, counted from 1)."""
        return (step + 1) % self.interval == 0

    def probe_inputs(self, step: int, n_clients: int, shape: Tuple[int, ...]) -> torch.Tensor:
        """The probes of every client at ``step``: [N, M, *shape] float32 on the CPU (a view for shared sets)."""
        if self.probe_images is not None:
            if tuple(self.probe_images.shape[1:]) != tuple(shape):
                raise ValueError(f"probe_images have shape {tuple(self.probe_images.shape[1:])} per image, "
                                 f"the clients' inputs {tuple(shape)}")
            return self.probe_images.unsqueeze(0).expand(n_clients, *self.probe_images.shape)
        if self.probes == "shared":
            z = torch.rand((self.n_probes, *shape), generator=torch_generator(self.seed, "fedctta-probes", step))
            return z.unsqueeze(0).expand(n_clients, *z.shape)
        return torch.stack([torch.rand((self.n_probes, *shape),
                                       generator=torch_generator(self.seed, "fedctta-probes", step, i))
                            for i in range(n_clients)])

    def _forward(self, bank: ClientBank, probes: torch.Tensor, bn_mode: str) -> ForwardOutput:
        """``bank.forward(probes, bn_mode)``; one set viewed by all clients (stride 0, ``probe_inputs``' shared
        sets) goes through ``bank.forward_shared`` once."""
        if self._shared_pass and probes.shape[0] > 1 and probes.stride(0) == 0:
            return bank.forward_shared(probes[0], bn_mode)
        return bank.forward(probes, bn_mode)

    def evaluate_probes(self, bank: ClientBank, local: "LocalMethod", probes: torch.Tensor) -> ForwardOutput:
        """Every client's adapted model on its probes [N, M, C, H, W] (BatchNorm as ``probe_bn`` says)."""
        if self.probe_bn == "probes":
            return self._forward(bank, probes, "batch")
        if self.probe_bn == "eval":
            if local.shares != "bn_stats":
                return local.eval_forward(bank, probes)
            if self._mixed is None:  # before the first aggregation: the source statistics
                return self._forward(bank, probes, "source")
            bank.set_bn_stats(self._mixed)
            return self._forward(bank, probes, "given")
        if local.bn_mode == "source":
            return self._forward(bank, probes, "source")
        bank.set_bn_stats(bank.bn_stats())  # the statistics of the client's real batch at this step
        return self._forward(bank, probes, "given")

    @torch.no_grad()
    def probe_uploads(self, bank: ClientBank, local: "LocalMethod", x: torch.Tensor,
                      step: int) -> Dict[str, torch.Tensor]:
        """Each client's mean probe output [N, K] (or [N, D]) at aggregation steps; nothing in between."""
        if not self.aggregates(step):
            return {}
        probes = self.probe_inputs(step, x.shape[0], tuple(x.shape[2:]))
        if probes.stride(0) == 0:  # one set for all clients: moved once, still a view
            probes = probes[0].to(x.device, x.dtype).expand_as(probes)
        else:
            probes = probes.to(x.device, x.dtype)
        out = self.evaluate_probes(bank, local, probes)
        return {PROBE_UPLOAD: (out.logits if self.on == "logits" else out.features).mean(1)}

    def client_uploads(self, context: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        """The probe statistic when this step computed one (aggregation steps), else nothing."""
        return {k: context[k] for k in self.needs if k in context}

    # ------------------------------------------------------------------ server side

    def reset(self, n_clients: int) -> None:
        super().reset(n_clients)
        self._ema, self._seen, self._mixed = None, None, None

    def after_mix(self, mixed: Dict[str, torch.Tensor], inputs: ServerInputs) -> None:
        """Keep the mixed TTA-bn statistics: the next step's probes are normalised with them (``probe_bn='eval'``)."""
        super().after_mix(mixed, inputs)
        if self.probe_bn == "eval" and mixed and all(is_bn_stats(k, v) for k, v in mixed.items()):
            self._mixed = {k: v.detach().clone() for k, v in mixed.items()}

    def smoothed(self, stats: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """Update the EMA with the accepted clients' ``stats`` [N, K] and return it (``stats`` if ``ema`` is None)."""
        stats = stats.detach().double().cpu()
        if self.ema is None:
            return stats
        valid = valid.detach().cpu().bool()
        if self._ema is None or self._ema.shape != stats.shape:
            self._ema = torch.zeros_like(stats)
            self._seen = torch.zeros(stats.shape[0], dtype=torch.bool)
        blended = torch.where(self._seen[:, None], self.ema * self._ema + (1 - self.ema) * stats, stats)
        self._ema = torch.where(valid[:, None], blended, self._ema)
        self._seen = self._seen | valid
        return self._ema.clone()

    def collaboration(self, inputs: ServerInputs) -> torch.Tensor:
        n = inputs.valid.shape[0]
        if not self.aggregates(inputs.step):
            return torch.eye(n)
        if PROBE_UPLOAD not in inputs.uploads:
            raise KeyError(f"fedctta needs the {PROBE_UPLOAD!r} upload at step {inputs.step}: clients compute it "
                           "in Strategy.probe_uploads (the engine calls it after the local step)")
        stats = self.smoothed(inputs.uploads[PROBE_UPLOAD], inputs.valid)
        return similarity_weights(stats, inputs.valid, self.distance, self.temperature, self.scale).float()

    def state_dict(self) -> dict:
        """The EMA of the probe statistics [N, K] and which clients have one (empty without ``ema``), and the last
        mixed TTA-bn statistics (``probe_bn='eval'``)."""
        state = {} if self._ema is None else {"ema": self._ema.clone(), "seen": self._seen.clone()}
        if self._mixed is not None:
            state["mixed"] = {k: v.clone() for k, v in self._mixed.items()}
        return state

    def load_state_dict(self, state: dict) -> None:
        if "ema" in state:
            self._ema, self._seen = state["ema"].clone(), state["seen"].clone()
        else:
            self._ema, self._seen = None, None
        self._mixed = dict(state["mixed"]) if state.get("mixed") is not None else None
