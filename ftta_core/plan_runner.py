"""Run a plan's jobs (``plan.read_plan``) in parallel worker processes: ``python -m ftta_core run-plan FILE``.

Each job runs through the grid runner that planned it (``grid.run`` with a ``grid.SummaryStore``: one shared pass for
a job with strategies, else the run alone), so its summary is stored exactly where that grid looks for it;
``ray_plan`` runs the same jobs as Ray tasks.

Workers are spawned processes that each take one job at a time (``WorkerPool``). A worker that dies while running
a job (killed, out of memory, ``os._exit``) loses only that job: a new worker replaces it and the job is run again,
up to ``retries`` more times (``--retries``, default 1; it resumes from its run's last checkpoint), while the other
jobs go on; a job still failing after that is reported with ``error`` and the attempts it took, and the command
exits non-zero. With ``workers=1`` the jobs run in this process (nothing to retry: a kill ends the command, and
running it again resumes). A worker whose code changed on disk after it started (an edit during a long plan) exits
instead of recording a run under code it does not run (``units.CodeChangedError``), and a fresh worker takes the
job, without counting an attempt. A worker never outlives the command: however the command ends (SIGTERM,
SIGKILL, a crash), its workers exit at once (``PARENT_GONE_EXIT``), and their runs resume from their last checkpoint
when the plan runs again.
"""
from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from multiprocessing import get_context
from multiprocessing.connection import Connection, wait
from typing import Any, Callable, Deque, Dict, List, Optional, Sequence

from .experiment import ExperimentConfig
from .plan import PLAN_ENV, PlannedJob, results_path
from . import grid
from .progress import progress_bar
from .runstore import RunInUse
from .units import CodeChangedError
from .variants import strategy_variants


CODE_CHANGED_EXIT = 75  # a worker's exit status when its code changed on disk (EX_TEMPFAIL): run the job again
CODE_CHANGED_RESTARTS = 3  # fresh workers a job gets for that reason before it counts as a death
PARENT_GONE_EXIT = 76  # a worker's exit status when the command that started it is gone


def pending_runs(job: PlannedJob) -> int:
    """How many of the job's runs its grid would run now (not stored, or stale under ``FTTA_RERUN_STALE``)."""
    cfg = ExperimentConfig.from_dict(job.config)
    configs = [dataclasses.replace(cfg, strategy=s, strategy_params={}) for s in job.strategies] or [cfg]
    return sum(grid.stored_path(c, results_path(job)) is None for c in configs)


def run_job(job: PlannedJob) -> Dict[str, Any]:
    """Run one planned job through the grid runner that planned it (``grid.run`` into the job's results folder: its
    strategies in one shared pass, or its config alone), so it is stored exactly as that grid stores runs; returns
    what it ran and how long it took."""
    cfg = ExperimentConfig.from_dict(job.config)
    store = grid.SummaryStore(results_path(job))
    ran = pending_runs(job)
    t0 = time.perf_counter()
    if job.strategies:
        grid.run(cfg, strategy_variants(job.strategies), [cfg.seed], store, shared_pass=1, progress=False)
    else:
        grid.run(cfg, {cfg.strategy: {}}, [cfg.seed], store, progress=False)
    return {"job": job.describe(), "runs": ran, "seconds": round(time.perf_counter() - t0, 1)}


def _init_worker(threads: int) -> None:
    """Start-up of a worker (a spawned process, or this one with ``workers=1``): torch threads, freed memory kept
    for the next step (``allocator``), and the plugins the command was given (``--plugin`` exports them as
    ``$FTTA_PLUGINS``) so that configs naming their methods run."""
    import torch

    from .allocator import keep_freed_memory
    from .plugins import load_plugins

    torch.set_num_threads(threads)
    keep_freed_memory()
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
    except CodeChangedError as err:  # this worker runs code older than the files: a fresh worker runs the job
        if multiprocessing.parent_process() is None:  # the command's own process (workers=1): nothing replaces it
            raise
        print(f"worker {os.getpid()}: {err}; exiting so that a fresh worker runs {job.describe()}", file=sys.stderr,
              flush=True)
        os._exit(CODE_CHANGED_EXIT)
    except Exception as err:  # one broken job must not stop the others; the log names it
        return {"job": job.describe(), "runs": 0, "seconds": 0.0, "error": f"{type(err).__name__}: {err}"}


