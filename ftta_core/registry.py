"""Named components: building one with keyword parameters (errors name the bad field), and registering your own.

``register_local("name")`` and ``register_strategy("name")`` (``ftta_core.tta`` / ``ftta_core.strategies``, also
``from ftta_core import ...``) are decorators for a ``LocalMethod`` / ``Strategy`` subclass or a factory function
returning one, made here by ``decorator``. They write into the registries every lookup reads,
``ftta_core.tta.LOCAL_METHODS`` and ``ftta_core.strategies.STRATEGIES``, so a registered name works
wherever a built-in one does (configs, the command line, grids, notebooks). Put the decorated code in a *plugin*
(``ftta_core.plugins``) so that other processes -- the command line, ``run-plan`` workers, notebook kernels -- load it.
"""
from __future__ import annotations

import inspect
import math
from typing import Any, Callable, Dict, Mapping, MutableMapping, Optional, TypeVar

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


def build_named(kind: str, registry: Mapping[str, Callable[..., T]], name: str, params: Dict[str, Any],
                hint: str = "") -> T:
    """``registry[name](**params)``; unknown names or parameters raise ``ValueError`` naming ``kind`` (an unknown
    name's error ends with ``hint``)."""
    if name not in registry:
        raise ValueError(f"{kind}: unknown {name!r}; valid: {sorted(registry)}" + (f" ({hint})" if hint else ""))
    factory = registry[name]
    sig = inspect.signature(factory)
    accepts_any = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
    valid = [p for p in sig.parameters if p != "self"]
    unknown = sorted(set(params) - set(valid))
    if unknown and not accepts_any:
        raise ValueError(f"{kind}_params for {name!r}: unknown parameter(s) {unknown}; valid: {valid}")
    for key, value in params.items():  # one line naming the parameter and its value, before the method sees it
        default = sig.parameters[key].default if key in sig.parameters else inspect.Parameter.empty
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{kind}_params[{key!r}] for {name!r}: must be finite, got {value!r}")
        if isinstance(default, float) and not isinstance(default, bool) and isinstance(value, str):
            raise ValueError(f"{kind}_params[{key!r}] for {name!r}: must be a number (its default is {default!r}), "
                             f"got {value!r}")
    try:
        return factory(**params)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{kind}_params for {name!r}: {exc}") from None


def accepts(registry: Mapping[str, Callable[..., T]], name: str, parameter: str) -> bool:
    """Whether ``registry[name]`` takes a keyword ``parameter`` (e.g. ``seed``)."""
    return name in registry and parameter in inspect.signature(registry[name]).parameters


def _origin(obj: Any) -> tuple:
    """Where ``obj`` was defined: (module, qualified name). The same definition imported again (a re-run notebook
    cell, a reloaded plugin) has the same origin."""
    return getattr(obj, "__module__", None), getattr(obj, "__qualname__", repr(obj))


def _describe(obj: Any) -> str:
    module, qualname = _origin(obj)
    return f"{module}.{qualname}" if module else str(qualname)


def register(kind: str, registry: MutableMapping[str, Callable[..., Any]], name: str, obj: F,
             base: Optional[type] = None, replace: bool = False) -> F:
    """``registry[name] = obj`` after checks: ``name`` a non-empty word, ``obj`` a concrete subclass of ``base`` or a
    factory function, and ``name`` not taken by another definition unless ``replace``. Returns ``obj``.

    Registering the same definition again (same module and qualified name: a re-run notebook cell, a plugin imported
    twice) replaces it silently. A class that does not set its own ``name`` attribute gets ``name``."""
    if not isinstance(name, str) or not name or name != name.strip() or any(c.isspace() for c in name):
        raise ValueError(f"{kind}: the name to register must be a non-empty string without spaces, got {name!r}")
    if isinstance(obj, type):
        if base is not None and not issubclass(obj, base):
            raise TypeError(f"{kind} {name!r}: {_describe(obj)} is not a subclass of {base.__module__}."
                            f"{base.__qualname__} (or a factory function returning one)")
        if inspect.isabstract(obj):
            missing = ", ".join(sorted(getattr(obj, "__abstractmethods__", ())))
            raise TypeError(f"{kind} {name!r}: {_describe(obj)} is abstract: it does not implement {missing}")
    elif not callable(obj):
        raise TypeError(f"{kind} {name!r}: expected a class or a factory function, got {obj!r}")
    existing = registry.get(name)
    if existing is not None and existing is not obj and not replace and _origin(existing) != _origin(obj):
        raise ValueError(f"{kind} {name!r} is already registered by {_describe(existing)} (module "
                         f"{getattr(existing, '__module__', '?')}); choose another name, or pass replace=True to "
                         f"override it deliberately")
    if isinstance(obj, type) and "name" not in vars(obj):
        obj.name = name  # its own name, not one inherited (messages and per-method random streams use it)
    registry[name] = obj
    return obj


def decorator(kind: str, registry: MutableMapping[str, Callable[..., Any]], base: type, doc: str = ""):
    """A registering function for ``registry`` (e.g. ``tta.register_local``): ``register_x(name)`` is a decorator
    for a ``base`` subclass or a factory function, ``register_x(name, obj)`` registers directly; a name already
    taken by another definition raises ``ValueError`` unless ``replace=True`` (``register``)."""
    def register_named(name: str, obj: Optional[F] = None, *, replace: bool = False):
        def decorate(target: F) -> F:
            return register(kind, registry, name, target, base, replace)

        return decorate if obj is None else decorate(obj)

    register_named.__doc__ = doc or register_named.__doc__
    register_named.__name__ = register_named.__qualname__ = "register_" + kind.split()[0]
    return register_named
