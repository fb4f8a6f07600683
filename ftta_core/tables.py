"""Readable tables in notebooks (pandas Styler): ``show(df)``.

What ``show`` does to a results table: columns that belong together (``mean``/``std``/``runs``, ``ours_mean``/
``ours_std``/``seeds``, ``X``/``X sd``, ``mean``/``ci95``/``seeds``) become one "mean ± std (n)" column, missing
values read "–", the best value of each compared column is bold (``<b>`` in its cell: it survives an untrusted
notebook), column names lose their underscores, and every row is shown. Its plain-text form (papermill logs,
terminals) is the same table as text, best cells marked ``*``.
"""
from __future__ import annotations

import html
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import pandas as pd
from pandas.io.formats.style import Styler

MISSING = "–"
COUNTS = ("seeds", "runs", "n")
SPREADS = {"std": "std", "sd": "sd", "ci95": "95% CI"}
NOT_COMPARED = ("difference", "−", " - ", "seeds", "runs", "std", " sd", "ci95", "share")  # never marked best
NAMES = {"ours_mean": "ours", "paper_mean": "paper", "ours_std": "ours std", "paper_std": "paper std"}
BestRule = Union[None, str, Mapping[Any, str]]


def mean_std_text(mean: Any, std: Any = None, n: Any = None, digits: int = 2) -> str:
    """'63.49 ± 0.10 (5)': ``std`` left out when missing or with one run, ``(n)`` only when ``n`` is given;
    '–' when the mean is missing."""
    if mean is None or pd.isna(mean):
        return MISSING
    text = f"{mean:.{digits}f}"
    if std is not None and not pd.isna(std) and (n is None or pd.isna(n) or n > 1):
        text += f" ± {std:.{digits}f}"
    if n is not None and not pd.isna(n):
        text += f" ({int(n)})"
    return text