def died_how(exitcode: Optional[int]) -> str:
    """How a worker process ended, in words: ``killed by SIGKILL``, ``exit status 3``."""
    if exitcode is None:
        return "no exit status"
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit status {exitcode}"


def _exit_with_parent() -> None:
    """In a worker process: exit (``PARENT_GONE_EXIT``) as soon as the process that started it is gone, however it
    ended. Otherwise a killed command leaves its workers computing jobs nobody waits for, holding their runs' locks
    (a new ``run-plan`` would leave those jobs to them); every run is resumable from its last checkpoint."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def watch() -> None:
        wait([parent.sentinel])  # readable once the parent has exited
        print(f"worker {os.getpid()}: the run-plan command that started it is gone; exiting (its run resumes from "
              "its last checkpoint)", file=sys.stderr, flush=True)
        os._exit(PARENT_GONE_EXIT)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def _worker_main(conn: Connection, threads: int) -> None:
    """A worker process: set up once (``_init_worker``), then run the jobs it is sent (``(index, job,
    deadline)``) one at a time and send back ``(index, result)``; ``None`` ends it, and so does the end of the
    command that started it (``_exit_with_parent``)."""
    _exit_with_parent()
    _init_worker(threads)
    while True:
        try:
            task = conn.recv()
        except EOFError:  # the command ended without saying so
            return
        if task is None:
            return
        index, job, deadline = task
        conn.send((index, _run_before(job, deadline)))


@dataclass
class _Worker:
    """One worker process, the pipe to it and the job it is running (an index, or None when idle)."""

    proc: Any
    conn: Connection
    job: Optional[int] = None


class WorkerPool:
    """Up to ``size`` spawned worker processes, each running one job at a time (``_worker_main``); a worker that
    dies is dropped (a new one starts for the next job) and the job it held is handed to ``run``'s ``died``."""

    def __init__(self, size: int, threads: int) -> None:
        self.size, self.threads = size, threads
        self._context = get_context("spawn")
        self.workers: List[_Worker] = []
        self.queue: Deque[int] = deque()

    def _start(self) -> _Worker:
        ours, theirs = self._context.Pipe()
        proc = self._context.Process(target=_worker_main, args=(theirs, self.threads))
        proc.start()
        theirs.close()
        self.workers.append(_Worker(proc, ours))
        return self.workers[-1]

    def _drop(self, worker: _Worker) -> None:
        worker.conn.close()
        worker.proc.join(timeout=5)
        self.workers.remove(worker)

    def _hand_out(self, task: Callable[[int], tuple]) -> None:
        """Give queued jobs to idle workers, starting workers up to ``size``."""
        while self.queue:
            idle = next((w for w in self.workers if w.job is None), None)
            if idle is None and len(self.workers) >= self.size:
                return
            worker = idle or self._start()
            index = self.queue.popleft()
            try:
                worker.conn.send(task(index))
                worker.job = index
            except (BrokenPipeError, EOFError, OSError):  # it died idle: the job never started
                self.queue.appendleft(index)
                self._drop(worker)

    def run(self, todo: Sequence[int], task: Callable[[int], tuple], done: Callable[[int, Dict[str, Any]], None],
            died: Callable[[int, str], None]) -> None:
        """Run every index of ``todo`` (``task(i)``: what to send for it) until each one is ``done`` (with its
        result) or handed to ``died`` (its worker died: how, in words), which may ``requeue`` it."""
        self.queue.extend(todo)
        try:
            while True:
                self._hand_out(task)
                busy = [w for w in self.workers if w.job is not None]
                if not busy:
                    return
                ready = set(wait([w.conn for w in busy] + [w.proc.sentinel for w in busy]))
                for worker in busy:
                    if worker.conn in ready or worker.proc.sentinel in ready:
                        self._collect(worker, done, died)
        finally:
            self.close()

    def requeue(self, index: int) -> None:
        """Run job ``index`` again, before the jobs not yet started."""
        self.queue.appendleft(index)

    def _collect(self, worker: _Worker, done: Callable[[int, Dict[str, Any]], None],
                 died: Callable[[int, str], None]) -> None:
        """Take a worker's result, or, when it died without one, drop it and hand its job to ``died``."""
        index, worker.job = worker.job, None
        try:
            if worker.conn.poll():
                got, result = worker.conn.recv()
                done(got, result)
                return
        except (EOFError, OSError):  # its end of the pipe closed: it died
            pass
        worker.proc.join(timeout=10)  # woken by the pipe closing as it dies: its exit status comes next
        how = died_how(worker.proc.exitcode)
        self._drop(worker)
        died(index, how)

    def close(self) -> None:
        """End every worker (a polite ``None``, then terminate what is left)."""
        for worker in self.workers:
            try:
                worker.conn.send(None)
            except (BrokenPipeError, EOFError, OSError):
                pass
        for worker in list(self.workers):
            worker.proc.join(timeout=10)
            if worker.proc.is_alive():
                worker.proc.terminate()
            self._drop(worker)


