"""FedCTTA's Figs. 3-4 read off the case study's stored W (``study fedtsa case-study --orders fedctta``): does W cluster the
clients that see the same distribution (Fig. 3c), and does client 1 turn to clients 8-10 in the slot where they see
its corruption (Fig. 4, "at the 8th distribution shift")?

Both are measured against uniform mixing (FedAvg), the share a client would give the same clients without any
similarity: a share above it is weight moved towards them, one below it weight moved away.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Mapping

import numpy as np
import pandas as pd

from ftta_core.scenarios import CASE_STUDY_GROUPS

if TYPE_CHECKING:
    from ftta_core.workbook import StoredRun

TIE = 0.01  # shares of W closer than this (absolute) are read as equal
MEET_SLOT = 7  # clients 8-10 walk the corruptions in reverse: they meet clients 1-4 on the middle one (slot 8 of 15)
FIRST, LAST = CASE_STUDY_GROUPS["clients 1-4"], CASE_STUDY_GROUPS["clients 8-10"]


def cluster_table(runs: Mapping[str, "StoredRun"]) -> pd.DataFrame:
    """One row per run: the mean weight a client keeps on itself, puts on the rest of its group and on the clients
    seeing its corruption at that step (each beside uniform mixing's share), and client 1's weight on clients 8-10
    in the slot where they see its corruption and in the other slots (uniform: 0.3), and that slot's rank among
    all slots by this weight (1: the highest)."""
    from ftta_core.workbook import same_domain_weight, summary_config

    rows = {}
    for name, run in runs.items():
        cfg = summary_config(run.summary)
        w = np.asarray(run.collaboration, dtype=np.float64)
        n = w.shape[1]
        slot_steps = cfg.images_per_client // cfg.batch_size
        same = same_domain_weight(w, cfg).mean()
        members = [(i, list(g)) for g in CASE_STUDY_GROUPS.values() for i in g]
        own = np.mean([w[:, i, g].sum(-1).mean() - w[:, i, i].mean() for i, g in members])
        own_uniform = np.mean([(len(g) - 1) / n for i, g in members])
        given = [1 - w[:, i, i].mean() for i, _ in members]
        own_given = np.mean([(w[:, i, g].sum(-1).mean() - w[:, i, i].mean()) / max(o, 1e-12)
                             for (i, g), o in zip(members, given)])
        to_last = w[:, FIRST[0], list(LAST)].sum(-1)
        per_slot = pd.Series(to_last).groupby(np.arange(len(to_last)) // slot_steps).mean()
        others = per_slot.drop(MEET_SLOT)
        rows[name] = {"self": float(np.mean([w[:, i, i].mean() for i in range(n)])),
                      "own group": float(own), "own group, uniform": float(own_uniform),
                      "own group, of the weight given away": float(own_given),
                      "own group, of the weight given away, uniform": float(np.mean([(len(g) - 1) / (n - 1)
                                                                                     for _, g in members])),
                      "same corruption": float(same["same domain"]),
                      "same corruption, uniform": float(same["uniform same-domain"]),
                      "client 1 on 8-10, meeting slot": float(per_slot[MEET_SLOT]),
                      "client 1 on 8-10, other slots": float(others.mean()),
                      "meeting slot's rank": int((per_slot > per_slot[MEET_SLOT]).sum() + 1),
                      "client 1 on 8-10, range over slots": float(per_slot.max() - per_slot.min()),
                      "slots": len(per_slot), "uniform on 8-10": len(LAST) / n}
    return pd.DataFrame(rows).T


def cluster_reading(table: pd.DataFrame, label: Callable[[str], str] = str) -> str:
    """Fig. 3c's and Fig. 4's claims checked on ``cluster_table``, one sentence per run: how its weight on the own
    group and on same-corruption clients compares with uniform mixing (in all of W, and within the weight a client
    gives away), and whether client 1's weight on clients 8-10 is highest in the slot where they meet. Shares closer
    than ``TIE`` read as equal."""
    def versus(ours: float, uniform: float) -> str:
        return "above" if ours > uniform + TIE else "below" if ours < uniform - TIE else "equal to"

    lines = []
    for name, r in table.iterrows():
        rank, meet, rest = int(r["meeting slot's rank"]), r["client 1 on 8-10, meeting slot"], r["client 1 on 8-10, other slots"]
        turn = ("it is the same in every slot" if r["client 1 on 8-10, range over slots"] < 1e-6
                else f"that slot ranks {rank} of {int(r['slots'])}, " + (
                    "so client 1 turns to them most where they meet, as the paper's Fig. 4 says"
                    if rank == 1 and meet > rest + TIE else "so client 1 does not turn to them most where they meet"))
        lines.append(
            f"- **{label(name)}**: keeps {r['self']:.2f} on itself. The rest of its group gets {r['own group']:.3f}, "
            f"{versus(r['own group'], r['own group, uniform'])} uniform mixing's {r['own group, uniform']:.3f}; the "
            f"clients on its corruption {r['same corruption']:.3f}, {versus(r['same corruption'], r['same corruption, uniform'])} "
            f"uniform's {r['same corruption, uniform']:.3f}. Of the weight it gives away, its group gets "
            f"{r['own group, of the weight given away']:.2f}, "
            f"{versus(r['own group, of the weight given away'], r['own group, of the weight given away, uniform'])} "
            f"uniform's {r['own group, of the weight given away, uniform']:.2f}. Client 1's weight on clients 8-10: "
            f"{meet:.3f} in the slot where they see its corruption, {rest:.3f} in the others (uniform "
            f"{r['uniform on 8-10']:.2f}); {turn}.")
    return "\n".join(lines)


def uniform_departure(weights: np.ndarray, slot_steps: int, threshold: float = 1e-3) -> pd.DataFrame:
    """How far W [T, N, N] is from uniform mixing (every entry 1/N), per slot: the largest |W_ij - 1/N| in the
    slot, and the first step at which it exceeds ``threshold`` (``first step above``, -1 if never; the same in every
    row)."""
    w = np.asarray(weights, dtype=np.float64)
    dev = np.abs(w - 1.0 / w.shape[1]).max(axis=(1, 2))
    above = np.flatnonzero(dev > threshold)
    per_slot = pd.Series(dev).groupby(np.arange(len(dev)) // slot_steps).max()
    return pd.DataFrame({"slot": per_slot.index + 1, "largest |W - 1/N|": per_slot.values,
                         "first step above": int(above[0]) if len(above) else -1})


def departure_reading(name: str, table: pd.DataFrame, threshold: float = 1e-3) -> str:
    """One sentence from ``uniform_departure``: whether and when W leaves uniform mixing, and how far it gets."""
    first = int(table["first step above"].iloc[0])
    largest = table["largest |W - 1/N|"]
    if first < 0:
        return (f"{name}: W stays within {threshold:g} of uniform mixing at every step (largest departure "
                f"{largest.max():.1e}): it is FedAvg.")
    return (f"{name}: W's largest departure from uniform mixing is {largest.iloc[0]:.1e} in slot 1 and first exceeds "
            f"{threshold:g} at step {first}; per slot it then reaches "
            + ", ".join(f"{v:.2g}" for v in largest.iloc[1:]) + ".")
