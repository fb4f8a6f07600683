"""The anchored-clients study on the command line (``python -m ftta_core study anchored ACTION``; ``studies.commands`` registers it)."""
from __future__ import annotations

from studies.common import passthrough

SUMMARY = "Beyond the papers: is collaboration worth it once a client cannot drift?"
ACTIONS = {
    "plan": passthrough("studies.anchored", "plan the study's runs and run them (resumable), then its tables"),
}
