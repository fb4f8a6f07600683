"""A variant of a run as data: the config fields it sets and its typed parameters, never a label read back.

A study's grid names each variant for display (``"T=4, scale=none"``, ``"interval 3"``), but what the variant *is*
lives in a ``Variant``: ``overrides`` (the ``ExperimentConfig`` fields it sets, e.g. ``{"strategy": "pfedbbn",
"strategy_params": {"temperature": 4.0}}``) and ``factors`` (the study's parameters of it, typed, e.g. ``{"T": 4.0,
"scale": "none"}``: also those left at their defaults, which ``overrides`` omits so that a default run keeps the
config hash of the plain run). A grid's tidy table gets one column per factor from ``with_factors``; no code parses
a label to recover a parameter (``tests/test_variants.py`` greps the studies and notebooks for that).

The grid runner (``grid.run``, behind ``workbook.run_grid``, ``stored_summaries`` and the studies' live grids) takes
a ``Variant`` or a plain mapping of overrides where a variant is expected (``overrides_of``), and adds the factor
columns itself. ``strategy_variant`` builds the variant of one strategy with its parameters (which may hold live
objects, e.g. a tensor: such a variant runs in memory, ``grid.MemoryStore``).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional, Sequence

import pandas as pd


@dataclass(frozen=True)
class Variant:
    """One variant of a grid: the config fields it sets (``overrides``) and its typed parameters (``factors``)."""

    overrides: Mapping[str, Any] = field(default_factory=dict)
    factors: Mapping[str, Any] = field(default_factory=dict)

    def config(self, base: Any, **more: Any) -> Any:
        """``base`` (an ``ExperimentConfig``) with this variant's fields and ``more`` (e.g. ``seed``) set."""
        return dataclasses.replace(base, **dict(self.overrides), **more)

    # a Variant reads like the mapping of overrides it replaces (``variant["strategy_params"]``, ``.get``, ``**``)
    def __getitem__(self, key: str) -> Any:
        return self.overrides[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.overrides.get(key, default)

    def keys(self):  # noqa: D102 -- with __getitem__: dict(variant) and **variant give the overrides
        return self.overrides.keys()


def strategy_variant(strategy: str, params: Optional[Mapping[str, Any]] = None,
                     config: Optional[Mapping[str, Any]] = None,
                     factors: Optional[Mapping[str, Any]] = None) -> Variant:
    """The variant that runs ``strategy`` with ``params`` (its ``strategy_params``; none: its defaults) and sets the
    config fields ``config``, with ``factors``."""
    return Variant({**dict(config or {}), "strategy": strategy, "strategy_params": dict(params or {})},
                   dict(factors or {}))


def strategy_variants(strategies: Sequence[str]) -> Dict[str, Variant]:
    """One variant per strategy at its defaults, labelled by the strategy's name (no factors)."""
    return {s: strategy_variant(s) for s in strategies}


def overrides_of(variant: Any) -> Dict[str, Any]:
    """The config fields ``variant`` sets: a ``Variant``'s ``overrides``, or a plain mapping as it is."""
    return dict(variant.overrides if isinstance(variant, Variant) else variant)


def factors_of(variant: Any) -> Dict[str, Any]:
    """``variant``'s typed parameters (``factors``; none for a plain mapping of overrides)."""
    return dict(getattr(variant, "factors", None) or {})


def factor_table(variants: Mapping[str, Any]) -> pd.DataFrame:
    """One row per variant name (index ``variant``), one column per factor any of them has (missing: NaN)."""
    rows = {name: factors_of(v) for name, v in variants.items()}
    columns = list(dict.fromkeys(k for factors in rows.values() for k in factors))
    return pd.DataFrame.from_dict(rows, orient="index", columns=columns).rename_axis("variant")


def with_factors(table: pd.DataFrame, variants: Mapping[str, Any], on: str = "variant") -> pd.DataFrame:
    """``table`` (rows named by variant in column ``on``) with each variant's factors as columns, row order kept; a
    factor column ``table`` already has is left as it is. Raises when a row names no variant of ``variants``."""
    unknown = sorted(set(table[on]) - set(variants))
    if unknown:
        raise ValueError(f"with_factors: rows name variants that are not given: {unknown[:5]}")
    factors = factor_table(variants)
    factors = factors[[c for c in factors.columns if c not in table.columns]]
    return table.join(factors, on=on)


__all__ = ["Variant", "factor_table", "factors_of", "overrides_of", "strategy_variant", "strategy_variants",
           "with_factors"]
