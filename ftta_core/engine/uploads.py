"""The server's checks of what clients upload: beyond NaN/Inf, shape, dtype, BN variances and magnitude.

A client whose upload fails a check is **rejected** at that step: it gets no weight in W (no one mixes it in, its
own row is the identity, ``mixing.restrict_to_valid``) and keeps its own model; the step's result names it
(``StepResult.rejected``) and the engine logs one warning line per step naming each rejected client and why.

Checks, per client and per uploaded name (the shared state's entries and the strategy's uploads alike)
------------------------------------------------------------------------------------------------------
1. **structure** -- the client sent the name, as a tensor of the expected per-client shape and dtype. *Expected*
   is what the server's ``UploadSchema`` holds: given by the caller, or learned at the first step at which the
   name arrives as the (shape, dtype) that most present clients sent (ties: the lowest client id's), then fixed.
   (The source model's shapes are not the expectation: not every shared entry has a namesake there, e.g.
   pFedBBN's class-wise statistics [K, 2, C].) Stacked uploads [N, ...] (the engine) have one shape and dtype
   for all clients, so there a mismatch rejects every present client; per-client uploads (a network server, or a
   local method returning a list of N tensors for a name) are checked client by client.
2. **finite** -- no NaN or Inf (exact; from the same pass as the norms of check 4).
3. **variance** -- in BN-statistics entries (``engine.layers.is_bn_stats``: [N, 2, C], row 1 = variance),
   every variance >= ``min_variance`` (0): a negative variance is no statistic at all (``rsqrt(var + eps)`` of it
   is NaN or huge for whoever mixes it in).
4. **magnitude** (``UploadPolicy.magnitude``) -- per name, a client's scale ``s_i = ||x_i|| / sqrt(numel)`` (the
   RMS of its values) must be
   a. within ``k`` times the clients' typical scale: ``s_i <= k * max(median_j s_j, floor)``, the lower median
      over the present clients that passed checks 1-2 for this name, when there are at least ``min_clients``
      (3) of them: a median of a strict majority of honest clients is honest, while with two clients nothing
      tells which one is wrong. ``k`` = ``max_ratio_by_name.get(name, max_ratio)``: 4 for 'indicator', 100 for
      'probe_mean', 8 else.
   b. within ``max_source_ratio`` (100) times the source model's scale, for entries with a namesake of the same
      shape in the source model (a parameter, or a BN layer's [running_mean; running_var], after dropping
      leading prefixes such as 'running.', 'teacher.', 'rbn.student.'): ``s_i <= 100 * max(RMS(source),
      floor)``. It needs no other client, so it also guards a federation of two, or one whose majority is broken.
   ``floor`` (1e-3) keeps entries whose honest values are all ~0 from turning a tiny difference into a huge
   ratio; clients with identical uploads have equal scales (ratio 1) and are never rejected.

Why a scale rule, not the distance to the coordinate-wise median
-----------------------------------------------------------------
What hijacks a similarity strategy or overflows the mix is *scale*: FedTSA's attention scores are dot products
of indicators (a client scaling its indicator x10 takes every client's weight), and x1e15 overflows float32 in
the server's training (the whole step crashed). A distance-to-median rule would also reject honest clients: when
three clients share a domain and a fourth is alone in another, the three are close to the median (distance ~
batch noise) and the fourth is far (distance ~ domain shift), tens of times the median distance -- yet being in a
minority domain is what federated TTA is about. A client's scale moves far less with its domain than its
position does.

Thresholds (measured, ``k`` must exceed the honest spread and stay below the attacks' factor)
---------------------------------------------------------------------------------------------
Honest spread = max / min of ``s_i`` over 16 clients each on its own domain (clean + the 15 corruptions at
severity 5, also 3 and 1), batch sizes 1-64, TTA-bn, Tent (params all, lr 1e-3) with bn 'batch' and 'running',
digits CNN and CIFAR-10 ResNet-8; the worst over steps and names of each kind:

==================================  =================  ====================
name                                honest spread       source ratio
==================================  =================  ====================
BN statistics (TTA-bn)              <= 2.7              0.53 - 2.06
running BN statistics ('running.')  <= 1.6              0.84 - 1.44
parameters (Tent, all)              1.00                1.00
indicator (source features)         <= 2.8              --
feature_mean, logits_mean           <= 1.4              --
probe_mean (FedCTTA, TTA-bn probes) <= 5.7              --
probe_mean (FedCTTA, TTA-grad)      <= 14.2             --
==================================  =================  ====================

(The TTA-grad row: Tent with all parameters, running BN and Adam, lr 3e-4, 20 CIFAR-10 clients, 750 steps,
``figures/fedtsa_table1/runs/61bd0146a53079ba.json`` as first stored: client 15 (frost) reached 8.3x-14.2x the
median client's probe-logit RMS at steps 620-740 while its own accuracy over steps 560-599 was 59.0 %: a confident
honest model, not a diverged one; its probe logits grow with its confidence on noise probes.)

So ``k = 8`` (1.4x above the widest honest spread of the statistics and parameters that are *mixed*) and
``k = 100`` for FedCTTA's ``probe_mean``: no one mixes it, it only sets W by ``softmax(-||s_i - s_j|| / T)``, so
a client that scales its probe logits moves itself *away* from everyone and takes weight ~0 in their rows (it
isolates itself; tested), and the only harm left is a gross blow-up, which 100x (7x above the honest 14.2) still
rejects. ``k = 4`` for the indicator: it comes from the frozen source model, so its scale only follows the
input distribution (<= 2.8x), and it is what dot-product attention (FedTSA) weights by, so it is bounded tighter:
an indicator x10 is rejected whenever the client's honest scale is > 0.4x the median client's (the smallest
measured was 0.36x the largest, so only the very smallest client of the most spread federation could scale x10
unseen; x12 is always seen).
``max_source_ratio = 100`` is a backstop for gross blow-ups (x1e15, x1e30) with 50x margin over the measured 2.1.

What it does not catch: an upload of plausible scale but wrong content (a bounded-norm poisoned direction, a
permuted vector, a client scaling within the bound); those are for robust mixing (``engine.robust``, the config's
``robust_mixing``: a robust per-row statistic instead of the weighted mean), measured against such lies
(``engine.attacks``) in benchmarks/results/robust_mixing.md; docs/threat-model.md says what neither catches. With
fewer than ``min_clients`` present clients only the source bound checks magnitude, and strategy uploads (no
source namesake) are then checked for structure and finiteness only.

Backends: the checks run on the stacked uploads [N, ...], which the loop and vectorized banks both produce, so
both backends reject the same clients (tested). Honest runs are untouched bit for bit: with no client rejected
the stacked tensors are passed on as they came and ``valid`` is the participation mask, as before.
"""
from __future__ import annotations

