"""Progress of the long operations (``ftta_core.progress``): papermill's bar over a notebook's cells, a bar over a grid
of runs and over a run plan, quiet when not wanted; and the notebooks' kernels run without the unencrypted-TCP
warning (CurveZMQ transport encryption configured)."""
from __future__ import annotations

import os

import pytest

from ftta_core import notebooks, plan, plan_runner, workbook
from ftta_core.experiment import ExperimentConfig
from ftta_core.progress import PROGRESS_ENV, papermill_progress, progress_bar, progress_wanted


def test_progress_wanted_follows_the_env_var_and_the_terminal(monkeypatch):
    monkeypatch.delenv(PROGRESS_ENV, raising=False)
    assert not progress_wanted()  # pytest captures stderr: not a terminal, no kernel
    monkeypatch.setenv(PROGRESS_ENV, "1")
    assert progress_wanted() and not progress_wanted(False)
    assert papermill_progress("nb") == {"desc": "nb", "unit": "cell"}
    monkeypatch.setenv(PROGRESS_ENV, "0")
    assert not progress_wanted() and papermill_progress("nb") is False


@pytest.fixture
def papermill_calls(monkeypatch):
    """papermill's execute_notebook replaced by a recorder of its keyword arguments and of the kernel's env."""
    import papermill

    calls = []

    def record(source, target, **kwargs):
        calls.append({**kwargs, "env": dict(os.environ)})

    monkeypatch.setattr(papermill, "execute_notebook", record)
    return calls


def test_notebook_runner_passes_a_progress_bar_to_papermill(papermill_calls, monkeypatch, tmp_path):
    monkeypatch.setenv(PROGRESS_ENV, "1")
    monkeypatch.setenv(notebooks.FRONTEND_ENV, "from-a-lab-kernel")
    notebooks.execute_notebooks(["00_quickstart"], smoke=True, out_dir=tmp_path)
    notebooks.execute_notebooks(["00_quickstart"], smoke=True, out_dir=tmp_path, progress=False)
    shown, quiet = papermill_calls
    assert shown["progress_bar"] == {"desc": "00_quickstart", "unit": "cell"}
    assert quiet["progress_bar"] is False
    assert notebooks.FRONTEND_ENV not in shown["env"]  # executed notebooks render static figures
    assert os.environ[notebooks.FRONTEND_ENV] == "from-a-lab-kernel"  # restored after the run


def test_notebook_kernels_run_quiet_and_encrypted(papermill_calls, monkeypatch, tmp_path):
    import zmq

    monkeypatch.delenv(PROGRESS_ENV, raising=False)
    notebooks.execute_notebooks(["00_quickstart"], smoke=True, out_dir=tmp_path)
    (call,) = papermill_calls
    assert call["progress_bar"] is False  # stderr is no terminal here
    assert call["env"][PROGRESS_ENV] == "0"  # no bar widgets inside the executed notebooks
    assert PROGRESS_ENV not in os.environ
    if zmq.has("curve"):
        assert call["config"].KernelManager.transport_encryption == "auto"


@pytest.fixture
def counted_bars(monkeypatch):
    """Every bar ``progress_bar`` makes in workbook and plan, shown (so it counts) and kept for inspection."""
    bars = []

    def keep(*args, **kwargs):
        bars.append(progress_bar(*args, **kwargs))
        return bars[-1]

    monkeypatch.setenv(PROGRESS_ENV, "1")
    monkeypatch.setattr(workbook, "progress_bar", keep)
    monkeypatch.setattr(plan_runner, "progress_bar", keep)
    return bars


def test_grid_progress_bars_count_the_runs(counted_bars, tmp_path):
    base = ExperimentConfig(dataset="embedded_digits", scenario="heterogeneity", clients=4, device="cpu")
    variants = {"fedavg": {"strategy": "fedavg"}, "local": {"strategy": "local"}, "fedtsa": {"strategy": "fedtsa"}}
    workbook.run_grid(base, variants, seeds=[0, 1], results_dir=tmp_path, only_cached=True)
    workbook.run_strategy_grid(base, ["local", "fedavg"], seeds=[0, 1, 2], results_dir=tmp_path, only_cached=True)
    grid, strategy_grid = counted_bars
    assert (grid.n, grid.total) == (6, 6)
    assert (strategy_grid.n, strategy_grid.total) == (6, 6)


def test_run_plan_progress_bar_counts_the_jobs(counted_bars, monkeypatch):
    monkeypatch.setattr(plan_runner, "_init_worker", lambda threads: None)
    monkeypatch.setattr(plan_runner, "_run_before", lambda job, deadline: {"job": job.describe(), "runs": 1})
    jobs = [plan.PlannedJob({"local": "bn", "scenario": "x", "strategy": s, "seed": 0}, "r") for s in "abc"]
    plan_runner.run_plan(jobs, workers=1, log=lambda line: None)
    (bar,) = counted_bars
    assert (bar.n, bar.total) == (3, 3)
