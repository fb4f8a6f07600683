"""pFedBBN's study on the command line (``python -m ftta_core study pfedbbn ACTION``; ``studies.commands`` registers it
with the paper's claims, its only action: the Table 1 grid and the temperature study run from notebook 30)."""
from __future__ import annotations

SUMMARY = "pFedBBN: Table 1 over Dirichlet label skew and the temperature x distance-scale study"
ACTIONS: dict = {}