import math
import weakref
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

import torch
from torch import nn

from .layers import is_bn_stats

# an upload name's value: stacked over clients [N, ...], or one tensor (or None: not sent) per client
Upload = Union[torch.Tensor, Sequence[Optional[torch.Tensor]]]
Shape = Tuple[int, ...]

# reason priorities: a client failing several checks is reported with the most basic failure first
STRUCTURE, FINITE, VARIANCE, MAGNITUDE = range(4)


@dataclass
class UploadPolicy:
    """Thresholds of the server's upload checks (see the module docstring for the rule and why these values).

    ``magnitude=False`` turns the magnitude check off (structure, finiteness and BN variances are still checked);
    ``max_source_ratio=None`` turns off only its source-model bound.
    """

    magnitude: bool = True
    max_ratio: float = 8.0
    max_ratio_by_name: Dict[str, float] = field(default_factory=lambda: {"indicator": 4.0, "probe_mean": 100.0})
    max_source_ratio: Optional[float] = 100.0
    floor: float = 1e-3
    min_clients: int = 3
    min_variance: float = 0.0

    def __post_init__(self) -> None:
        for name, value in [("max_ratio", self.max_ratio), *(
                (f"max_ratio_by_name[{k!r}]", v) for k, v in self.max_ratio_by_name.items())]:
            if not value > 1.0:
                raise ValueError(f"{name} must be > 1, got {value}")
        if self.max_source_ratio is not None and not self.max_source_ratio > 1.0:
            raise ValueError(f"max_source_ratio must be > 1 or None, got {self.max_source_ratio}")
        if not self.floor >= 0.0:
            raise ValueError(f"floor must be >= 0, got {self.floor}")
        if int(self.min_clients) != self.min_clients or self.min_clients < 2:
            raise ValueError(f"min_clients must be an integer >= 2, got {self.min_clients}")

    def ratio_for(self, name: str) -> float:
        """The cross-client bound k for upload ``name``."""
        return float(self.max_ratio_by_name.get(name, self.max_ratio))


