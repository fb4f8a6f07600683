"""Server strategies (one small module each) and their registry."""
from __future__ import annotations

from typing import Any, Callable, Dict

from ..registry import build_named, decorator
from .base import ServerInputs, Strategy, check_collaboration, row_softmax
from .basic import FedAvg, FedAvgFT, Local
from .fedamp import FedAMP
from .fedavg_localstats import FedAvgLocalStats
from .fedavgm import FedAvgM
from .fedtsa import FedTSA
from .fedctta import FedCTTA
from .fedprox import FedProx
from .fedprox_source import FedProxSource
from .ldawa import LDAWA
from .moon import MOON
from .pfedbbn import PFedBBN
from .pfedgraph import PFedGraph
from .pfedsd import PFedSD

STRATEGIES: Dict[str, Callable[..., Strategy]] = {
    "local": Local,
    "fedavg": FedAvg,
    "fedavg_ft": FedAvgFT,
    "fedavgm": FedAvgM,
    "fedavg_localstats": FedAvgLocalStats,
    "fedprox": FedProx,
    "fedprox_source": FedProxSource,
    "fedamp": FedAMP,
    "pfedgraph": PFedGraph,
    "ldawa": LDAWA,
    "moon": MOON,
    "pfedsd": PFedSD,
    "fedtsa": FedTSA,
    "fedctta": FedCTTA,
    "pfedbbn": PFedBBN,
}

register_strategy = decorator("strategy", STRATEGIES, Strategy, """Register a server strategy under ``name``:
``@register_strategy("mystrat")`` on a ``Strategy`` subclass or a factory function (keyword parameters = the config's
``strategy_params``). ``register_strategy(name, obj)`` registers directly. A name already taken by another definition
raises ``ValueError`` unless ``replace=True``.""")


def build_strategy(name: str, **params: Any) -> Strategy:
    """Instantiate strategy ``name`` with its keyword parameters (errors name the bad field)."""
    if name not in STRATEGIES:  # perhaps a method of a plugin not loaded yet ($FTTA_PLUGINS, entry points)
        from ..plugins import PLUGIN_HINT, load_plugins

        load_plugins()
        return build_named("strategy", STRATEGIES, name, params, hint=PLUGIN_HINT)
    return build_named("strategy", STRATEGIES, name, params)


__all__ = ["STRATEGIES", "build_strategy", "register_strategy", "Strategy", "ServerInputs", "check_collaboration",
           "row_softmax",
           "Local", "FedAvg", "FedAvgFT", "FedAvgM", "FedProx", "FedAMP", "PFedGraph", "LDAWA", "MOON", "PFedSD",
           "PFedBBN"]
