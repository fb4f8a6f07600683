"""Attack injection: chosen clients lie in what they upload, within the bounds the server's gate accepts.

``Attack(kind, clients)`` rewrites the attacker clients' rows of one step's shared state and uploads before the
server's checks (``Engine.server_phase`` applies it; the config's ``attack`` field, ``--attack KIND:IDS``). What
each kind rewrites, per attacker row ``x`` of an entry:

* ``bn_x5`` -- BN statistics x5: every BN-statistics entry of the state (``layers.is_bn_stats``: [N, 2, C], mean
  and variance) times 5. Under a method that shares no BN statistics (Tent's parameters) it rewrites nothing.
* ``sign_flip`` -- parameters sign-flipped: every floating-point state entry that is not BN statistics, ``-x``.
  Under TTA-bn (statistics only) it rewrites nothing.
* ``mean_shift`` -- a mean shift of 5 x mean|x|: every floating-point entry of the state and of the strategy's
  uploads, ``x + 5 * mean(|x|)`` (the mean over the attacker's row of that entry).

Each is 5x-scaled or sign-changed, inside the gate's magnitude bound (8x the median client's RMS, ``engine
.uploads``), so the gate lets it through; robust mixing (``engine.robust``) is what limits its effect. Tensors are
rewritten out of place (the clients' banks are never touched) and honest rows are passed on as they came. The
attackers' own models still receive the server's mix: measure honest clients without them (the summary's
``accuracy_honest``).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, Mapping, Optional, Sequence, Tuple, Union

import torch

from .layers import is_bn_stats

ATTACKS = ("bn_x5", "sign_flip", "mean_shift")
SCALE = 5.0  # the factor of bn_x5 and of mean_shift's shift (in units of mean|x|)
SPEC_HELP = "'none' or 'KIND:IDS' with KIND one of bn_x5, sign_flip, mean_shift and IDS comma-separated client ids"

Upload = Union[torch.Tensor, Sequence[Optional[torch.Tensor]]]


@dataclass(frozen=True)
class Attack:
    """Attack ``kind`` (``ATTACKS``) by the clients ``clients`` (ids, distinct, ascending)."""

    kind: str
    clients: Tuple[int, ...]

    def __post_init__(self) -> None:
        if self.kind not in ATTACKS:
            raise ValueError(f"attack kind must be one of {ATTACKS}, got {self.kind!r}")
        ids = tuple(int(i) for i in self.clients)
        if not ids or any(i < 0 for i in ids) or len(set(ids)) != len(ids):
            raise ValueError(f"attackers must be distinct client ids >= 0, at least one, got {list(self.clients)}")
        object.__setattr__(self, "clients", tuple(sorted(ids)))

    @property
    def spec(self) -> str:
        """As the config writes it: 'bn_x5:0,7'."""
        return f"{self.kind}:{','.join(map(str, self.clients))}"

    def check_clients(self, n_clients: int) -> None:
        """Raise ``ValueError`` when an attacker id is not one of ``n_clients`` clients."""
        outside = [i for i in self.clients if i >= n_clients]
        if outside:
            raise ValueError(f"attacker id(s) {outside} are not clients 0..{n_clients - 1}")

    def rewrites(self, name: str, value: torch.Tensor, upload: bool) -> bool:
        """Whether this attack rewrites entry ``name`` (stacked [N, ...]; ``upload``: a strategy upload, not the
        shared state)."""
        if not value.is_floating_point():
            return False
        if self.kind == "mean_shift":
            return True
        if upload:
            return False
        return is_bn_stats(name, value) if self.kind == "bn_x5" else not is_bn_stats(name, value)

    def lie(self, x: torch.Tensor) -> torch.Tensor:
        """One attacker row (or rows) ``x`` as this attack sends it."""
        if self.kind == "bn_x5":
            return x * SCALE
        if self.kind == "sign_flip":
            return -x
        dims = tuple(range(1, x.dim()))
        return x + SCALE * x.abs().mean(dim=dims, keepdim=True)

    def _entry(self, name: str, value: Upload, upload: bool) -> Upload:
        if isinstance(value, torch.Tensor):
            if not self.rewrites(name, value, upload):
                return value
            ids = torch.tensor([i for i in self.clients if i < value.shape[0]], dtype=torch.long, device=value.device)
            out = value.clone()
            out[ids] = self.lie(value[ids])
            return out
        rows = list(value)  # one tensor (or None) per client: rewritten like a stacked entry, row by row
        for i in self.clients:
            if i < len(rows) and isinstance(rows[i], torch.Tensor) and self.rewrites(name, rows[i][None], upload):
                rows[i] = self.lie(rows[i][None])[0]
        return rows

    def apply(self, state: Mapping[str, Upload], uploads: Mapping[str, Upload]
              ) -> Tuple[Dict[str, Upload], Dict[str, Upload]]:
        """The step's shared state and uploads as the attackers send them (new tensors where rewritten)."""
        return ({k: self._entry(k, v, False) for k, v in state.items()},
                {k: self._entry(k, v, True) for k, v in uploads.items()})


def parse_attack(spec: str) -> Optional[Attack]:
    """``Attack`` of a spec (``SPEC_HELP``); None for 'none'. An invalid spec raises ``ValueError``."""
    if not isinstance(spec, str):
        raise ValueError(f"must be {SPEC_HELP}, got {spec!r}")
    if spec.strip() == "none":
        return None
    m = re.fullmatch(r"\s*([a-z_0-9]+)\s*:\s*([0-9]+(?:\s*,\s*[0-9]+)*)\s*", spec)
    if m is None:
        raise ValueError(f"must be {SPEC_HELP}, got {spec!r}")
    try:
        return Attack(m.group(1), tuple(int(i) for i in m.group(2).split(",")))
    except ValueError as err:
        raise ValueError(f"must be {SPEC_HELP}, got {spec!r} ({err})") from None
