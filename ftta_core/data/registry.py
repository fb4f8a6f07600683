"""One entry point for every dataset: ``load_dataset(name, split, root=None, **kwargs)``.

Names: ``cifar10``, ``cifar100`` (splits train|test); ``office_caltech10/<domain>`` (split ``all``: a domain is
used whole; kwarg ``size``); ``digits/<domain>`` (train|test; kwarg ``size``); ``embedded_digits``
(train|test|all; kwarg ``size``; needs no data root, ``root`` is ignored).
"""
from __future__ import annotations

from typing import Any, Callable, Dict

from .base import ImageArray
from .cifar import load_cifar10, load_cifar100
from .digits import DIGIT_DOMAINS, load_digit_domain, load_embedded_digits
from .office import OFFICE_DOMAINS, load_office_caltech10
from .root import PathLike


def _office(domain: str) -> Callable[..., ImageArray]:
    """Registry adapter for one Office-Caltech-10 domain (only split "all")."""

    def load(split: str, root: PathLike | None = None, **kwargs: Any) -> ImageArray:
        if split != "all":
            raise ValueError(f"office_caltech10/{domain} has no official split: use split='all', got {split!r}")
        return load_office_caltech10(domain, root=root, **kwargs)

    return load


def _digits(domain: str) -> Callable[..., ImageArray]:
    """Registry adapter for one digit domain."""
    return lambda split, root=None, **kwargs: load_digit_domain(domain, split, root=root, **kwargs)


_LOADERS: Dict[str, Callable[..., ImageArray]] = {
    "cifar10": lambda split, root=None: load_cifar10(split, root=root),
    "cifar100": lambda split, root=None: load_cifar100(split, root=root),
    **{f"office_caltech10/{d}": _office(d) for d in OFFICE_DOMAINS},
    **{f"digits/{d}": _digits(d) for d in DIGIT_DOMAINS},
    "embedded_digits": lambda split, root=None, **kwargs: load_embedded_digits(split, **kwargs),
}
DATASETS = tuple(_LOADERS)


def loader_module(name: str) -> str:
    """The module whose loader reads dataset ``name`` (what a run that uses it depends on)."""
    if name not in _LOADERS:
        raise ValueError(f"unknown dataset {name!r}; valid names: {', '.join(DATASETS)}")
    module = "cifar" if name.startswith("cifar") else "office" if name.startswith("office") else "digits"
    return f"{__name__.rsplit('.', 1)[0]}.{module}"


def load_dataset(name: str, split: str, root: PathLike | None = None, **kwargs: Any) -> ImageArray:
    """Load dataset ``name`` (one of ``DATASETS``), ``split``, from the data root; kwargs go to the loader."""
    if name not in _LOADERS:
        raise ValueError(f"unknown dataset {name!r}; valid names: {', '.join(DATASETS)}")
    return _LOADERS[name](split, root=root, **kwargs)
