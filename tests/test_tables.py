"""Styled notebook tables: 'mean ± std (n)' cells, '–' for missing, best per column marked, all rows shown."""
import numpy as np
import pandas as pd

from ftta_core import tables
from ftta_core.workbook import format_mean_std, mean_std


def _beside():
    return pd.DataFrame({"method": ["Local", "FedAvg", "FedTSA"], "ours_mean": [63.49, 64.1, np.nan],
                         "ours_std": [0.1, 0.2, np.nan], "seeds": [5, 1, 0], "paper_mean": [60.0, np.nan, 62.0],
                         "paper_std": [1.0, np.nan, 0.5], "difference": [3.49, np.nan, np.nan]}).set_index("method")


def _bold(styled):
    ctx = styled._compute().ctx
    shown = styled.data
    return {(shown.index[i], shown.columns[j]) for (i, j), props in ctx.items() if ("font-weight", "bold") in props}


def test_mean_std_cells_readable_names_and_missing():
    shown, numbers = tables.cells(_beside())
    assert list(shown.columns) == ["ours (mean ± std, n)", "paper (mean ± std)", "difference"]
    assert shown.loc["Local", "ours (mean ± std, n)"] == "63.49 ± 0.10 (5)"
    assert shown.loc["FedAvg", "ours (mean ± std, n)"] == "64.10 (1)"  # one seed: no spread
    assert shown.loc["FedTSA", "ours (mean ± std, n)"] == "–"
    assert shown.loc["FedAvg", "difference"] == "–"
    assert numbers.loc["FedAvg", "ours (mean ± std, n)"] == 64.1


def test_best_per_column_is_bold_and_differences_are_not_marked():
    styled = tables.show(_beside())
    assert _bold(styled) == {("FedAvg", "ours (mean ± std, n)"), ("FedTSA", "paper (mean ± std)")}
    assert "font-weight: bold" in styled.to_html()
    assert "–" in styled.to_html()
    assert _bold(tables.show(_beside(), best="min")) == {("Local", "ours (mean ± std, n)"),
                                                         ("Local", "paper (mean ± std)")}


def test_plain_text_is_the_table_with_every_row():
    big = pd.DataFrame({"accuracy": np.arange(80, dtype=float)})
    text = repr(tables.show(big))
    assert "rows x" not in text and "79.00 *" in text and len(text.splitlines()) == 80 + 2


def test_workbook_mean_std_strings_use_the_same_format():
    t = mean_std(pd.DataFrame({"variant": ["a", "a", "b"], "accuracy": [1.0, 3.0, np.nan]}))
    assert list(format_mean_std(t)) == ["2.00 ± 1.41", "–"]