class UploadSchema:
    """Expected per-client (shape, dtype) of every upload name: given, or learned from the first step at which the
    name arrives (then fixed). A dtype of None accepts any dtype."""

    def __init__(self, expected: Optional[Mapping[str, Tuple[Sequence[int], Optional[torch.dtype]]]] = None) -> None:
        self.expected: Dict[str, Tuple[Shape, Optional[torch.dtype]]] = {
            k: (tuple(int(d) for d in shape), dtype) for k, (shape, dtype) in (expected or {}).items()}

    def get(self, name: str) -> Optional[Tuple[Shape, Optional[torch.dtype]]]:
        """The expected (shape, dtype) of ``name``, or None while unknown."""
        return self.expected.get(name)

    def learn(self, name: str, shape: Shape, dtype: Optional[torch.dtype]) -> None:
        """Fix ``name``'s expectation unless it is already known."""
        self.expected.setdefault(name, (tuple(shape), dtype))


class UploadCheck(NamedTuple):
    """The outcome of ``validate_uploads``: accepted clients [N] (bool, CPU) and a reason per rejected client."""

    valid: torch.Tensor
    reasons: Dict[int, str]


class CheckedUploads(NamedTuple):
    """``UploadGate.check``'s outcome: the stacked state and uploads [N, ...], accepted clients, reasons."""

    state: Dict[str, torch.Tensor]
    uploads: Dict[str, torch.Tensor]
    valid: torch.Tensor
    reasons: Dict[int, str]


def by_name(per_client: Sequence[Optional[Mapping[str, torch.Tensor]]]) -> Dict[str, List[Optional[torch.Tensor]]]:
    """Per-client uploads ({name: tensor} per client, as a network server receives them) as {name: [N] tensors},
    None where a client did not send the name (or sent nothing)."""
    names: Dict[str, None] = {}
    for up in per_client:
        names.update(dict.fromkeys(up or {}))
    return {k: [None if up is None else up.get(k) for up in per_client] for k in names}


def reference_values(model: nn.Module) -> Dict[str, torch.Tensor]:
    """The source model's values per shareable name: parameters, and per BN layer [running_mean; running_var]
    [2, C] (the layout of TTA-bn statistics)."""
    ref = {n: p.detach() for n, p in model.named_parameters()}
    for n, m in model.named_modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.running_mean is not None:
            ref[n] = torch.stack([m.running_mean.detach(), m.running_var.detach()])
    return ref


def namesake(reference: Optional[Mapping[str, torch.Tensor]], name: str, shape: Shape) -> Optional[torch.Tensor]:
    """``reference``'s value for ``name`` of per-client ``shape``: the name itself, else the name without leading
    dotted prefixes ('running.bn1' -> 'bn1', 'rbn.student.bn1' -> 'bn1'); None when none has that shape."""
    if not reference:
        return None
    parts = name.split(".")
    for i in range(len(parts)):
        ref = reference.get(".".join(parts[i:]))
        if ref is not None and tuple(ref.shape) == tuple(shape):
            return ref
    return None


def _n_clients(tensors: Mapping[str, Upload], n_clients: Optional[int], present: Optional[torch.Tensor]) -> int:
    counts = {int(v.shape[0]) if isinstance(v, torch.Tensor) else len(v) for v in tensors.values()}
    if n_clients is not None:
        counts.add(int(n_clients))
    if present is not None:
        counts.add(int(present.shape[0]))
    if len(counts) > 1:
        raise ValueError(f"uploads disagree on the number of clients: {sorted(counts)}")
    if not counts:
        raise ValueError("validate_uploads needs n_clients or present when nothing was uploaded")
    return counts.pop()


def _majority(rows: Sequence[Optional[torch.Tensor]], present: torch.Tensor) -> Optional[Tuple[Shape, torch.dtype]]:
    """The (shape, dtype) most present clients sent (ties: the lowest client id's), or None if none sent one."""
    counts: Dict[Tuple[Shape, torch.dtype], int] = {}
    for i, t in enumerate(rows):
        if bool(present[i]) and isinstance(t, torch.Tensor):
            key = (tuple(t.shape), t.dtype)
            counts[key] = counts.get(key, 0) + 1
    return max(counts, key=counts.get) if counts else None  # max keeps the first of equal counts


def _describe_tensor(t: object) -> str:
    return f"shape {tuple(t.shape)} {t.dtype}" if isinstance(t, torch.Tensor) else type(t).__name__


