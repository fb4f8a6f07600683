"""What the studies' commands share: writing a generated table, the experiment options of a command that builds its
own configs, and actions that hand their arguments to a study module's own ``main``."""
from __future__ import annotations

import argparse
import functools
import importlib
from pathlib import Path
from typing import Any, Sequence

from ftta_core.cli import TTA_CHOICES, write_markdown  # noqa: F401 -- re-exported for the studies' commands
from ftta_core.cli_config import add_config_options
from ftta_core.study_registry import StudyAction


def shared_options(p: argparse.ArgumentParser, fields: Sequence[str], **defaults: Any) -> None:
    """The experiment options ``fields`` of a command that builds its own configs, generated from ExperimentConfig
    (defaults: the config's, except ``defaults``; dataset: cifar10), added when the command is used."""
    add = functools.partial(add_config_options, fields=fields, defaults={"dataset": "cifar10", **defaults},
                            title="experiment config (fields of ExperimentConfig)")
    if hasattr(p, "defer"):
        p.defer(add)
    else:
        add(p)


def passthrough(module: str, help: str) -> StudyAction:
    """An action that hands every argument after it to ``module.main`` (its own ``--help`` lists them)."""
    def add(p: argparse.ArgumentParser) -> None:
        p.add_argument("argv", nargs=argparse.REMAINDER, help=f"the options of python -m {module} (--help lists them)")

    def run(args: argparse.Namespace) -> int:
        return int(importlib.import_module(module).main(args.argv) or 0)

    return StudyAction(help, add, run, f"{help}. Every option after the action goes to python -m {module}.")
