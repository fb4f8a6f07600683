"""Local test-time adaptation methods (one small module each) and their registry."""
from __future__ import annotations

from typing import Any, Callable, Dict

from ..registry import build_named
from .base import GradientMethod, LocalMethod, select_parameters
from .basic import BatchNormAdapt, PseudoLabel, Source, Tent, entropy
from .cotta import CoTTA
from .eata import EATA
from .roid import ROID
from .rotta import RoTTA
from .bbn import BBN

LOCAL_METHODS: Dict[str, Callable[..., LocalMethod]] = {
    "source": Source,
    "bn": BatchNormAdapt,
    "tent": Tent,
    "pl": PseudoLabel,
    "eata": EATA,
    "cotta": CoTTA,
    "roid": ROID,
    "rotta": RoTTA,
    "bbn": BBN,
}


def build_local(name: str, **params: Any) -> LocalMethod:
    """Instantiate local method ``name`` with its keyword parameters (errors name the bad field)."""
    return build_named("local", LOCAL_METHODS, name, params)


__all__ = ["LOCAL_METHODS", "build_local", "LocalMethod", "GradientMethod", "select_parameters", "entropy",
           "Source", "BatchNormAdapt", "Tent", "PseudoLabel", "EATA", "CoTTA", "ROID", "RoTTA", "BBN"]
