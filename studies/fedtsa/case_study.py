"""The case study of FedTSA Table 4 / Figs 5-6 (10 clients in three groups that walk the corruptions at different
times; FedCTTA's Table III runs it with its own orders): accuracy per group and slot, which domain each group sees,
and the reading computed from them (``python -m ftta_core study fedtsa case-study``, notebook 12)."""
from __future__ import annotations

from typing import Mapping, Optional, Sequence

import pandas as pd

from ftta_core.scenarios import CASE_STUDY_ALL, CASE_STUDY_GROUPS
from ftta_core.workbook import StoredRun
from studies.readings import ordering_phrase


def case_study_table(runs: Mapping[str, StoredRun]) -> pd.DataFrame:
    """Accuracy (%) after mixing per group and strategy (rows) and slot (columns), plus the mean over slots: the
    shape of FedTSA Table 4 / FedCTTA Table III (``case_study_domains`` says which domain each group sees)."""
    rows = []
    for strategy, run in runs.items():
        for group, clients in {**CASE_STUDY_GROUPS, CASE_STUDY_ALL: range(10)}.items():
            g = run.slots[run.slots.client.isin(list(clients))]
            g = g.assign(c=g.accuracy_mixed * g.n).groupby("slot")[["c", "n"]].sum()
            rows.append({"group": group, "strategy": strategy, **(g.c / g.n).to_dict(), "mean": g.c.sum() / g.n.sum()})
    return pd.DataFrame(rows).set_index(["group", "strategy"])


def case_study_domains(run: StoredRun) -> pd.DataFrame:
    """The domain each case-study group sees in each slot (rows: group, columns: slot)."""
    first = {group: clients[0] for group, clients in CASE_STUDY_GROUPS.items()}
    s = run.slots
    return pd.DataFrame({group: s[s.client == c].set_index("slot").domain for group, c in first.items()}).T


def case_study_reading(table: pd.DataFrame, shares: pd.DataFrame, same: pd.DataFrame, domains: pd.DataFrame,
                       paper_mean: Mapping[str, float], slot: int, n_clients: int, seeds: Sequence[int],
                       labels: Optional[Mapping[str, str]] = None) -> str:
    """The case study's reading, computed from its tables (FedTSA Table 4 and Fig 5 shapes): the ordering of the
    strategies' mean accuracy beside the paper's (methods both have), then, in the highlighted ``slot``, how much
    of the weight each client gives to other clients goes to clients on its own corruption (against uniform
    mixing), and what groups 1 and 3 take from each other and from group 2.

    ``table``: ``case_study_table``; ``shares``: ``group_weight_shares`` per strategy label (first index level);
    ``same``: ``same_domain_weight`` per strategy label (index (label, client)); ``domains``:
    ``case_study_domains``; ``paper_mean``: the paper's mean per method label over the same slots."""
    name = (lambda s: (labels or {}).get(s, s))
    groups = list(CASE_STUDY_GROUPS)
    ours = table.xs(CASE_STUDY_ALL, level="group")["mean"].rename(index=name)
    parts = [f"**Accuracy** (all clients, mean over the slots run; seed{'s' if len(seeds) > 1 else ''} "
             f"{', '.join(map(str, seeds))}): {ordering_phrase(ours)}."]
    both = [m for m in ours.index if m in paper_mean and not pd.isna(paper_mean[m])]
    if len(both) >= 2:
        ours_order = sorted(both, key=lambda m: -ours[m])
        paper_order = sorted(both, key=lambda m: -paper_mean[m])
        parts.append(f"On the methods the paper's Table 4 also has, our order is {' > '.join(ours_order)} and the "
                     f"paper's {' > '.join(paper_order)} ({'the same' if ours_order == paper_order else 'different'}).")
    if len(seeds) < 2:
        parts.append("One seed: none of these differences is tested against seed noise.")
    if len(same):
        rows = []
        for label, g in same.groupby(level=0, sort=False):
            others = (1 - g["self"]).clip(lower=1e-12)
            share = float((g["same domain"] / others).mean())
            uniform = float((g["uniform same-domain"] * n_clients / (n_clients - 1)).mean())
            rows.append((label, float(g["self"].mean()), share, uniform))
        rows.sort(key=lambda r: -(r[2] - r[3]))
        parts.append(f"**Slot {slot}, by corruption.** Of the weight a client gives to other clients, the share on "
                     "clients with its own corruption (mean over clients; uniform mixing in brackets), highest excess "
                     "first: " + "; ".join(f"{lab} {s:.2f} ({u:.2f}), keeping {k:.2f} on itself"
                                           for lab, k, s, u in rows) + ".")
    if len(shares) and slot in domains.columns and len(groups) == 3:
        g1, g2, g3 = groups
        same13 = domains.loc[g1, slot] == domains.loc[g3, slot]
        seen = f"the same corruption ({domains.loc[g1, slot]})" if same13 else "different corruptions"
        size = {g: len(CASE_STUDY_GROUPS[g]) / n_clients for g in groups}
        said = []
        for label in dict.fromkeys(shares.index.get_level_values(0)):
            s = shares.loc[label]
            said.append(f"{label}: {g1} → {g3} {s.loc[g1, g3]:.2f}, {g3} → {g1} {s.loc[g3, g1]:.2f}, "
                        f"{g1} → {g2} {s.loc[g1, g2]:.2f}, {g3} → {g2} {s.loc[g3, g2]:.2f}")
        parts.append(f"**Slot {slot}, by group.** The groups {g1} and {g3} see "
                     f"{seen}"
                     f" here; {g2} sees {domains.loc[g2, slot]}"
                     + (f", after seeing {domains.loc[g1, slot]} in slot {slot - 1}" if slot - 1 in domains.columns
                        and domains.loc[g2, slot - 1] == domains.loc[g1, slot] else "")
                     + f". Share of one group's weight on another group's clients (A → B; uniform mixing gives "
                     f"{g1} {size[g1]:.2f}, {g2} {size[g2]:.2f}, {g3} {size[g3]:.2f}): " + "; ".join(said) + ".")
    return "\n\n".join(parts)
