"""Run a plan's jobs (``plan.read_plan``) in parallel worker processes: ``python -m ftta_core run-plan FILE``.

Each job runs through the grid that planned it (``workbook.run_grid`` / ``run_strategy_grid``), so its summary is
stored exactly where that grid looks for it; ``ray_plan`` runs the same jobs as Ray tasks.
"""
from __future__ import annotations

import dataclasses
import json
import os
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from typing import Any, Dict, List, Optional, Sequence

from .experiment import ExperimentConfig
from .plan import PLAN_ENV, PlannedJob, results_path
from .progress import progress_bar
from .runstore import RunInUse
from .workbook import run_grid, run_strategy_grid, stored_path


def pending_runs(job: PlannedJob) -> int:
    """How many of the job's runs its grid would run now (not stored, or stale under ``FTTA_RERUN_STALE``)."""
    cfg = ExperimentConfig.from_dict(job.config)
    configs = [dataclasses.replace(cfg, strategy=s, strategy_params={}) for s in job.strategies] or [cfg]
    return sum(stored_path(c, results_path(job)) is None for c in configs)


def run_job(job: PlannedJob) -> Dict[str, Any]:
    """Run one planned job through the grid that planned it (``run_strategy_grid`` for a shared pass, else
    ``run_grid``), so it is stored exactly as that grid stores runs; returns what it ran and how long it took."""
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
    """``run_job`` unless the wall-clock ``deadline`` (epoch seconds) has passed: then the job is skipped. A job
    whose run another process is running (two ``run-plan`` calls sharing a job) is left to it: ``elsewhere``."""
    if deadline is not None and time.time() > deadline:
        return {"job": job.describe(), "runs": 0, "seconds": 0.0, "skipped": True}
    try:
        return run_job(job)
    except RunInUse as err:
        return {"job": job.describe(), "runs": 0, "seconds": 0.0, "elsewhere": str(err)}
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


__all__ = ["pending_runs", "run_job", "run_plan"]