def run_plan(jobs: Sequence[PlannedJob], workers: int = 1, deadline_s: Optional[float] = None,
             threads: Optional[int] = None, log=print, retries: int = 1) -> List[Dict[str, Any]]:
    """Run ``jobs`` (in order of priority) ``workers`` at a time; a job not started within ``deadline_s`` seconds is
    skipped, so a time-limited call stops cleanly with every finished run stored. A job whose worker process died
    is run again in a new worker up to ``retries`` more times while the others go on; then it is recorded with
    ``error`` (its ``attempts`` counted). Unsets ``$FTTA_PLAN``."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if retries < 0:
        raise ValueError(f"retries must be >= 0, got {retries}")
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
    deaths = [0] * len(jobs)  # per job: workers that died running it
    restarts = [0] * len(jobs)  # per job: workers that exited on it because their code changed on disk
    pool = WorkerPool(workers, threads)

    def record(result: Dict[str, Any]) -> None:
        done.append(result)
        log(json.dumps(result))
        bar.update(1)

    def finished(index: int, result: Dict[str, Any]) -> None:
        record({**result, "attempts": deaths[index] + 1} if deaths[index] else result)

    def died(index: int, how: str) -> None:
        restarts[index] += how == died_how(CODE_CHANGED_EXIT)
        if how == died_how(CODE_CHANGED_EXIT) and restarts[index] <= CODE_CHANGED_RESTARTS:
            # not the job's fault: a fresh worker runs it, no attempt counted (a file dated in the future would
            # make every fresh worker exit: after CODE_CHANGED_RESTARTS it counts as a death)
            log(json.dumps({"job": jobs[index].describe(), "restart": "the code changed on disk since its worker "
                            "started; a fresh worker runs it"}))
            pool.requeue(index)
            return
        deaths[index] += 1
        why = f"its worker process died ({how})"
        if deaths[index] <= retries:
            log(json.dumps({"job": jobs[index].describe(), "retry": deaths[index], "reason": why}))
            pool.requeue(index)
        else:
            record({"job": jobs[index].describe(), "runs": 0, "seconds": 0.0, "attempts": deaths[index],
                    "error": f"{why} in each of {deaths[index]} attempts"})

    pool.run(range(len(jobs)), lambda i: (i, jobs[i], deadline), finished, died)
    bar.close()
    return done


__all__ = ["CODE_CHANGED_EXIT", "PARENT_GONE_EXIT", "pending_runs", "run_job", "run_plan", "WorkerPool"]
