"""Local test-time adaptation methods (one small module each) and their registry."""
from __future__ import annotations

from typing import Any, Callable, Dict

from ..registry import build_named, decorator
from .base import GradientMethod, LocalMethod, select_parameters
from .basic import BatchNormAdapt, PseudoLabel, Source, Tent, entropy
from .cotta import CoTTA
from .eata import EATA
from .roid import ROID
from .rotta import RoTTA
from .bbn import BBN
from .anchored_tent import AnchoredTent
from .tentprox import TentProx
from .rdumb import RDumb
from .tentrestore import TentRestore

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
    "tentprox": TentProx,
    "rdumb": RDumb,
    "tentrestore": TentRestore,
}

register_local = decorator("local method", LOCAL_METHODS, LocalMethod, """Register a local method under ``name``:
``@register_local("mytent")`` on a ``LocalMethod`` subclass or a factory function (keyword parameters = the config's
``local_params``). ``register_local(name, obj)`` registers directly. A name already taken by another definition
raises ``ValueError`` unless ``replace=True``.""")


def build_local(name: str, **params: Any) -> LocalMethod:
    """Instantiate local method ``name`` with its keyword parameters (errors name the bad field)."""
    if name not in LOCAL_METHODS:  # perhaps a method of a plugin not loaded yet ($FTTA_PLUGINS, entry points)
        from ..plugins import PLUGIN_HINT, load_plugins

        load_plugins()
        return build_named("local", LOCAL_METHODS, name, params, hint=PLUGIN_HINT)
    return build_named("local", LOCAL_METHODS, name, params)


__all__ = ["LOCAL_METHODS", "build_local", "register_local", "LocalMethod", "GradientMethod", "select_parameters", "entropy",
           "Source", "BatchNormAdapt", "Tent", "PseudoLabel", "EATA", "CoTTA", "ROID", "RoTTA", "BBN",
           "AnchoredTent", "TentProx", "RDumb", "TentRestore"]
