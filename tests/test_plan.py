"""Planned runs: a grid with FTTA_PLAN set runs nothing and records its missing runs; run-plan runs them in worker
processes and stores exactly the summaries the grid then reads back (same numbers as running the grid directly)."""
import json
import os

import pytest

from ftta_core.cli import main
from ftta_core.experiment import ExperimentConfig
from ftta_core.plan import PLAN_ENV, read_plan, read_plans
from ftta_core.plan_runner import run_plan
from ftta_core.workbook import run_grid, run_strategy_grid

BASE = ExperimentConfig(dataset="embedded_digits", scenario="fedtsa_niid", clients=4, batch_size=5,
                        images_per_client=10, corruptions=["fog", "contrast", "frost", "glass_blur"], local="bn", device="cpu", max_steps=3)


def test_planning_runs_nothing_and_records_each_missing_run_once(tmp_path, monkeypatch):
    plan = tmp_path / "plan.jsonl"
    monkeypatch.setenv(PLAN_ENV, str(plan))
    variants = {"local": {"strategy": "local"}, "fedavg": {"strategy": "fedavg"}}
    assert run_grid(BASE, variants, [0, 1], results_dir=tmp_path / "runs").empty
    assert run_strategy_grid(BASE, ["local", "fedavg"], [0], results_dir=tmp_path / "shared").empty
    run_grid(BASE, variants, [0, 1], results_dir=tmp_path / "runs")  # asked twice: planned once
    assert not (tmp_path / "runs").exists()
    jobs = read_plan(plan)
    assert len(jobs) == 5 and len(plan.read_text().splitlines()) == 5
    assert [j.strategies for j in jobs].count(("local", "fedavg")) == 1  # one shared pass for the TTA-bn grid


def test_run_plan_in_workers_stores_what_the_grid_reads_back(tmp_path, monkeypatch):
    plan = tmp_path / "plan.jsonl"
    variants = {"local": {"strategy": "local"}, "fedavg": {"strategy": "fedavg"}}
    monkeypatch.setenv(PLAN_ENV, str(plan))
    run_grid(BASE, variants, [0], results_dir=tmp_path / "planned")
    done = run_plan(read_plan(plan), workers=2, log=lambda line: None)  # FTTA_PLAN still set: runs, never re-plans
    assert sorted(d["runs"] for d in done) == [1, 1], done
    assert PLAN_ENV not in os.environ
    planned = run_grid(BASE, variants, [0], results_dir=tmp_path / "planned", only_cached=True, progress=False)
    direct = run_grid(BASE, variants, [0], results_dir=tmp_path / "direct", progress=False)
    assert planned["accuracy"].tolist() == direct["accuracy"].tolist()


def test_a_job_past_the_deadline_is_skipped_and_a_broken_job_is_reported(tmp_path):
    plan = tmp_path / "plan.jsonl"
    broken = dict(BASE.to_dict(), strategy="no_such_strategy")
    plan.write_text(json.dumps({"config": broken, "results_dir": str(tmp_path / "r")}) + "\n")
    (failed,) = run_plan(read_plan(plan), log=lambda line: None)
    assert "no_such_strategy" in failed["error"]
    (skipped,) = run_plan(read_plan(plan), deadline_s=-1, log=lambda line: None)
    assert skipped["skipped"] and skipped["runs"] == 0


def test_a_malformed_plan_line_names_the_file_and_line(tmp_path):
    plan = tmp_path / "plan.jsonl"
    plan.write_text('{"config": {}, "results_dir": "r"}\n{"not": "a job"}\n')
    with pytest.raises(ValueError, match=r"plan.jsonl:2"):
        read_plan(plan)


def test_cli_run_plan_exits_nonzero_when_a_job_fails(tmp_path, capsys):
    plan = tmp_path / "plan.jsonl"
    plan.write_text(json.dumps({"config": dict(BASE.to_dict(), local="no_such_method"),
                                "results_dir": str(tmp_path / "r")}) + "\n")
    assert main(["run-plan", str(plan)]) == 1
    assert "1 failed" in capsys.readouterr().out


def test_a_job_another_process_is_running_is_left_to_it_not_failed(tmp_path, monkeypatch, capsys):
    import dataclasses
    import subprocess
    import sys

    from ftta_core.workbook import partial_dir

    monkeypatch.setenv("FTTA_PARTIAL_DIR", str(tmp_path / "partial"))
    cfg = dataclasses.replace(BASE, strategy="fedavg", local="tent", local_params={"params": "bn_affine"})
    plan = tmp_path / "plan.jsonl"
    plan.write_text(json.dumps({"config": cfg.to_dict(), "results_dir": str(tmp_path / "r")}) + "\n")
    folder = partial_dir(cfg)
    folder.mkdir(parents=True)
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, sys, time; f = open(sys.argv[1], 'a+'); "
                               "fcntl.flock(f.fileno(), fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)",
                               str(folder / ".lock")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"  # another process runs this job now
        (left,) = run_plan(read_plan(plan), log=lambda line: None)
        assert "elsewhere" in left and "error" not in left and left["runs"] == 0, left
        assert main(["run-plan", str(plan)]) == 0
        assert "1 left to another process running them; 0 failed" in capsys.readouterr().out
    finally:
        holder.kill()
        holder.wait()


