"""Plan the missing runs of a grid: the plan file (``plan_runner`` runs its jobs in worker processes, ``ray_plan`` on
a Ray cluster).

A notebook or ``study fedtsa table`` run with ``FTTA_PLAN=FILE`` set runs nothing: every grid call that keeps its
summaries in a folder (``grid.run`` with a ``grid.SummaryStore``: ``workbook.run_grid``, ``run_strategy_grid``, ...)
appends the runs it lacks to ``FILE`` (JSON lines) and returns the stored ones.
``python -m ftta_core run-plan FILE --workers N`` (``plan_runner.run_plan``) then executes the planned jobs, ``N`` at a time, each storing its
summary under its config hash exactly where the grid call looks for it; re-running the notebook reads them back.

Why: the protocol runs are small (20 clients x batch 10 on a ResNet-8), so one process leaves a GPU mostly idle
waiting for Python. Several processes sharing the GPU raise its throughput; on a CPU, one process per core does.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from .project import layout, layout_aliases

PLAN_ENV = "FTTA_PLAN"
# ``REPO_DIR``: the project's root (``project.layout().root``), kept for the studies that import it
__getattr__ = layout_aliases(__name__, REPO_DIR="root")


@dataclass(frozen=True)
class PlannedJob:
    """One job: a config run per strategy in one shared pass (``strategies``), or once (``strategies`` empty)."""

    config: Dict[str, Any]
    results_dir: str
    strategies: tuple = ()

    @property
    def key(self) -> str:
        return json.dumps([self.config, self.results_dir, list(self.strategies)], sort_keys=True)

    def describe(self) -> str:
        c = self.config
        what = "+".join(self.strategies) if self.strategies else c.get("strategy", "?")
        return f"{c.get('local')}/{c.get('scenario')}/{what}/seed{c.get('seed')}"


def plan_file() -> Optional[Path]:
    """The plan file named by ``$FTTA_PLAN``, or None when grids should run their missing runs themselves."""
    value = os.environ.get(PLAN_ENV)
    return Path(value) if value else None


def add_to_plan(config: Dict[str, Any], results_dir: Path | str, strategies: Sequence[str] = ()) -> None:
    """Append one job to the plan file (no-op without one, or when the file already plans that job: planning a grid
    twice leaves one line per job)."""
    path = plan_file()
    if path is None:
        return
    job = {"config": config, "results_dir": _portable(Path(results_dir)), "strategies": list(strategies)}
    planned = PlannedJob(json.loads(json.dumps(config, default=list)), job["results_dir"], tuple(strategies))
    if path.is_file() and any(j.key == planned.key for j in read_plan(path)):
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(job, default=list) + "\n")


def _portable(path: Path) -> str:
    """``path`` relative to the project's root when inside it (a plan made here runs in another checkout of the
    project), else absolute."""
    resolved = path.resolve()
    try:
        return resolved.relative_to(layout().root).as_posix()
    except ValueError:
        return str(resolved)


def results_path(job: PlannedJob) -> Path:
    """The job's results folder; a relative one is inside the project's root (``project.layout``)."""
    path = Path(job.results_dir)
    return path if path.is_absolute() else layout().root / path


def read_plan(path: Path | str) -> List[PlannedJob]:
    """The jobs of a plan file in order, duplicates dropped (a notebook may ask for a run twice)."""
    return read_plans([path])


def read_plans(paths: Sequence[Path | str]) -> List[PlannedJob]:
    """The jobs of several plan files as one queue: the first file's jobs in order, then the next file's, a job
    planned twice (in one file or in two) kept where it first appears."""
    jobs: Dict[str, PlannedJob] = {}
    for path in paths:
        _read_into(jobs, Path(path))
    return list(jobs.values())


def _read_into(jobs: Dict[str, PlannedJob], path: Path) -> None:
    """Add ``path``'s jobs to ``jobs`` (keyed by ``PlannedJob.key``, first one kept)."""
    for n, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
            job = PlannedJob(raw["config"], raw["results_dir"], tuple(raw.get("strategies", ())))
        except (ValueError, KeyError, TypeError) as err:
            raise ValueError(f"{path}:{n}: not a planned job ({err})") from err
        jobs.setdefault(job.key, job)


__all__ = ["PLAN_ENV", "REPO_DIR", "PlannedJob", "plan_file", "add_to_plan", "read_plan", "read_plans",
           "results_path"]
