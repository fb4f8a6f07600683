"""Progress of the long operations (``ftta_core.progress``): papermill's bar over a notebook's cells, a bar over a grid
of runs and over a run plan, quiet when not wanted; progress lines (a run starting, data decoded or corrupted on first
use, a figure written) relayed from a notebook's kernel to the runner's terminal and never into the notebook; and the
notebooks' kernels run without the unencrypted-TCP warning (CurveZMQ transport encryption configured)."""
from __future__ import annotations

import os
import subprocess
import sys

import nbformat
import numpy as np
import pytest

from ftta_core import grid, notebooks, plan, plan_runner, progress, workbook
from ftta_core.data import load_dataset
from ftta_core.data.cache import cached_arrays
from ftta_core.experiment import ExperimentConfig
from ftta_core.progress import (PROGRESS_ENV, PROGRESS_FILE_ENV, papermill_progress, progress_bar, progress_line,
                                progress_task, progress_wanted, relay_progress)
from ftta_core.stream import CorruptedDomains


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
    assert shown["env"][PROGRESS_FILE_ENV] == str(tmp_path / ".00_quickstart.progress")  # the kernel's lines: relayed
    assert PROGRESS_FILE_ENV not in quiet["env"] and not list(tmp_path.glob(".*.progress"))
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
    """Every bar ``progress_bar`` makes in the grid runner and plan, shown (so it counts) and kept for inspection."""
    bars = []

    def keep(*args, **kwargs):
        bars.append(progress_bar(*args, **kwargs))
        return bars[-1]

    monkeypatch.setenv(PROGRESS_ENV, "1")
    monkeypatch.setattr(grid, "progress_bar", keep)
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


# ------------------------------------------------------------------------------------------------- progress lines
@pytest.fixture
def line_file(tmp_path, monkeypatch):
    """``$FTTA_PROGRESS_FILE`` set as the runner sets it for a kernel (bars off); the file's lines on demand."""
    path = tmp_path / "lines.progress"
    monkeypatch.setenv(PROGRESS_ENV, "0")
    monkeypatch.setenv(PROGRESS_FILE_ENV, str(path))
    monkeypatch.setattr(progress, "_SHOWN", set())
    return lambda: path.read_text().splitlines() if path.exists() else []


def test_progress_lines_go_to_the_runners_file_else_to_a_terminal(line_file, monkeypatch, capsys):
    progress_line("run 1 of 2: local, seed 0 ...", requested=False)  # False keeps bars out, not the runner's lines
    progress_line("data: x: read from the cache", once=True)
    progress_line("data: x: read from the cache", once=True)
    assert line_file() == ["run 1 of 2: local, seed 0 ...", "data: x: read from the cache"]
    monkeypatch.delenv(PROGRESS_FILE_ENV)
    progress_line("not wanted")  # pytest's stderr is no terminal
    monkeypatch.setenv(PROGRESS_ENV, "1")
    progress_line("wanted")
    progress_line("not requested", requested=False)
    assert capsys.readouterr().err.splitlines() == ["wanted"]


def test_a_counted_task_says_when_it_starts_how_far_it_is_and_when_it_ends(line_file, monkeypatch):
    monkeypatch.setattr(progress, "LINE_INTERVAL_S", 0.0)
    with progress_task("data: corrupting", total=2000, unit="image") as count:
        count.update(1000)
        count.update(1000)
    with pytest.raises(KeyError), progress_task("data: decoding"):
        raise KeyError("stops it")
    lines = line_file()
    assert lines[:3] == ["data: corrupting: 2,000 images ...", "data: corrupting: 1,000 of 2,000 images, 0 s",
                         "data: corrupting: 2,000 of 2,000 images, 0 s"]
    assert lines[3].startswith("data: corrupting: done in ") and lines[4] == "data: decoding ..."
    assert lines[5].startswith("data: decoding: stopped in ")


def test_the_relay_shows_what_another_process_appends(tmp_path, capsys):
    path = tmp_path / "kernel.progress"
    child = ("from ftta_core.progress import progress_line\n"
             "for k in range(3): progress_line(f'run {k + 1} of 3 ...')\n")
    env = {**os.environ, PROGRESS_FILE_ENV: str(path), PROGRESS_ENV: "0"}
    with relay_progress(path, interval_s=0.05):
        subprocess.run([sys.executable, "-c", child], env=env, check=True)
    assert capsys.readouterr().err.splitlines() == ["run 1 of 3 ...", "run 2 of 3 ...", "run 3 of 3 ..."]