def _structure(name: str, value: Upload, present: torch.Tensor, schema: UploadSchema,
               found: Dict[int, List[Tuple[int, str, str]]]) -> Tuple[torch.Tensor, Optional[torch.Tensor], Shape]:
    """Check shapes and dtypes of ``name``; return (readable [N] bool, stacked rows of the readable clients or None,
    expected per-client shape)."""
    n = present.shape[0]
    expected = schema.get(name)
    if isinstance(value, torch.Tensor):
        shape, dtype = tuple(value.shape[1:]), value.dtype
        if expected is None:
            expected = (shape, dtype)
        exp_shape, exp_dtype = expected
        problem = None
        if shape != exp_shape:
            problem = f"shape {shape}, expected {exp_shape}"
        elif exp_dtype is not None and dtype != exp_dtype:
            problem = f"dtype {dtype}, expected {exp_dtype}"
        if problem is not None:
            for i in torch.nonzero(present).flatten().tolist():
                found.setdefault(i, []).append((STRUCTURE, name, f"{name!r} has {problem}"))
            schema.learn(name, *expected)
            return torch.zeros(n, dtype=torch.bool), None, exp_shape
        schema.learn(name, shape, dtype)
        return torch.ones(n, dtype=torch.bool), value, shape
    rows = list(value)
    if expected is None:
        expected = _majority(rows, present)
        if expected is None:  # no present client sent it
            for i in torch.nonzero(present).flatten().tolist():
                found.setdefault(i, []).append((STRUCTURE, name, f"missing upload {name!r}"))
            return torch.zeros(n, dtype=torch.bool), None, ()
    exp_shape, exp_dtype = expected
    readable = torch.zeros(n, dtype=torch.bool)
    for i, t in enumerate(rows):
        if not bool(present[i]):
            continue
        if t is None:
            problem = f"missing upload {name!r}"
        elif not isinstance(t, torch.Tensor):
            problem = f"{name!r} is a {type(t).__name__}, not a tensor"
        elif tuple(t.shape) != exp_shape:
            problem = f"{name!r} has shape {tuple(t.shape)}, expected {exp_shape}"
        elif exp_dtype is not None and t.dtype != exp_dtype:
            problem = f"{name!r} has dtype {t.dtype}, expected {exp_dtype}"
        else:
            readable[i] = True
            continue
        found.setdefault(i, []).append((STRUCTURE, name, problem))
    schema.learn(name, *expected)
    if not bool(readable.any()):
        return readable, None, exp_shape
    first = rows[int(torch.nonzero(readable)[0])]
    stacked = torch.zeros((n, *exp_shape), dtype=first.dtype, device=first.device)
    for i in torch.nonzero(readable).flatten().tolist():
        stacked[i] = rows[i].detach().to(first.device)
    return readable, stacked, exp_shape


def validate_uploads(state: Optional[Mapping[str, Upload]], uploads: Optional[Mapping[str, Upload]] = None,
                     present: Optional[torch.Tensor] = None, policy: Optional[UploadPolicy] = None, *,
                     schema: Optional[UploadSchema] = None, reference: Optional[Mapping[str, torch.Tensor]] = None,
                     n_clients: Optional[int] = None) -> UploadCheck:
    """Check every present client's uploads (structure, finiteness, BN variances, magnitude; module docstring).

    ``state`` and ``uploads``: {name: [N, ...] tensor, or N per-client tensors / None}; ``present`` [N] bool
    (default all): absent clients are neither checked nor rejected; ``policy``: thresholds (default
    ``UploadPolicy()``); ``schema``: expected shapes and dtypes, learned into when given (default: a fresh one,
    learning from this call only); ``reference``: the source model's values (``reference_values``) for the
    source-model magnitude bound. Returns the accepted clients [N] (present and passing every check) and, per
    rejected client, the reason of its most basic failure (``+k more`` when it failed on other names too).
    """
    tensors: Dict[str, Upload] = {**(state or {}), **(uploads or {})}
    policy = policy or UploadPolicy()
    schema = schema if schema is not None else UploadSchema()
    n = _n_clients(tensors, n_clients, present)
    present = torch.ones(n, dtype=torch.bool) if present is None else present.detach().cpu().bool()
    found: Dict[int, List[Tuple[int, str, str]]] = {}
    scales: List[Tuple[str, torch.Tensor, torch.Tensor, Shape, torch.Tensor]] = []
    for name, value in tensors.items():
        readable, stacked, shape = _structure(name, value, present, schema, found)
        if stacked is None:
            continue
        ok = readable & present
        rows = stacked.detach().reshape(n, -1)
        if not rows.is_floating_point() or not rows.shape[1]:
            continue  # integers are finite; nothing to scale
        norm, finite = _norms(rows)
        for i in torch.nonzero(ok & ~finite).flatten().tolist():
            found.setdefault(i, []).append((FINITE, name, f"{name!r} holds NaN or Inf"))
        ok &= finite
        if not bool(ok.any()):
            continue
        if is_bn_stats(name, stacked):
            lowest = stacked.detach()[:, 1].reshape(n, -1).amin(1).cpu()
            for i in torch.nonzero(ok & ~(lowest >= policy.min_variance)).flatten().tolist():
                found.setdefault(i, []).append(
                    (VARIANCE, name, f"{name!r} has a negative variance ({float(lowest[i]):.3g})"))
        if policy.magnitude:
            scales.append((name, norm / math.sqrt(rows.shape[1]), ok, shape))
    if scales:  # one transfer for every name's scales
        every = torch.stack([s.double() for _, s, *_ in scales]).cpu()
        for (name, _, ok, shape), scale in zip(scales, every):
            _magnitude(name, scale, ok, namesake(reference, name, shape), policy, found)
    valid = present.clone()
    reasons: Dict[int, str] = {}
    for i in sorted(found):
        valid[i] = False
        failures = sorted(found[i], key=lambda f: f[0])  # stable: the first name of the most basic check
        more = len({f[1] for f in failures}) - 1
        reasons[i] = failures[0][2] + (f" (+{more} more)" if more > 0 else "")
    return UploadCheck(valid, reasons)


