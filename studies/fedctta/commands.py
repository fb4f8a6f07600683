"""FedCTTA's study on the command line (``python -m ftta_core study fedctta ACTION``; ``studies.commands`` registers it)."""
from __future__ import annotations

from ftta_core.study_registry import StudyAction
from studies.fedtsa.commands import add_case_study_arguments, run_case_study

SUMMARY = "FedCTTA (Rajib et al.): Table I's claims and the case study of Table III"
ACTIONS = {
    "case-study": StudyAction(
        "the 10-client, 3-group case study with FedCTTA Table III's orders", add_case_study_arguments("fedctta"),
        run_case_study,
        "Runs the case study (10 clients in 3 groups; with --orders fedctta the second group walks four "
        "corruptions ahead, as FedCTTA Table III) for each strategy, keeps each run under OUT/<strategy>/ and "
        "writes OUT/table.{csv,md}: accuracy per group and slot."),
}
