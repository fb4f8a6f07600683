"""Workbook helpers that turn stored runs into the papers' table shapes."""
import numpy as np
import pandas as pd

from ftta_core.workbook import CASE_STUDY_GROUPS, StoredRun, case_study_table, group_weight_shares, markdown_table


def test_group_weight_shares_split_each_row_of_w():
    w = np.zeros((2, 10, 10))
    w[:, :4, :4] = 0.25  # group 1 averages within itself
    w[:, 4:, 4:] = np.eye(6)  # the others keep their own model
    shares = group_weight_shares(w)
    assert np.allclose(shares.loc["clients 1-4", ["self", "own group (others)"]], [0.25, 0.75])
    assert np.allclose(shares.loc["clients 5-7", "self"], 1.0)
    assert np.allclose(shares.fillna(0).sum(1), 1.0)


def test_case_study_table_weights_slots_by_predictions():
    rows = [{"slot": s, "client": c, "domain": "d", "n": 10, "accuracy_mixed": 100.0 * (c < 4)}
            for s in range(2) for c in range(10)]
    run = StoredRun({}, np.zeros((1, 10, 10)), pd.DataFrame(rows))
    table = case_study_table({"fedavg": run})
    assert table.loc[("clients 1-4", "fedavg"), "mean"] == 100.0
    assert table.loc[("clients 8-10", "fedavg"), 0] == 0.0
    assert table.loc[("all clients", "fedavg"), "mean"] == 40.0
    assert len(CASE_STUDY_GROUPS) == 3
    assert markdown_table(table).count("\n") == len(table) + 2