def _norms(rows: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Euclidean norms of the rows [N, D] (on their device) and which rows are finite ([N] bool, CPU, exact).

    One pass: a norm is finite only if every value is (NaN and Inf propagate); rows whose norm is not (a bad value,
    or finite values too large to square, |x| > ~1e19 in float32) are checked value by value, and the norms of
    the finite ones among them recomputed in float64."""
    norm = torch.linalg.vector_norm(rows if rows.element_size() >= 4 else rows.float(), dim=1)
    finite = norm.isfinite().cpu()
    if not bool(finite.all()):
        suspect = torch.nonzero(~finite).flatten()
        finite[suspect] = torch.isfinite(rows[suspect.to(rows.device)]).all(1).cpu()
        overflow = suspect[finite[suspect]].to(rows.device)  # finite values whose squares overflowed: in float64
        if len(overflow):
            norm = norm.double()
            norm[overflow] = torch.linalg.vector_norm(rows[overflow].double(), dim=1)
    return norm, finite


_REFERENCE_SCALES: Dict[int, Tuple["weakref.ref[torch.Tensor]", float]] = {}  # id -> (the tensor, its RMS)


def _reference_scale(reference: torch.Tensor) -> float:
    """RMS of a source-model value, computed once per tensor (the source model is frozen)."""
    key = id(reference)
    entry = _REFERENCE_SCALES.get(key)
    if entry is not None and entry[0]() is reference:
        return entry[1]
    scale = float(torch.linalg.vector_norm(reference.detach().double()) / math.sqrt(max(reference.numel(), 1)))

    def forget(dead: "weakref.ref[torch.Tensor]") -> None:
        if _REFERENCE_SCALES.get(key, (None,))[0] is dead:
            del _REFERENCE_SCALES[key]

    _REFERENCE_SCALES[key] = (weakref.ref(reference, forget), scale)
    return scale


def _magnitude(name: str, scale: torch.Tensor, ok: torch.Tensor, reference: Optional[torch.Tensor],
               policy: UploadPolicy, found: Dict[int, List[Tuple[int, str, str]]]) -> None:
    """Reject the clients whose scale of ``name`` is beyond the cross-client or the source-model bound."""
    candidates = torch.nonzero(ok).flatten()
    flagged = set()
    if len(candidates) >= policy.min_clients:
        typical = float(scale[candidates].median())  # the lower median for an even count
        k = policy.ratio_for(name)
        bound = k * max(typical, policy.floor)
        for i in candidates.tolist():
            if not float(scale[i]) <= bound:  # an overflowing (inf) scale is beyond any bound
                flagged.add(i)
                ratio = float(scale[i]) / max(typical, policy.floor)
                found.setdefault(i, []).append((MAGNITUDE, name, f"{name!r} RMS {float(scale[i]):.3g} is "
                                                f"{ratio:.3g}x the median client's {typical:.3g} (bound {k:g}x)"))
    if reference is not None and policy.max_source_ratio is not None and reference.is_floating_point():
        ref = _reference_scale(reference)
        bound = policy.max_source_ratio * max(ref, policy.floor)
        for i in candidates.tolist():
            if i not in flagged and not float(scale[i]) <= bound:
                found.setdefault(i, []).append((MAGNITUDE, name, f"{name!r} RMS {float(scale[i]):.3g} is beyond "
                                                f"{policy.max_source_ratio:g}x the source model's {ref:.3g}"))


def stack_uploads(tensors: Mapping[str, Upload], valid: torch.Tensor, schema: UploadSchema,
                  fill: Optional[Mapping[str, torch.Tensor]] = None,
                  rejected_rows: str = "own") -> Dict[str, torch.Tensor]:
    """Stacked [N, ...] tensors (expected shape and dtype) of uploads checked by ``validate_uploads``.

    A name already stacked is passed on as it is (the same tensor). Per-client rows: accepted clients' values;
    a rejected client's own value when it has the expected shape (cast to the expected dtype) with
    ``rejected_rows='own'`` (it keeps its own model), else -- and always with ``rejected_rows='zeros'`` --
    ``fill[name]`` (e.g. the source model's value: what the server knows the client started from) when it has that
    shape, else zeros. A name no client sent readably is left out.
    """
    if rejected_rows not in ("own", "zeros"):
        raise ValueError(f"rejected_rows must be 'own' or 'zeros', got {rejected_rows!r}")
    out: Dict[str, torch.Tensor] = {}
    for name, value in tensors.items():
        if isinstance(value, torch.Tensor):
            out[name] = value
            continue
        expected = schema.get(name)
        rows = list(value)
        tensors_ = [t for t in rows if isinstance(t, torch.Tensor)]
        if expected is None or not tensors_:
            continue
        shape, dtype = expected
        if dtype is None:
            good = [rows[i] for i in range(len(rows)) if bool(valid[i]) and isinstance(rows[i], torch.Tensor)]
            dtype = (good or tensors_)[0].dtype
            dtype = dtype if dtype.is_floating_point else torch.float32
        device = tensors_[0].device
        default = fill.get(name) if fill else None
        if default is not None and tuple(default.shape) != shape:
            default = None
        stacked = torch.zeros((len(rows), *shape), dtype=dtype, device=device)
        for i, t in enumerate(rows):
            readable = isinstance(t, torch.Tensor) and tuple(t.shape) == shape and not t.is_complex()
            if readable and (bool(valid[i]) or rejected_rows == "own"):
                stacked[i] = t.detach().to(device, dtype)
            elif default is not None:
                stacked[i] = default.detach().to(device, dtype)
        out[name] = stacked
    return out


def describe_rejections(reasons: Mapping[int, str]) -> str:
    """One line naming each rejected client and its reason: 'client 1: ...; client 3: ...'."""
    return "; ".join(f"client {i}: {r}" for i, r in sorted(reasons.items()))


class UploadGate:
    """A server's upload checks step after step: the policy, the schema it learns and the source model's values.

    ``check`` validates the state and uploads of one step and returns them stacked [N, ...] (rows of a rejected
    client: its own values where readable, else the source model's value of the entry, else zeros) with the
    accepted clients and the reasons. Used by ``Engine.server_phase``; a network server can keep one too (per-client
    replies through ``by_name``).
    """

    def __init__(self, policy: Optional[UploadPolicy] = None, reference: Optional[Mapping[str, torch.Tensor]] = None,
                 schema: Optional[UploadSchema] = None) -> None:
        self.policy = policy or UploadPolicy()
        self.reference = dict(reference or {})
        self.schema = schema if schema is not None else UploadSchema()

    def check(self, state: Mapping[str, Upload], uploads: Mapping[str, Upload], present: torch.Tensor,
              n_clients: Optional[int] = None) -> CheckedUploads:
        """Validate one step's uploads; see the class docstring."""
        valid, reasons = validate_uploads(state, uploads, present, self.policy, schema=self.schema,
                                          reference=self.reference, n_clients=n_clients)
        fill = {}  # per-client state rows that cannot be read fall back to the source model's value
        for name, value in state.items():
            expected = self.schema.get(name)
            ref = None if isinstance(value, torch.Tensor) or expected is None else namesake(self.reference, name,
                                                                                              expected[0])
            if ref is not None:
                fill[name] = ref
        return CheckedUploads(stack_uploads(state, valid, self.schema, fill),
                              stack_uploads(uploads, valid, self.schema),
                              valid, reasons)
