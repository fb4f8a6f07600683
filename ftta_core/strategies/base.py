"""Server strategies: turn client uploads (and bounded server memory) into a collaboration matrix W [N, N]."""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from concurrent.futures import Future
from typing import TYPE_CHECKING, Callable, Dict, Optional, Sequence

import torch

from ..engine.bank import ClientBank, ForwardOutput, LossFn
from ..engine.average import mix_models
from ..engine.layers import is_bn_stats  # noqa: F401  (a helper of the strategies; the layout is the bank's)
from ..engine.robust import RobustMixing

if TYPE_CHECKING:  # only for annotations: the engine passes its local method to ``probe_uploads``
    from ..tta.base import LocalMethod

# Upload kinds the engine can produce for a strategy, beyond the mixed state:
#   indicator     batch mean of the *source* model's penultimate features [N, D] (FedTSA)
#   feature_mean  batch mean of the adapted model's penultimate features [N, D]
#   logits_mean   batch mean of the adapted model's logits [N, K]
# A strategy can add kinds of its own that need the client models (``Strategy.probe_uploads``, e.g. FedCTTA).
UPLOAD_KINDS = ("indicator", "feature_mean", "logits_mean")


@dataclass
class ServerInputs:
    """What the server sees at one step: the shared state and uploads [N, ...], and which clients passed checks."""

    step: int
    state: Dict[str, torch.Tensor]
    uploads: Dict[str, torch.Tensor]
    valid: torch.Tensor
    sizes: Optional[torch.Tensor] = None  # samples per client this step (FedAvg weights)
    extra: Dict[str, object] = field(default_factory=dict)


class InputRegularizer:
    """A client regulariser whose targets are outputs of reference models on the inputs the clients train on
    (MOON's features of the received and previous models, pFedSD's teacher logits): ``targets(x)`` computes them
    (no gradient) for inputs x [N, B, ...], ``loss(out, targets, clients)`` gives the per-client term. Built on the
    step's batch; a local method that trains on other inputs (RoTTA on its memory) calls ``on(its_inputs)``
    (``tta.base.regularizer_on``). Training on inputs of another shape than the targets' is an error, never a
    silent mismatch."""

    def __init__(self, targets: Callable[[torch.Tensor], object],
                 loss: Callable[["ForwardOutput", object, slice], torch.Tensor], x: torch.Tensor) -> None:
        self._targets_of, self._loss = targets, loss
        self.inputs_shape = tuple(x.shape)
        with torch.no_grad():
            self.targets = targets(x)

    def on(self, x: torch.Tensor) -> "InputRegularizer":
        """The same regulariser with its targets computed on ``x`` [N, B', ...]."""
        return InputRegularizer(self._targets_of, self._loss, x)

    def __call__(self, out: "ForwardOutput", params: Dict[str, torch.Tensor], x: torch.Tensor,
                 clients: slice) -> torch.Tensor:
        if tuple(x.shape[1:]) != self.inputs_shape[1:]:
            raise ValueError(f"the regulariser's targets were computed on inputs {self.inputs_shape}, the clients "
                             f"train on {tuple(x.shape)}: build it on those inputs (regularizer_on)")
        return self._loss(out, self.targets, clients)


