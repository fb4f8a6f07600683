"""Shared fixtures: small real batches from the embedded digits and the committed digits source model."""
from __future__ import annotations

import pytest
import torch

# the reusable parts live in the package, so users run the same backend-agreement check on their own methods
from ftta_core.contract import assert_runs_agree, shifted_batches  # noqa: F401  (imported by the test modules)
from ftta_core.training import load_source_model


# test files that start servers or processes (Flower, Ray, JupyterLab, notebook runs): left out by `make test-fast`,
# as are the single tests marked ``@pytest.mark.slow`` elsewhere (a real process killed and resumed, worker processes,
# ``python -m ftta_core`` in a subprocess)
SLOW_FILES = frozenset({"test_flower.py", "test_flower_deployment.py", "test_flower_faults.py", "test_ray_plan.py",
                        "test_lab.py", "test_notebook_runs.py", "test_plan.py", "test_plugins.py",
                        "test_results_summary.py"})


def pytest_collection_modifyitems(config, items):
    """Mark the tests of ``SLOW_FILES`` ``slow`` (``pytest -m "not slow"``: ``make test-fast``)."""
    for item in items:
        if item.path.name in SLOW_FILES:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def digits_model():
    """The committed embedded-digits source CNN (BatchNorm, 16x16 inputs)."""
    return load_source_model("digits_cnn_embedded")


@pytest.fixture(scope="module")
def one_thread():
    """Tiny tensors: one intra-op thread is faster and does not fight other jobs for the cores."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True, scope="session")
def _threads_per_worker():
    """Under pytest-xdist (``make test``: ``-n 2``) each worker process gets its share of the cores as torch
    threads, so the workers do not oversubscribe the machine; a plain pytest keeps torch's default."""
    import os

    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if workers > 1:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))
    yield


@pytest.fixture(autouse=True, scope="session")
def _partial_runs_in_tmp(tmp_path_factory):
    """Grids keep unfinished runs under ``$FTTA_PARTIAL_DIR``: in tests a temporary folder, never the checkout's
    ``runs/partial`` (``workbook.partial_dir``)."""
    import os

    before = os.environ.get("FTTA_PARTIAL_DIR")
    os.environ["FTTA_PARTIAL_DIR"] = str(tmp_path_factory.mktemp("partial"))
    yield
    if before is None:
        os.environ.pop("FTTA_PARTIAL_DIR", None)
    else:
        os.environ["FTTA_PARTIAL_DIR"] = before


@pytest.fixture
def use_project():
    """``use_project(where)``: make ``where`` (a project root, or an ``ftta_core.project.Layout``) the project whose
    folders the library uses during the test (``project.use``); returns its layout. The layout of before is restored
    afterwards."""
    from ftta_core import project

    replaced = []

    def use(where):
        replaced.append(project.use(where))
        return project.layout()

    yield use
    if replaced:
        project.use(replaced[0])


@pytest.fixture
def certified_as_is(tmp_path_factory, monkeypatch):
    """A unit lock that certifies today's implementation of every unit (``FTTA_UNITS_LOCK``, also seen by worker
    processes): for tests of the run store, which must not depend on whether the tree's changes are certified yet
    (certification itself: ``tests/test_units.py``, on the committed lock)."""
    import json

    from ftta_core import units

    lock = json.loads(units.LOCK_PATH.read_text())
    for unit in units.every_unit():
        entry = lock["units"].setdefault(unit, {"version": 1, "certified": []})
        digest = units.implementation_hash(unit)
        if digest not in entry["certified"]:
            entry["certified"].append(digest)
    path = tmp_path_factory.mktemp("units") / "units.lock.json"
    units.write_lock(lock, path)
    monkeypatch.setenv(units.LOCK_ENV, str(path))
    return path


def killed_real_run(folder, kill_when: str = "checkpoint.pt"):
    """Start a real ``python -m ftta_core run`` (embedded digits, Tent, FedAvg, a few slots) into ``folder`` and
    SIGKILL it when ``folder / kill_when`` first appears; returns the command and environment to run it again."""
    import os
    import signal
    import subprocess
    import sys
    import time

    cmd = [sys.executable, "-m", "ftta_core", "run", "--dataset", "embedded_digits", "--scenario", "heterogeneity",
           "--corruptions", "gaussian_noise,contrast", "--clients", "4", "--batch-size", "8",
           "--images-per-client", "40", "--sh", "0.5", "--th", "0.2", "--device", "cpu", "--local", "tent",
           "--local-param", "params=bn_affine", "--local-param", "lr=0.001", "--strategy", "fedavg", "--seed", "3",
           "--out", str(folder)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    deadline = time.time() + 120
    while proc.poll() is None and not (folder / kill_when).exists() and time.time() < deadline:
        time.sleep(0.002)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return cmd, env