def blank_missing(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` with its missing cells empty (``""``), as ``fillna("")`` gave before pandas 3 deprecated filling a
    numeric column with a string (``Pandas4Warning``; an error in pandas 4): the numeric columns that have missing
    cells become object columns first, the others keep their dtype."""
    numeric = [c for c in table.columns[table.isna().any()] if pd.api.types.is_numeric_dtype(table[c])]
    return table.astype({c: object for c in numeric}).fillna("")


def readable(name: Any) -> str:
    """A column or index name for people: known names mapped, underscores to spaces, tuples joined."""
    if isinstance(name, tuple):
        return " · ".join(readable(p) for p in name if str(p) != "")
    return NAMES.get(str(name), str(name).replace("_", " "))


def _groups(columns: Sequence[Any]) -> List[Tuple[Any, Optional[Any], Optional[Any], str]]:
    """(value column, spread column, count column, shown name) per output column, in the table's order."""
    cols = list(columns)
    strings = {c for c in cols if isinstance(c, str)}
    used: set = set()
    out = []

    def pick(*names: str) -> Optional[str]:
        return next((c for c in names if c in strings and c not in used), None)

    for c in cols:
        if c in used:
            continue
        spread = count = None
        name = readable(c)
        if c == "mean":
            spread, count = pick("std", "sd", "ci95"), pick(*COUNTS)
            name = "mean"
        elif isinstance(c, str) and c.endswith("_mean"):
            stem = c[: -len("_mean")]
            spread = pick(f"{stem}_std", f"{stem}_sd")
            count = pick(f"{stem}_n", f"{stem}_seeds", *(COUNTS if stem == "ours" else ()))
            name = readable(stem)
        elif isinstance(c, str):
            spread = pick(f"{c} sd", f"{c} std", f"{c}_std", f"{c}_sd")
        if spread is not None or count is not None:
            unit = next((u for suffix, u in SPREADS.items() if str(spread).endswith(suffix)), "std")
            parts = f"mean{' ± ' + unit if spread else ''}"
            name = (f"{parts}{' (n)' if count else ''}" if c == "mean"
                    else f"{name} ({parts}{', n' if count else ''})")
        used.update(x for x in (c, spread, count) if x is not None)
        out.append((c, spread, count, name))
    return out


def _is_compared(name: str) -> bool:
    """Whether a shown column holds values to compare (not a count, spread or difference)."""
    stem = "mean" if name.startswith("mean ±") else name.split(" (mean")[0]
    return not any(word in stem for word in NOT_COMPARED) and stem not in COUNTS


def _best_mask(numeric: pd.DataFrame, best: BestRule, columns: Optional[Sequence[str]]) -> pd.DataFrame:
    """True where a cell holds its column's best value (ties all marked)."""
    mask = pd.DataFrame(False, index=numeric.index, columns=numeric.columns)
    for col in numeric.columns:
        rule = best.get(col) if isinstance(best, Mapping) else best
        if rule is None or (columns is not None and col not in columns) or (columns is None and not _is_compared(col)):
            continue
        values = numeric[col]
        if values.notna().sum() < 2 or values.nunique() < 2:  # nothing to compare: all equal
            continue
        target = values.max() if rule == "max" else values.min()
        mask[col] = np.isclose(values, target) & values.notna()
    return mask


class Table(Styler):
    """A pandas Styler whose plain-text form is the formatted table (what papermill and terminals print)."""

    def __init__(self, data: pd.DataFrame, text: str = "", **kwargs: Any):
        super().__init__(data, **kwargs)
        self.text = text

    def __repr__(self) -> str:
        return self.text

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(self.text)


def cells(table: Union[pd.DataFrame, pd.Series], digits: int = 2) -> Tuple[pd.DataFrame, pd.DataFrame]:
    """(text cells, numbers behind them): grouped mean/spread/count columns joined into 'mean ± std (n)' text with
    the mean as its number; floats to ``digits``; '–' for missing."""
    frame = table.to_frame() if isinstance(table, pd.Series) else table
    text: Dict[str, pd.Series] = {}
    numbers: Dict[str, pd.Series] = {}
    for value, spread, count, name in _groups(frame.columns):
        col = frame[value]
        if spread is not None or count is not None:
            s = frame[spread] if spread is not None else pd.Series(None, index=frame.index)
            n = frame[count] if count is not None else pd.Series(None, index=frame.index)
            text[name] = pd.Series([mean_std_text(m, d, k, digits) for m, d, k in zip(col, s, n)], index=frame.index)
            numbers[name] = pd.to_numeric(col, errors="coerce")
        elif pd.api.types.is_bool_dtype(col):
            text[name] = col.map({True: "yes", False: "no"}).fillna(MISSING)
            numbers[name] = pd.Series(np.nan, index=frame.index)
        elif pd.api.types.is_integer_dtype(col) or (pd.api.types.is_numeric_dtype(col) and value in COUNTS):
            text[name] = col.map(lambda v: MISSING if pd.isna(v) else str(int(v)))
            numbers[name] = col.astype(float)
        elif pd.api.types.is_numeric_dtype(col):
            text[name] = col.map(lambda v: MISSING if pd.isna(v) else f"{v:.{digits}f}")
            numbers[name] = col.astype(float)
        else:
            text[name] = col.map(lambda v: MISSING if pd.api.types.is_scalar(v) and pd.isna(v) else str(v))
            numbers[name] = pd.Series(np.nan, index=frame.index)
    shown = pd.DataFrame(text, index=frame.index)
    shown.index = shown.index.set_names([readable(n) if n is not None else None for n in shown.index.names])
    return shown, pd.DataFrame(numbers, index=frame.index)


def _bold_inline(styled: Styler, mask: pd.DataFrame) -> None:
    """Cell and header text HTML-escaped, and the cells of ``mask`` wrapped in ``<b>``, so the emphasis is in the
    table itself: the Styler's own ``font-weight`` rules sit in a ``<style>`` block, which JupyterLab's sanitizer
    removes from the outputs of an untrusted notebook (one the reader has not run or trusted; ``<style>`` is not among
    its allowed tags, ``<b>`` is: packages/apputils/src/sanitizer.ts; tests/test_lab_roundtrip.py)."""
    styled.format(escape="html").format_index(escape="html", axis=0).format_index(escape="html", axis=1)
    for j, column in enumerate(mask.columns):
        rows = mask.iloc[:, j].to_numpy(dtype=bool)
        if rows.any():
            styled.format(lambda v: f"<b>{html.escape(str(v))}</b>", subset=(rows, [column]))


def show(table: Union[pd.DataFrame, pd.Series], digits: int = 2, best: BestRule = "max",
         best_columns: Optional[Sequence[str]] = None, caption: str = "") -> Table:
    """``table`` as a styled, fully shown table (see the module docstring). ``best``: 'max', 'min', None, or a
    mapping from shown column name to 'max'/'min'; ``best_columns``: the shown columns to mark (default: every
    numeric column that is not a count, spread or difference)."""
    shown, numbers = cells(table, digits)
    mask = _best_mask(numbers, best, best_columns)
    marked = shown.where(~mask, shown + " *")
    text = marked.to_string()
    if mask.values.any():
        text += "\n(* best in its column)"
    if caption:
        text = f"{caption}\n{text}"
    styled = Table(shown, text)
    styled.apply(lambda _: np.where(mask.values, "font-weight: bold", ""), axis=None)
    _bold_inline(styled, mask)
    styled.set_properties(**{"text-align": "right"})
    if caption:
        styled.set_caption(caption)
    return styled
