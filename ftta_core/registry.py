"""Building a named component with keyword parameters, with errors that name the bad field."""
from __future__ import annotations

import inspect
from typing import Any, Callable, Dict, Mapping, TypeVar

T = TypeVar("T")


def build_named(kind: str, registry: Mapping[str, Callable[..., T]], name: str, params: Dict[str, Any]) -> T:
    """``registry[name](**params)``; unknown names or parameters raise ``ValueError`` naming ``kind``."""
    if name not in registry:
        raise ValueError(f"{kind}: unknown {name!r}; valid: {sorted(registry)}")
    factory = registry[name]
    sig = inspect.signature(factory)
    accepts_any = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
    valid = [p for p in sig.parameters if p != "self"]
    unknown = sorted(set(params) - set(valid))
    if unknown and not accepts_any:
        raise ValueError(f"{kind}_params for {name!r}: unknown parameter(s) {unknown}; valid: {valid}")
    try:
        return factory(**params)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{kind}_params for {name!r}: {exc}") from None


def accepts(registry: Mapping[str, Callable[..., T]], name: str, parameter: str) -> bool:
    """Whether ``registry[name]`` takes a keyword ``parameter`` (e.g. ``seed``)."""
    return name in registry and parameter in inspect.signature(registry[name]).parameters
