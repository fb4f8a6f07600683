"""Plan the missing runs of a grid, then run them in parallel worker processes (one GPU or many CPU cores).

A notebook or ``fedtsa-table`` run with ``FTTA_PLAN=FILE`` set runs nothing: every grid call (``run_grid``,
``run_strategy_grid``) appends the runs it lacks to ``FILE`` (JSON lines) and returns the stored ones.
``python -m ftta_core run-plan FILE --workers N`` then executes the planned jobs, ``N`` at a time, each storing its
summary under its config hash exactly where the grid call looks for it; re-running the notebook reads them back.

Why: the protocol runs are small (20 clients x batch 10 on a ResNet-8), so one process leaves a GPU mostly idle
waiting for Python. Several processes sharing the GPU raise its throughput; on a CPU, one process per core does.
"""
from __future__ import annotations

import json
import os
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from .progress import progress_bar
from .runstore import store_summary

PLAN_ENV = "FTTA_PLAN"
REPO_DIR = Path(__file__).resolve().parents[1]


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
    """Append one job to the plan file (no-op without one)."""
    path = plan_file()
    if path is None:
        return
    job = {"config": config, "results_dir": _portable(Path(results_dir)), "strategies": list(strategies)}
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(job, default=list) + "\n")


def _portable(path: Path) -> str:
    """``path`` relative to the repository when inside it (a plan made here runs in another checkout), else absolute."""
    resolved = path.resolve()
    try:
        return resolved.relative_to(REPO_DIR).as_posix()
    except ValueError:
        return str(resolved)


def results_path(job: PlannedJob) -> Path:
    """The job's results folder; a relative one is inside the repository this package was imported from."""
    path = Path(job.results_dir)
    return path if path.is_absolute() else REPO_DIR / path


def read_plan(path: Path | str) -> List[PlannedJob]:
    """The jobs of a plan file in order, duplicates dropped (a notebook may ask for a run twice)."""
    jobs: Dict[str, PlannedJob] = {}
    for n, line in enumerate(Path(path).read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
            job = PlannedJob(raw["config"], raw["results_dir"], tuple(raw.get("strategies", ())))
        except (ValueError, KeyError, TypeError) as err:
            raise ValueError(f"{path}:{n}: not a planned job ({err})") from err
        jobs.setdefault(job.key, job)
    return list(jobs.values())


def pending_runs(job: PlannedJob) -> int:
    """How many of the job's runs its grid would run now (not stored, or stale under ``FTTA_RERUN_STALE``)."""
    import dataclasses

    from .experiment import ExperimentConfig
    from .workbook import stored_path

    cfg = ExperimentConfig.from_dict(job.config)
    configs = [dataclasses.replace(cfg, strategy=s, strategy_params={}) for s in job.strategies] or [cfg]
    return sum(stored_path(c, results_path(job)) is None for c in configs)


def run_job(job: PlannedJob) -> Dict[str, Any]:
    """Run one planned job through the grid that planned it (``run_strategy_grid`` for a shared pass, else
    ``run_grid``), so it is stored exactly as that grid stores runs; returns what it ran and how long it took."""
    from .experiment import ExperimentConfig
    from .workbook import run_grid, run_strategy_grid

    cfg = ExperimentConfig.from_dict(job.config)
    results = results_path(job)
    ran = pending_runs(job)
    t0 = time.perf_counter()
    if job.strategies:
        run_strategy_grid(cfg, list(job.strategies), [cfg.seed], results_dir=results, progress=False)
    else:
        run_grid(cfg, {cfg.strategy: {}}, [cfg.seed], results_dir=results, progress=False)
    return {"job": job.describe(), "runs": ran, "seconds": round(time.perf_counter() - t0, 1)}


def _init_worker(threads: int) -> None:
    """Start-up of a worker (a spawned process, or this one with ``workers=1``): torch threads, and the plugins the
    command was given (``--plugin`` exports them as ``$FTTA_PLUGINS``) so that configs naming their methods run."""
    import torch

    from .plugins import load_plugins

    torch.set_num_threads(threads)
    load_plugins()


def _run_before(job: PlannedJob, deadline: Optional[float]) -> Dict[str, Any]:
    """``run_job`` unless the wall-clock ``deadline`` (epoch seconds) has passed: then the job is skipped."""
    if deadline is not None and time.time() > deadline:
        return {"job": job.describe(), "runs": 0, "seconds": 0.0, "skipped": True}
    try:
        return run_job(job)
    except Exception as err:  # one broken job must not stop the others; the log names it
        return {"job": job.describe(), "runs": 0, "seconds": 0.0, "error": f"{type(err).__name__}: {err}"}


def run_plan(jobs: Sequence[PlannedJob], workers: int = 1, deadline_s: Optional[float] = None,
             threads: Optional[int] = None, log=print) -> List[Dict[str, Any]]:
    """Run ``jobs`` (in order of priority) ``workers`` at a time; a job not started within ``deadline_s`` seconds is
    skipped, so a time-limited call stops cleanly with every finished run stored. Unsets ``$FTTA_PLAN``."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    os.environ.pop(PLAN_ENV, None)  # running a plan runs its jobs (workers inherit this), it never plans again
    deadline = None if deadline_s is None else time.time() + deadline_s
    threads = threads or max(1, (os.cpu_count() or 1) // workers)
    done: List[Dict[str, Any]] = []
    bar = progress_bar(total=len(jobs), desc="planned jobs", unit="job")  # on stderr; quiet in logs
    if workers == 1:
        _init_worker(threads)
        for job in jobs:
            done.append(_run_before(job, deadline))
            log(json.dumps(done[-1]))
            bar.update(1)
        bar.close()
        return done
    with ProcessPoolExecutor(workers, mp_context=get_context("spawn"), initializer=_init_worker,
                             initargs=(threads,)) as pool:
        futures = [pool.submit(_run_before, job, deadline) for job in jobs]
        for future in as_completed(futures):
            done.append(future.result())
            log(json.dumps(done[-1]))
            bar.update(1)
    bar.close()
    return done


__all__ = ["PLAN_ENV", "PlannedJob", "plan_file", "add_to_plan", "read_plan", "store_summary", "pending_runs", "run_job",
           "run_plan"]