def test_run_plan_pending_lists_the_jobs_left_and_runs_nothing(tmp_path, monkeypatch, capsys):
    plan = tmp_path / "plan.jsonl"
    monkeypatch.setenv(PLAN_ENV, str(plan))
    run_grid(BASE, {"local": {"strategy": "local"}, "fedavg": {"strategy": "fedavg"}}, [0], results_dir=tmp_path / "runs")
    monkeypatch.delenv(PLAN_ENV)
    assert main(["run-plan", str(plan), "--pending"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1] == "2 run(s) pending in 2 jobs" and any("bn/fedtsa_niid/fedavg seed 0" in line for line in out)
    assert not (tmp_path / "runs").exists()  # nothing ran
    run_grid(BASE, {"local": {"strategy": "local"}}, [0], results_dir=tmp_path / "runs", progress=False)
    assert main(["run-plan", str(plan), "--pending"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == "1 run(s) pending in 2 jobs"


def test_several_plans_are_one_queue_in_the_order_given_each_job_once(tmp_path, monkeypatch, capsys):
    first, second = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    monkeypatch.setenv(PLAN_ENV, str(first))
    run_grid(BASE, {"fedavg": {"strategy": "fedavg"}, "local": {"strategy": "local"}}, [0], results_dir=tmp_path / "r")
    monkeypatch.setenv(PLAN_ENV, str(second))
    run_grid(BASE, {"local": {"strategy": "local"}}, [0, 1], results_dir=tmp_path / "r")  # seed 0 is in both
    monkeypatch.delenv(PLAN_ENV)
    queue = read_plans([second, first])
    assert [(j.config["strategy"], j.config["seed"]) for j in queue] == [("local", 0), ("local", 1), ("fedavg", 0)]
    assert main(["run-plan", str(first), str(second), "--pending"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == "3 run(s) pending in 3 jobs"
    with pytest.raises(SystemExit, match="missing.jsonl"):
        main(["run-plan", str(first), str(tmp_path / "missing.jsonl")])


# ---------------------------------------------------------------------------------------------------------------
# workers that die

WORKER_PLUGIN = '''import os
import signal
import time
from pathlib import Path

from ftta_core import register_strategy
from ftta_core.strategies import FedAvg

MARK = Path({mark!r})


@register_strategy("dies_once")
class DiesOnce(FedAvg):
    """FedAvg whose worker is SIGKILLed at its first server step, the first time only (a marker file remembers)."""

    def collaboration(self, inputs):
        if not MARK.exists():
            MARK.write_text("died")
            os.kill(os.getpid(), signal.SIGKILL)
        return super().collaboration(inputs)


@register_strategy("dies_always")
class DiesAlways(FedAvg):
    """FedAvg whose worker ends with os._exit(3) at its first server step, every time."""

    def collaboration(self, inputs):
        os._exit(3)


@register_strategy("hangs_once")
class HangsOnce(FedAvg):
    """FedAvg whose worker writes its pid to the marker file and sleeps at its first server step, the first time
    only."""

    def collaboration(self, inputs):
        if not MARK.exists():
            MARK.write_text(str(os.getpid()))
            time.sleep(600)
        return super().collaboration(inputs)
'''


def test_a_job_whose_worker_dies_is_retried_and_the_other_jobs_go_on(tmp_path):
    """Real worker processes: a job whose worker is SIGKILLed once is run again in a new worker and stored; a job
    whose worker dies every time is reported failed after ``--retries 1`` (2 attempts); the other job is stored; the
    command lists the failed job last and exits 1."""
    import subprocess
    import sys

    plugin = tmp_path / "dying.py"
    plugin.write_text(WORKER_PLUGIN.format(mark=str(tmp_path / "died-once")))
    results = tmp_path / "r"
    plan = tmp_path / "plan.jsonl"
    strategies = ["dies_once", "dies_always", "fedavg"]
    plan.write_text("".join(json.dumps({"config": dict(BASE.to_dict(), strategy=s), "results_dir": str(results)})
                            + "\n" for s in strategies))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "FTTA_PARTIAL_DIR": str(tmp_path / "partial")}
    done = subprocess.run([sys.executable, "-m", "ftta_core", "run-plan", str(plan), "--workers", "2", "--threads",
                           "1", "--retries", "1", "--plugin", str(plugin)], capture_output=True, text=True, env=env,
                          timeout=600)
    assert done.returncode == 1, done.stdout + done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    records = [json.loads(line) for line in lines if line.startswith("{")]
    retries = [r for r in records if "retry" in r]
    final = {r["job"]: r for r in records if "retry" not in r}
    assert sorted(r["job"].split("/")[2] for r in retries) == ["dies_always", "dies_once"], retries
    assert all("killed by SIGKILL" in r["reason"] or "exit status 3" in r["reason"] for r in retries), retries
    once, always, plain = (final[f"bn/fedtsa_niid/{s}/seed0"] for s in strategies)
    assert once["runs"] == 1 and once["attempts"] == 2 and "error" not in once, once
    assert always["attempts"] == 2 and "exit status 3" in always["error"], always
    assert plain["runs"] == 1 and "error" not in plain, plain
    stored = sorted(json.loads(p.read_text())["config"]["strategy"] for p in results.glob("*.json"))
    assert stored == ["dies_once", "fedavg"]  # the retried job and the plain one
    assert "1 finished after a retry; 0 left to another process running them; 1 failed" in lines[-2]
    assert lines[-1] == f"failed: bn/fedtsa_niid/dies_always/seed0: {always['error']}"


STALE_CODE_PLUGIN = '''import multiprocessing
from pathlib import Path

import ftta_core.project

MARK = Path({mark!r})
if multiprocessing.parent_process() is not None and not MARK.exists():
    # the first worker only (not the command's process): its package "was imported before every file changed"
    MARK.write_text("stale")
    ftta_core.project.IMPORTED_AT_NS = 0
'''


def test_a_worker_whose_code_changed_on_disk_exits_and_a_fresh_worker_runs_the_job(tmp_path):
    """Real worker processes: the first worker finds its code older than the files (``units.CodeChangedError``
    when the run would record its code), exits with ``CODE_CHANGED_EXIT`` instead of storing a run under code it
    does not run, and a fresh worker runs the job and stores it; no attempt is counted against the job."""
    import subprocess
    import sys

    from ftta_core.plan_runner import CODE_CHANGED_EXIT

    plugin = tmp_path / "stale.py"
    plugin.write_text(STALE_CODE_PLUGIN.format(mark=str(tmp_path / "stale-once")))
    results = tmp_path / "r"
    plan = tmp_path / "plan.jsonl"
    plan.write_text(json.dumps({"config": dict(BASE.to_dict(), strategy="fedavg"), "results_dir": str(results)})
                    + "\n")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "FTTA_PARTIAL_DIR": str(tmp_path / "partial")}
    done = subprocess.run([sys.executable, "-m", "ftta_core", "run-plan", str(plan), "--workers", "2", "--threads",
                           "1", "--plugin", str(plugin)], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    records = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [r["job"] for r in records if "restart" in r] == ["bn/fedtsa_niid/fedavg/seed0"], records
    (final,) = [r for r in records if "restart" not in r]
    assert final["runs"] == 1 and "attempts" not in final and "error" not in final, final
    assert "changed on disk after this process imported ftta_core" in done.stderr
    assert CODE_CHANGED_EXIT == 75 and len(list(results.glob("*.json"))) == 1


def _alive(pid: int) -> bool:
    """Whether process ``pid`` is still running (a zombie waiting to be reaped has ended)."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            state = next(line for line in fh if line.startswith("State:"))
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state.split()[1] not in ("Z", "X")


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads process states from /proc")
def test_a_killed_command_leaves_no_worker_running_and_its_job_runs_again(tmp_path):
    """Real worker processes: SIGKILL the run-plan command while its worker runs a job; the worker exits within
    seconds (it would otherwise compute on, holding the run's lock), and the next run-plan runs that job itself
    (not left to 'another process') and stores it."""
    import signal
    import subprocess
    import sys
    import time

    from ftta_core.plan_runner import PARENT_GONE_EXIT

    mark = tmp_path / "worker-pid"
    plugin = tmp_path / "hanging.py"
    plugin.write_text(WORKER_PLUGIN.format(mark=str(mark)))
    results = tmp_path / "r"
    plan = tmp_path / "plan.jsonl"
    plan.write_text(json.dumps({"config": dict(BASE.to_dict(), strategy="hangs_once"), "results_dir": str(results)})
                    + "\n")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "FTTA_PARTIAL_DIR": str(tmp_path / "partial")}
    command = [sys.executable, "-m", "ftta_core", "run-plan", str(plan), "--workers", "2", "--threads", "1",
               "--plugin", str(plugin)]
    first = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        deadline = time.time() + 300
        while not (mark.exists() and mark.read_text()) and first.poll() is None and time.time() < deadline:
            time.sleep(0.2)
        assert mark.exists(), first.communicate(timeout=60)
        worker = int(mark.read_text())
        assert _alive(worker)
        first.send_signal(signal.SIGKILL)
    finally:
        first.kill()
        first.communicate(timeout=60)
    deadline = time.time() + 60
    while _alive(worker) and time.time() < deadline:
        time.sleep(0.2)
    assert not _alive(worker), f"worker {worker} still runs after its command was killed"
    assert PARENT_GONE_EXIT == 76
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    (final,) = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert final["runs"] == 1 and "elsewhere" not in final and "error" not in final, final
    assert len(list(results.glob("*.json"))) == 1
