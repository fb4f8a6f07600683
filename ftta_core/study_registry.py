"""Studies: what ``python -m ftta_core study PAPER ACTION`` runs, registered from outside the library.

The library knows no paper. A study (the repository's ``studies`` package, or a user's own) describes itself as a
``Study``: a name, one line of what it reproduces, and its actions (``table``, ``claims``, ``plan``, ...), each an
argparse command. It registers through an ``ftta.studies`` entry point naming that object (``pyproject.toml``)::

    [project.entry-points."ftta.studies"]
    fedtsa = "studies.fedtsa:STUDY"

``registered_studies`` loads them (sorted by name); a study that fails to load, or is not a ``Study``, is named in one
line (``StudyError``).
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, Mapping, Optional

ENTRY_POINT_GROUP = "ftta.studies"


class StudyError(RuntimeError):
    """A registered study that cannot be loaded or is not a ``Study``."""


@dataclass(frozen=True)
class StudyAction:
    """One command of a study: ``add_arguments(parser)`` declares its options, ``run(args)`` does it and returns the
    exit status."""

    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    description: Optional[str] = None


@dataclass(frozen=True)
class Study:
    """A paper's study as the command line sees it."""

    name: str
    summary: str
    actions: Mapping[str, StudyAction] = field(default_factory=dict)


def _entry_points() -> Iterable[object]:
    from importlib.metadata import entry_points

    return entry_points(group=ENTRY_POINT_GROUP)


def registered_studies() -> Dict[str, Study]:
    """Every study registered under the ``ftta.studies`` entry point group, by name."""
    found: Dict[str, Study] = {}
    for ep in _entry_points():
        where = f"entry point {ep.name!r} = {ep.value!r} in group {ENTRY_POINT_GROUP!r}"  # type: ignore[attr-defined]
        try:
            study = ep.load()  # type: ignore[attr-defined]
        except Exception as exc:  # noqa: BLE001 -- any import error of a study is reported in one line
            raise StudyError(f"{where} cannot be loaded: {type(exc).__name__}: {exc}") from None
        if not isinstance(study, Study):
            raise StudyError(f"{where} is a {type(study).__name__}, not an ftta_core.study_registry.Study")
        found[study.name] = study
    return dict(sorted(found.items()))


def add_study_parsers(sub: argparse._SubParsersAction, parser_class: type) -> None:
    """The ``study`` command: one sub-command per registered study, one sub-sub-command per action."""
    p = sub.add_parser("study", help="a paper's study: its tables, claims and plans (registered by ftta.studies "
                                     "entry points; README 'Layout')",
                       description="Runs one action of a registered study. `study PAPER --help` lists its actions.")
    papers = p.add_subparsers(dest="paper", required=True, metavar="PAPER", parser_class=parser_class)
    for name, study in registered_studies().items():
        sp = papers.add_parser(name, help=study.summary, description=study.summary)
        actions = sp.add_subparsers(dest="action", required=True, metavar="ACTION", parser_class=parser_class)
        for action_name, action in study.actions.items():
            ap = actions.add_parser(action_name, help=action.help, description=action.description or action.help)
            action.add_arguments(ap)
            ap.set_defaults(func=action.run)


__all__ = ["ENTRY_POINT_GROUP", "Study", "StudyAction", "StudyError", "add_study_parsers", "registered_studies"]