def test_data_made_on_first_use_says_so_and_is_unchanged(line_file, tmp_path, monkeypatch):
    """The base caches and the corrupted domains announce their first use (then read quietly, one line per process
    for the corrupted ones); the arrays are those made without progress lines."""
    monkeypatch.setenv("FTTA_CACHE_DIR", str(tmp_path / "cache"))
    digits = load_dataset("embedded_digits", "test")
    built = lambda: {"images": digits.images, "labels": digits.labels}  # noqa: E731
    first = cached_arrays("digits/demo", {"n": len(digits)}, ("images", "labels"), built)
    again = cached_arrays("digits/demo", {"n": len(digits)}, ("images", "labels"), built)
    assert np.array_equal(first["images"], again["images"]) and np.array_equal(first["labels"], digits.labels)
    domains = lambda: CorruptedDomains(digits, ["fog"], 5, cache_dir=tmp_path / "corrupted")  # noqa: E731
    made, read = domains().domain_images(0), domains().domain_images(0)
    monkeypatch.delenv(PROGRESS_FILE_ENV)
    assert np.array_equal(made, read) and np.array_equal(made, CorruptedDomains(digits, ["fog"], 5)._generate("fog"))
    lines = line_file()
    decoding, corrupting = "data: decoding digits/demo (first use; cached after)", \
        "data: embedded_digits/test under fog, severity 5: corrupting (cached after)"
    assert len(lines) == 5 and lines[0] == f"{decoding} ..." and lines[1].startswith(f"{decoding}: done in ")
    assert lines[2] == f"{corrupting}: 597 images ..." and lines[3].startswith(f"{corrupting}: done in ")
    assert lines[4] == "data: embedded_digits/test: corrupted images read from the cache"


def test_paths_are_printed_relative_to_the_repository_root_and_say_so(tmp_path):
    assert notebooks.repository_path(notebooks.NOTEBOOK_DIR / "00_quickstart.ipynb") == "notebooks/00_quickstart.ipynb"
    assert (notebooks._shown_path(notebooks.NOTEBOOK_DIR / "00_quickstart.ipynb")
            == "notebooks/00_quickstart.ipynb (relative to the repository root)")
    assert notebooks._shown_path(tmp_path / "figure.png") == str(tmp_path.resolve() / "figure.png")  # outside: as is


@pytest.mark.slow
def test_a_notebook_run_shows_each_stage_on_the_runners_terminal(tmp_path, monkeypatch, capsys, use_project):
    """A real run (00_quickstart in smoke mode, cold data cache) in a checkout-shaped folder: the notebook, each run,
    the data corrupted on first use and the figure reach the runner's stderr, with paths relative to the repository
    root; the executed notebook holds none of those lines and the relay file is gone."""
    root = tmp_path / "checkout"
    (root / "notebooks").mkdir(parents=True)
    for suffix in (".ipynb", ".py"):
        (root / "notebooks" / f"00_quickstart{suffix}").symlink_to(notebooks.NOTEBOOK_DIR / f"00_quickstart{suffix}")
    use_project(root)  # the project: its notebooks/, and the root paths are shown relative to
    monkeypatch.setenv(PROGRESS_ENV, "1")
    monkeypatch.setenv("FTTA_CACHE_DIR", str(tmp_path / "cache"))  # first use: the corrupted digits are made
    monkeypatch.delenv(notebooks.SMOKE_ENV, raising=False)
    (executed,) = notebooks.execute_notebooks(["00_quickstart"], smoke=True, out_dir=root / "runs" / "quickstart")
    err = [line.strip() for line in capsys.readouterr().err.replace("\r", "\n").splitlines()]
    stages = [line for line in err if line.startswith(("notebook ", "run ", "data: ", "figure: "))]
    assert stages[0] == ("notebook 1 of 1: 00_quickstart -> runs/quickstart/00_quickstart.ipynb (relative to the "
                         "repository root)")
    runs = [line for line in stages if line.startswith("run ")]
    strategies = ["local", "fedavg", "fedamp", "pfedgraph"]
    assert runs == [f"run {k} of 4: {s}, seed 0 ..." for k, s in enumerate(strategies, 1)]
    data = [line for line in stages if line.startswith("data: ")]
    assert data and data[0].startswith("data: embedded_digits/test under ") and data[0].endswith(": 597 images ...")
    assert stages.index(runs[0]) < stages.index(data[0]) < stages.index(runs[1])  # made during the first run only
    assert stages[-1] == "figure: runs/smoke/quickstart_collaboration.png (relative to the repository root)"
    assert (root / "runs" / "smoke" / "quickstart_collaboration.png").is_file()
    cells = nbformat.read(str(executed), as_version=4).cells
    outputs = [o.get("text", "") for c in cells for o in c.get("outputs", [])]
    assert not [t for t in outputs if "data: " in t or "run 1 of" in t]
    assert not list(executed.parent.glob(".*.progress"))