class Strategy(ABC):
    """A server strategy: ``collaboration`` turns what the clients uploaded into W (the only method to implement).

    Optional, separate contracts, declared by also subclassing them (the engine checks with ``isinstance``):
    ``ClientHooks`` (code that runs on the clients' models: a regulariser of the local step, uploads computed with
    the adapted models) and ``Scheduled`` (rounds computed ahead of their step on server threads, FedTSA). A class
    that defines one of their methods without declaring the contract is refused when it is defined (the engine would
    not call the method)."""

    name: str = "base"
    needs: tuple = ()  # upload kinds it reads (``UPLOAD_KINDS``), picked by ``client_uploads``
    finetune_after_mix: bool = False
    # robust mixing (``engine.robust``; set by ``set_robust_mixing``, which ``build.build_strategy_for`` calls with
    # the config's ``robust_mixing``): None mixes by the weighted mean, bit for bit as without it
    robust_mixing: Optional[RobustMixing] = None
    # a class that overrides ``mix`` sets this when its ``mix`` goes through ``Strategy.mix`` or ``mean_state``
    # (so it honours ``robust_mixing``); others are refused by ``set_robust_mixing``
    robust_mixing_aware: bool = False

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        for contract in (ClientHooks, Scheduled):
            if issubclass(cls, contract):
                continue
            defined = sorted(m for m in contract.METHODS if any(m in vars(k) for k in cls.__mro__
                                                                 if k not in (contract, object)))
            if defined:
                raise TypeError(f"strategy {cls.__qualname__} defines {defined} of the {contract.__name__} contract "
                                f"without declaring it: subclass ftta_core.strategies.base.{contract.__name__} too "
                                f"(class {cls.__name__}({contract.__name__}, ...)), or the engine never calls them")

    def reset(self, n_clients: int) -> None:
        """Forget server memory before a new stream with ``n_clients`` clients."""
        self.n_clients = n_clients

    @abstractmethod
    def collaboration(self, inputs: ServerInputs) -> torch.Tensor:
        """Row-stochastic, non-negative W [N, N] for this step."""

    def mix(self, state: Dict[str, torch.Tensor], weights: torch.Tensor) -> Dict[str, torch.Tensor]:
        """Apply W to the shared state (override for server momentum); integer tensors are counters (``engine.average``).

        With ``robust_mixing`` set, row i is that robust statistic of the clients' values with row i of W as weights
        (``engine.robust``; W itself is unchanged). A subclass that overrides ``mix`` honours it only by calling this
        method (FedAvg with local statistics) or ``mean_state`` (FedAvgM, L-DAWA) and declaring
        ``robust_mixing_aware = True``; ``set_robust_mixing`` refuses any other override."""
        return mix_models(state, weights, self.robust_mixing)

    def mean_state(self, state: Dict[str, torch.Tensor], row: torch.Tensor) -> Dict[str, torch.Tensor]:
        """One model [1, ...] from the clients' state [N, ...] with weights ``row`` [N] (a server's global model):
        ``weighted_mean_state``, or with ``robust_mixing`` its robust statistic (integer tensors: the weighted mean)."""
        if self.robust_mixing is None:
            return weighted_mean_state(state, row)
        floats = {k: v for k, v in state.items() if v.is_floating_point()}
        robust = self.robust_mixing.mean(floats, row)
        plain = weighted_mean_state({k: v for k, v in state.items() if k not in floats}, row)
        return {k: robust[k] if k in robust else plain[k] for k in state}

    def after_mix(self, mixed: Dict[str, torch.Tensor], inputs: ServerInputs) -> None:
        """Observe the mixed state (strategies that keep the last global/personal models)."""

    def client_uploads(self, context: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        """Pick this strategy's upload kinds from what the engine computed on the clients."""
        missing = [k for k in self.needs if k not in context]
        if missing:
            raise KeyError(f"strategy {self.name} needs uploads {missing} the engine did not compute")
        return {k: context[k] for k in self.needs}

    def state_dict(self) -> dict:
        """Server memory (for resuming a run)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore server memory."""


class ClientHooks:
    """Opt-in contract of a strategy with code that runs on the clients' models (mixed into a ``Strategy``:
    ``class FedProx(ClientHooks, FedAvg)``). Both hooks have inert defaults; override what you need."""

    METHODS = ("regularizer", "probe_uploads")

    def regularizer(self, bank: ClientBank, x: torch.Tensor) -> Optional[LossFn]:
        """An extra client loss term for the next local step (FedProx, MOON, pFedSD); none by default."""
        return None

    def probe_uploads(self, bank: ClientBank, local: "LocalMethod", x: torch.Tensor,
                      step: int) -> Dict[str, torch.Tensor]:
        """Client-side uploads that need the adapted client models themselves (none by default).

        Called by the engine once per step, after the local step and after the shared state was read, before
        ``client_uploads``; what it returns ([N, ...] per name) is merged into the engine's context. ``x`` is the
        clients' batch [N,B,C,H,W] (for shapes and device) and ``step`` the stream step. It may run forwards
        (e.g. on probe inputs, FedCTTA) but must leave the clients' parameters unchanged.
        """
        return {}


class Scheduled(ABC):
    """Opt-in contract of a strategy that computes rounds before their step comes, on server threads (FedTSA):
    ``lookahead`` names the upload kinds (of the frozen source model only) it plans from; the engine then hands it
    those uploads ahead of time (``plan_rounds``)."""

    METHODS = ("plan_chunk", "plan_rounds", "expect_rounds")
    lookahead: tuple = ()

    def plan_chunk(self, device: torch.device | str) -> int:
        """How many future steps the strategy wants handed over at once by ``plan_rounds`` on ``device`` (e.g. the
        rounds it trains as one batch); 1 by default."""
        return 1

    def expect_rounds(self, rounds: int) -> None:
        """The engine's word, before the first step it runs: the run stops before step ``rounds`` (its length from
        step 0; the same number when the run resumes part-way). A strategy may choose how to compute its rounds by
        it (FedTSA compiles its iteration for a long run), never what they give. Nothing by default."""

    @abstractmethod
    def plan_rounds(self, steps: Sequence[int], uploads: Dict[str, torch.Tensor], present: torch.Tensor,
                    submit: Callable[..., Future]) -> None:
        """Start computing the rounds of future ``steps`` (in order, each step handed over once) from the source-model
        ``uploads`` [S, N, ...] of the kinds in ``lookahead`` and the clients ``present`` [S, N] at each step;
        ``submit(fn, *args)`` runs ``fn`` on a server thread. A strategy that does this must still return, at each
        step, exactly the W it would compute without look-ahead (e.g. by checking its memory against the plan)."""


def set_robust_mixing(strategy: Strategy, robust: Optional[RobustMixing]) -> Strategy:
    """Run ``strategy`` with ``robust`` mixing (None: the weighted mean); returns it. A strategy whose class overrides
    ``mix`` without declaring ``robust_mixing_aware`` (its ``mix`` would ignore the setting) raises ``ValueError``."""
    if robust is not None:
        definer = next(k for k in type(strategy).__mro__ if "mix" in vars(k))
        if definer is not Strategy and not vars(definer).get("robust_mixing_aware", False):
            raise ValueError(f"strategy {strategy.name!r} mixes by its own {definer.__qualname__}.mix, which does not "
                             "go through Strategy.mix or mean_state: robust mixing cannot be applied to it (declare "
                             "robust_mixing_aware = True in a mix that does)")
    strategy.robust_mixing = robust
    return strategy


def client_regularizer(strategy: Strategy, bank: ClientBank, x: torch.Tensor) -> Optional[LossFn]:
    """``strategy``'s client regulariser for the next local step (None unless it declares ``ClientHooks``)."""
    return strategy.regularizer(bank, x) if isinstance(strategy, ClientHooks) else None


def probe_uploads(strategy: Strategy, bank: ClientBank, local: "LocalMethod", x: torch.Tensor,
                  step: int) -> Dict[str, torch.Tensor]:
    """``strategy``'s uploads computed on the client models ({} unless it declares ``ClientHooks``)."""
    return strategy.probe_uploads(bank, local, x, step) if isinstance(strategy, ClientHooks) else {}


def lookahead_of(strategy: Strategy) -> tuple:
    """The upload kinds ``strategy`` computes rounds ahead from (() unless it declares ``Scheduled``)."""
    return tuple(strategy.lookahead) if isinstance(strategy, Scheduled) else ()


def check_collaboration(weights: torch.Tensor, n_clients: int, atol: float = 1e-5) -> torch.Tensor:
    """Validate that W is [N, N], finite, non-negative and row-stochastic; return it."""
    if weights.shape != (n_clients, n_clients):
        raise ValueError(f"collaboration matrix has shape {tuple(weights.shape)}, expected ({n_clients}, {n_clients})")
    if not torch.isfinite(weights).all() or (weights < -atol).any():
        raise ValueError("collaboration matrix must be finite and non-negative")
    if not torch.allclose(weights.sum(1), torch.ones(n_clients, dtype=weights.dtype, device=weights.device), atol=atol):
        raise ValueError("collaboration matrix rows must sum to 1")
    return weights


def row_softmax(scores: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Row-wise softmax of ``scores / temperature``."""
    return torch.softmax(scores / temperature, dim=1)


# ----------------------------------------------------------------------------------------------------------------
# Helpers shared by several strategies (FedAvgM, FedProx, FedAMP, pFedGraph, LDAWA, MOON, pFedSD).

StateDict = Dict[str, torch.Tensor]
SIMILARITY_SOURCES = ("indicator", "state", "update")


def size_fractions(inputs: ServerInputs) -> torch.Tensor:
    """FedAvg weights p [N] (float64, CPU): samples per accepted client over their total; rejected clients get 0."""
    n = inputs.valid.shape[0]
    sizes = torch.ones(n, dtype=torch.float64) if inputs.sizes is None else inputs.sizes.detach().double().cpu()
    sizes = sizes * inputs.valid.cpu().double()
    total = sizes.sum()
    return sizes / total if total > 0 else torch.full((n,), 1.0 / n, dtype=torch.float64)


def clone_state(state: StateDict) -> StateDict:
    """Detached copies of every tensor of ``state``."""
    return {k: v.detach().clone() for k, v in state.items()}


def weighted_mean_state(state: StateDict, weights: torch.Tensor) -> StateDict:
    """``sum_j w_j theta_j`` for every named tensor [N, ...] -> [1, ...] (one model); zero weights skip NaN/Inf rows."""
    out = {}
    for k, v in state.items():
        w = weights.to(v.device, torch.float64).view(-1, *[1] * (v.dim() - 1))
        terms = torch.where(w != 0, w * v.double(), torch.zeros((), dtype=torch.float64, device=v.device))
        out[k] = terms.sum(0, keepdim=True).to(v.dtype)
    return out


def gram_matrix(tensors, valid: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``G_ij = <a_i, a_j>`` [N, N] in float64 over the concatenation of tensors [N, ...]; rejected rows count as 0."""
    gram = None
    for t in tensors:
        flat = t.detach().reshape(t.shape[0], -1).double()
        if valid is not None:
            flat = torch.where(valid.to(flat.device).view(-1, 1), flat, torch.zeros_like(flat))
        g = (flat @ flat.T).cpu()
        gram = g if gram is None else gram + g
    if gram is None:
        raise ValueError("gram_matrix needs at least one tensor")
    return gram


def cosine_from_gram(gram: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    """Cosine similarities [N, N] from a Gram matrix (0 against a zero vector, 1 on the diagonal of nonzero ones)."""
    norms = gram.diagonal().clamp_min(0).sqrt()
    denom = norms[:, None] * norms[None, :]
    return torch.where(denom > eps, gram / denom.clamp_min(eps), torch.zeros_like(gram)).clamp(-1.0, 1.0)


def distance_from_gram(gram: torch.Tensor) -> torch.Tensor:
    """Euclidean distances [N, N] from a Gram matrix (exact zeros on the diagonal)."""
    diag = gram.diagonal()
    sq = (diag[:, None] + diag[None, :] - 2 * gram).clamp_min(0)
    sq.fill_diagonal_(0)
    return sq.sqrt()


def similarity_gram(inputs: ServerInputs, on: str, reference: Optional[StateDict] = None) -> torch.Tensor:
    """Gram matrix of what clients are compared on: 'indicator' upload, raw 'state', or 'update' = state - reference.

    ``reference`` ([N, ...] per name, e.g. the state each client received at the last mix) defaults, for 'update',
    to the FedAvg mean of the current state (so the first step compares deviations from the mean).
    """
    valid = inputs.valid
    if on in ("state", "update") and not inputs.state:
        # the local method shares nothing (e.g. no adaptation): no similarity information, all zeros
        return torch.zeros(valid.shape[0], valid.shape[0], dtype=torch.float64)
    if on == "indicator":
        if "indicator" not in inputs.uploads:
            raise KeyError("similarity on 'indicator' needs the 'indicator' upload")
        return gram_matrix([inputs.uploads["indicator"]], valid)
    if on == "state":
        return gram_matrix(inputs.state.values(), valid)
    if on == "update":
        if reference is None or set(reference) != set(inputs.state):
            reference = weighted_mean_state(inputs.state, size_fractions(inputs))
        return gram_matrix((v - reference[k].to(v.device, v.dtype) for k, v in inputs.state.items()), valid)
    raise ValueError(f"similarity_on must be one of {SIMILARITY_SOURCES}, got {on!r}")


def masked_row_softmax(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Row-wise softmax over the entries where ``mask`` is True; rows without any True entry are all zero."""
    masked = scores.masked_fill(~mask, float("-inf"))
    has_any = mask.any(1, keepdim=True)
    safe = torch.where(has_any, masked, torch.zeros_like(masked))
    return torch.where(mask, torch.softmax(safe, dim=1), torch.zeros_like(scores))


DISTANCE_SCALES = ("none", "row_median", "count")


def scale_distances(distance: torch.Tensor, valid: torch.Tensor, scale: str = "none", count: int = 1) -> torch.Tensor:
    """Distances [N, N] brought to a scale a softmax temperature can be set for once: "none" (as they are),
    "count" (divided by ``count``, e.g. the number of summed per-layer terms, so the scale does not grow with depth)
    or "row_median" (row i divided by the median of its distances to the other valid clients, so each client's
    nearest and farthest neighbours sit around 1 whatever the batch size or network: W then depends on the clients'
    *relative* distances only; a row whose median is 0 is left as it is)."""
    if scale == "none":
        return distance
    if scale == "count":
        return distance / max(int(count), 1)
    if scale != "row_median":
        raise ValueError(f"distance scale must be one of {DISTANCE_SCALES}, got {scale!r}")
    n = distance.shape[0]
    others = valid[None, :].expand(n, n) & ~torch.eye(n, dtype=torch.bool)
    med = torch.stack([distance[i][others[i]].quantile(0.5) if bool(others[i].any()) else distance.new_tensor(0.0)
                       for i in range(n)])
    return torch.where(med[:, None] > 0, distance / med.clamp_min(1e-300)[:, None], distance)


class StateMemory:
    """Bounded server memory: each client's last local (pre-mix) and received (post-mix) state, one copy of each."""

    KINDS = ("local", "received")

    def __init__(self, keep: tuple = KINDS) -> None:
        unknown = [k for k in keep if k not in self.KINDS]
        if unknown:
            raise ValueError(f"StateMemory can keep {self.KINDS}, not {unknown}")
        self.keep = tuple(keep)
        self.saved: Dict[str, StateDict] = {}

    def clear(self) -> None:
        """Forget everything."""
        self.saved = {}

    def observe(self, local: StateDict, received: StateDict) -> None:
        """Remember this step's pre-mix and post-mix states (replacing the previous ones)."""
        for kind, state in (("local", local), ("received", received)):
            if kind in self.keep:
                self.saved[kind] = clone_state(state)

    def get(self, kind: str) -> Optional[StateDict]:
        """The remembered state of ``kind`` ('local' or 'received'), or None before the first mix."""
        return self.saved.get(kind)

    def params(self, bank: ClientBank, kind: str) -> Optional[StateDict]:
        """The remembered trainable parameters (TTA-grad; the state may hold more, e.g. a teacher or statistics),
        or None when it does not hold them all (TTA-bn)."""
        saved = self.saved.get(kind)
        if not saved or not bank.trainable or not set(bank.trainable) <= set(saved):
            return None
        return {k: saved[k] for k in bank.trainable}

    def state_dict(self) -> dict:
        """Copies of the remembered states."""
        return {kind: clone_state(state) for kind, state in self.saved.items()}

    def load_state_dict(self, state: dict) -> None:
        """Restore ``state_dict``."""
        self.saved = {kind: clone_state(s) for kind, s in state.items()}


class RemembersStates:
    """Mixin for strategies that keep a ``StateMemory`` (kinds listed in ``keep``), filled by ``after_mix``."""

    keep: tuple = StateMemory.KINDS

    @property
    def memory(self) -> StateMemory:
        """This strategy's bounded memory (created on first use)."""
        if getattr(self, "_memory", None) is None:
            self._memory = StateMemory(self.keep)
        return self._memory

    def reset(self, n_clients: int) -> None:
        super().reset(n_clients)  # type: ignore[misc]
        self.memory.clear()

    def after_mix(self, mixed: StateDict, inputs: ServerInputs) -> None:
        self.memory.observe(inputs.state, mixed)

    def state_dict(self) -> dict:
        return {"memory": self.memory.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.memory.load_state_dict(state.get("memory", {}))
