"""``run-plan FILE --ray ADDRESS``: the planned jobs of a grid as Ray tasks on an existing Ray cluster.

Each job (``plan.PlannedJob``) runs in a Ray worker exactly as in a local ``run-plan`` worker (``plan_runner._init_worker``:
torch threads and the plugins of ``$FTTA_PLUGINS``; then ``plan_runner.run_job``), so its summary is stored by the grid
call that planned it, through ``runstore.store_summary``'s atomic writes, under its config hash in the job's results
folder. **A shared file system is assumed**: every node sees this checkout, its ``data/`` and the results folders at
the same paths (one machine, NFS, or a cluster file system); nothing is sent back but one line per job.

- resumable: a job whose runs are all stored is not submitted (re-run the command after an interruption);
- one CPU per task (``num_cpus=threads``, 1 unless ``--threads`` says more) and torch threads set to match;
- a failing job (an exception, a worker that died) is reported as one JSON line with ``error`` and does not stop the
  others; a job whose worker died is retried by Ray up to ``retries`` times (``--retries``, default 1: the task's
  ``max_retries``; an exception the job raised is not retried, as in local workers); re-running the command runs a
  failed job again;
- the workers get this checkout first on ``PYTHONPATH``, the driver's project (``$FTTA_PROJECT_ROOT``,
  ``ftta_core.project``) and every ``FTTA_*`` variable of the driver but ``FTTA_PLAN`` (plugins, data root,
  partial-run folder...) through the task's ``runtime_env``.

``LocalCluster`` starts a throw-away cluster (a head and worker nodes on 127.0.0.1, each its own process group) for
the tests and ``benchmarks/ray_plan.py``, and on exit ends exactly the processes it started.

Importing this module is cheap (no ray, no torch): the command line's parser uses ``add_ray_option``.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

from .plan import PLAN_ENV, PlannedJob
from .plan_runner import _init_worker, _run_before, pending_runs, run_plan
from .project import LIBRARY_CHECKOUT, PROJECT_ENV, layout

RAY_BIN = Path(sys.executable).with_name("ray")


def worker_env(environ: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """The variables a Ray worker needs to run our jobs as a local worker would: the project's root and the folder
    the package was imported from first on ``PYTHONPATH`` (one entry when they are the same checkout), the
    driver's project as ``$FTTA_PROJECT_ROOT`` (a worker may start in any folder: the plan's relative results
    folders are the driver's project's) and the driver's ``FTTA_*`` variables but ``FTTA_PLAN`` (a running plan
    never plans again)."""
    environ = os.environ if environ is None else environ
    root = layout().root
    env = {k: v for k, v in environ.items() if k.startswith("FTTA_") and k != PLAN_ENV}
    env[PROJECT_ENV] = str(root)
    first = dict.fromkeys([str(root), str(LIBRARY_CHECKOUT)])
    env["PYTHONPATH"] = os.pathsep.join([*first, *filter(None, [environ.get("PYTHONPATH")])])
    return env


def _one_line(err: BaseException) -> str:
    """``Type: message`` on one line; a Ray task error is reported by the exception the job raised."""
    cause = getattr(err, "cause", None) or err
    text = " ".join(str(cause).split())
    return f"{type(cause).__name__}: {text[:400]}"


def _ray_job(job: PlannedJob, deadline: Optional[float], threads: int) -> Dict[str, Any]:
    """One job in a Ray worker: set up like a local worker, run it (skipped past the deadline), name the node."""
    import ray

    os.environ.pop(PLAN_ENV, None)
    _init_worker(threads)
    return {**_run_before(job, deadline), "node": ray.get_runtime_context().get_node_id()[:8]}


def run_plan_ray(jobs: Sequence[PlannedJob], address: str = "auto", deadline_s: Optional[float] = None,
                 threads: Optional[int] = None, log: Callable[[str], Any] = print,
                 workers: Optional[int] = None, gpus: float = 0.0, retries: int = 1) -> List[Dict[str, Any]]:
    """Run ``jobs`` (in order of priority) as Ray tasks on the cluster at ``address``, as many at a time as it has
    free CPUs; returns one record per job like ``plan_runner.run_plan`` (``stored`` for a job found already stored).
    ``workers`` is accepted for ``run_plan``'s signature and unused: the cluster's CPUs set the concurrency. A job
    not started within ``deadline_s`` seconds is skipped. ``gpus``: GPUs per job (a fraction shares one GPU); Ray
    hides the GPUs from a task that asks for none, so jobs on ``cuda`` need it. ``retries``: times Ray runs again a
    job whose worker process died (``max_retries``). Connects with ``ray.init`` unless already connected."""
    import json

    import ray

    if retries < 0:
        raise ValueError(f"retries must be >= 0, got {retries}")
    os.environ.pop(PLAN_ENV, None)
    threads = threads or 1
    deadline = None if deadline_s is None else time.time() + deadline_s
    done: List[Dict[str, Any]] = []

    def record(result: Dict[str, Any]) -> None:
        done.append(result)
        log(json.dumps(result))

    todo = []
    for job in jobs:
        try:
            missing = pending_runs(job)
        except Exception:  # a config that does not build: its task reports why
            missing = 1
        if missing:
            todo.append(job)
        else:
            record({"job": job.describe(), "runs": 0, "seconds": 0.0, "stored": True})
    if not todo:
        return done
    runtime_env = {"env_vars": worker_env()}
    with contextlib.ExitStack() as stack:
        options: Dict[str, Any] = {"num_cpus": threads, "num_gpus": gpus, "max_retries": retries}
        if ray.is_initialized():  # the caller's connection: the environment goes with each task
            options["runtime_env"] = runtime_env
        else:  # ours: the job's environment, so the workers Ray prestarts for this driver serve the tasks
            ray.init(address=address, log_to_driver=False, runtime_env=runtime_env)
            stack.callback(ray.shutdown)
        task = ray.remote(_ray_job).options(**options)
        refs = {task.remote(job, deadline, threads): job for job in todo}
        pending = list(refs)
        while pending:
            (ref,), pending = ray.wait(pending, num_returns=1)
            try:
                record(ray.get(ref))
            except Exception as err:  # the worker died (retries spent) or the task could not start: this job only
                record({"job": refs[ref].describe(), "runs": 0, "seconds": 0.0, "error": _one_line(err)})
    return done


def add_ray_option(parser: argparse.ArgumentParser) -> None:
    """``--ray ADDRESS`` for ``run-plan``'s parser."""
    parser.add_argument("--ray", metavar="ADDRESS",
                        help="run the jobs as Ray tasks (one CPU each) on the existing cluster at ADDRESS ('auto', "
                             "HOST:PORT); the nodes must see this checkout and the results folders at the same "
                             "paths (shared file system); --workers is then unused")
    parser.add_argument("--ray-gpus", type=float, default=0.0, dest="ray_gpus", metavar="F",
                        help="with --ray: GPUs per job, e.g. 0.25 runs four jobs per GPU (jobs on cuda need it: Ray "
                             "hides the GPUs from tasks that ask for none)")


def plan_executor(args: argparse.Namespace) -> Callable[..., List[Dict[str, Any]]]:
    """What ``run-plan`` runs its jobs with: ``run_plan_ray`` on the cluster named by ``--ray``, else local
    workers (``plan_runner.run_plan``); both take ``(jobs, workers=, deadline_s=, threads=, log=, retries=)``."""
    address = getattr(args, "ray", None)
    return functools.partial(run_plan_ray, address=address, gpus=args.ray_gpus) if address else run_plan


# ---------------------------------------------------------------------------------------------------------------
# a throw-away cluster on 127.0.0.1 (tests, benchmarks)

def _free_ports(n: int) -> List[int]:
    """``n`` distinct TCP ports free on 127.0.0.1 now (held open together so none is handed out twice)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class LocalCluster:
    """A Ray head and ``nodes - 1`` worker nodes on 127.0.0.1, ``cpus_per_node`` CPUs each, started with
    ``ray start --block`` in a fresh temp dir, each node its own process group; every port is picked free (no
    clash with another cluster on the machine), auth and usage stats off. ``address`` is the head's. On exit each
    process group it started is killed (``ray stop --force`` for these nodes only: ``ray stop`` would end every Ray
    process of the machine) and ``leftovers()`` lists any process still alive."""

    def __init__(self, nodes: int = 2, cpus_per_node: int = 1, startup_s: float = 90.0, attempts: int = 3) -> None:
        self.nodes, self.cpus_per_node, self.startup_s, self.attempts = nodes, cpus_per_node, startup_s, attempts
        self.root: Optional[Path] = None
        self.address = ""
        self.procs: List[subprocess.Popen] = []
        self.started_s: Dict[str, float] = {}  # node -> seconds until it was up (all attempts)
        self.attempts_used: Dict[str, int] = {}
        self._pids: List[int] = []  # every process of the nodes seen at stop (workers have their own groups)
        self._env_before: Dict[str, Optional[str]] = {}
        self._node_env: Dict[str, str] = {}

    # RAY_AUTH_MODE: a token in ~/.ray makes the head require it from nodes started without it
    ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
    # `import ray` imports jsonschema, which builds rfc3987-syntax's grammar (installed with jupyter-events) for
    # ~4 s of CPU; a raylet gives its two agents 15 s to start, missed on a loaded 2-core machine. The nodes'
    # daemons import a stand-in that makes jsonschema skip that optional format checker (the job workers do not:
    # their PYTHONPATH is the job's, ``worker_env``).
    SHIM = {"rfc3987_syntax.py": "raise ImportError('left out of this test cluster: slow to import')\n"}

    def __enter__(self) -> "LocalCluster":
        self.root = Path(tempfile.mkdtemp(prefix="ftta-ray-", dir="/tmp"))  # short: Ray's socket paths must fit
        for key, value in self.ENV.items():  # the driver (this process) must agree with the nodes
            self._env_before[key] = os.environ.get(key)
            os.environ[key] = value
        shim = self.root / "pyshim"
        shim.mkdir()
        for name, text in self.SHIM.items():
            (shim / name).write_text(text)
        pythonpath = os.pathsep.join([str(shim), *filter(None, [os.environ.get("PYTHONPATH")])])
        self._node_env = {**os.environ, **self.ENV, "PYTHONPATH": pythonpath}
        try:
            (port,) = _free_ports(1)
            self.address = f"127.0.0.1:{port}"
            self._start("head", ["--head", f"--port={port}", "--include-dashboard=false", "--no-monitor"],
                        ["--ray-client-server-port", "--dashboard-port"])  # --no-monitor: no autoscaler
            for n in range(1, self.nodes):
                self._start(f"node{n}", [f"--address={self.address}"], [])
        except BaseException:
            self.__exit__(*sys.exc_info())  # keeps the temp dir: the error names the node whose log to read
            raise
        return self

    def _start(self, name: str, args: List[str], more_ports: List[str]) -> None:
        """Start one node (``ray start --block``) and wait until it says it is up; a start that fails is killed
        and tried again (``attempts`` in all): a raylet gives its agents a fixed 15 s to come up, which a loaded
        machine sometimes misses."""
        assert self.root is not None
        port_options = ["--node-manager-port", "--object-manager-port", "--metrics-export-port",
                        "--dashboard-agent-grpc-port", "--dashboard-agent-listen-port", "--runtime-env-agent-port",
                        *more_ports]  # all given: nodes on one machine must not clash with each other or others
        t0 = time.monotonic()
        for attempt in range(1, self.attempts + 1):
            ports = _free_ports(len(port_options))
            log = self.root / f"{name}.{attempt}.log"
            cmd = [str(RAY_BIN), "start", "--block", *args, "--node-ip-address=127.0.0.1",
                   f"--num-cpus={self.cpus_per_node}", "--num-gpus=0", f"--temp-dir={self.root / name}",
                   "--disable-usage-stats", "--include-log-monitor=false",  # no log streaming: one process less
                   *[f"{o}={p}" for o, p in zip(port_options, ports)]]
            with open(log, "wb") as fh:
                proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        start_new_session=True, env=self._node_env)
            self.procs.append(proc)
            t_end = time.monotonic() + self.startup_s
            while b"block forever" not in log.read_bytes() and proc.poll() is None and time.monotonic() < t_end:
                time.sleep(0.25)
            if b"block forever" in log.read_bytes():
                self.started_s[name] = round(time.monotonic() - t0, 1)
                self.attempts_used[name] = attempt
                return
            self._kill(proc)
        tail = log.read_text(errors="replace")[-2000:]
        raise RuntimeError(f"ray node '{name}' did not start in {self.attempts} attempts; last log {log}: ...{tail}")

    def _kill(self, proc: subprocess.Popen) -> None:
        """Kill one node: its ``ray start`` process group and every descendant (by pid), then reap it."""
        import psutil

        try:
            tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            tree = []
        self._pids += [p.pid for p in tree]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        for p in tree:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        proc.wait()

    def leftovers(self) -> List[str]:
        """The live processes (not zombies) this cluster started: the nodes' process groups, every descendant seen
        at ``stop`` (Ray workers put themselves in groups of their own) and any process naming its temp dir."""
        import psutil

        groups = {p.pid for p in self.procs}
        found = []
        for proc in psutil.process_iter(["pid", "cmdline", "status"]):
            try:
                if proc.info["status"] == psutil.STATUS_ZOMBIE or proc.pid == os.getpid():
                    continue
                cmdline = " ".join(proc.info["cmdline"] or ())
                if (proc.pid in self._pids or os.getpgid(proc.pid) in groups
                        or (self.root is not None and str(self.root) in cmdline)):
                    found.append(f"{proc.pid} {cmdline[:120]}")
            except (psutil.Error, ProcessLookupError):
                continue
        return found

    def stop(self) -> None:
        """Kill every node started (``ray start`` and its descendants: GCS, raylet, agents, workers), newest
        first."""
        for proc in reversed(self.procs):
            self._kill(proc)

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        """Stop the nodes; the temp dir (the nodes' logs) is deleted unless the block raised."""
        try:
            self.stop()
            deadline = time.monotonic() + 10
            while self.leftovers() and time.monotonic() < deadline:  # a killed group takes a moment to go
                time.sleep(0.2)
            if exc_type is None and self.root is not None:
                shutil.rmtree(self.root, ignore_errors=True)
        finally:
            for key, value in self._env_before.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
            self._env_before = {}


__all__ = ["run_plan_ray", "worker_env", "add_ray_option", "plan_executor", "LocalCluster"]
