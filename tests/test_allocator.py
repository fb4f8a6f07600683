"""``allocator.keep_freed_memory``: applied on glibc unless turned off, and a run with it gives the same numbers bit
for bit as a run without it."""
import json
import os
import platform
import subprocess
import sys

import pytest

from ftta_core.allocator import KEEP_MEMORY_ENV, keep_freed_memory

ON_GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


def test_off_when_the_environment_says_so(monkeypatch):
    monkeypatch.setenv(KEEP_MEMORY_ENV, "0")
    assert keep_freed_memory() is False


@pytest.mark.skipif(not ON_GLIBC, reason="mallopt is glibc's")
def test_applied_on_glibc(monkeypatch):
    monkeypatch.delenv(KEEP_MEMORY_ENV, raising=False)
    assert keep_freed_memory() is True


@pytest.mark.skipif(not ON_GLIBC, reason="mallopt is glibc's")
def test_a_run_gives_the_same_numbers_with_and_without_it(tmp_path):
    """The same CLI run (all parameters, Adam, FedAvg: every step allocates and frees the stacked clients' tensors)
    in two processes, one keeping freed memory and one not: the per-step records and the summary are identical."""
    outs = {}
    for keep in ("0", "1"):
        out = tmp_path / f"keep{keep}"
        cmd = [sys.executable, "-m", "ftta_core", "run", "--dataset", "embedded_digits", "--scenario",
               "heterogeneity", "--corruptions", "gaussian_noise,contrast", "--clients", "4", "--batch-size", "8",
               "--images-per-client", "40", "--sh", "0.5", "--th", "0.2", "--device", "cpu", "--local", "tent",
               "--local-param", "params=all", "--local-param", "optimizer=adam", "--local-param", "lr=0.001",
               "--strategy", "fedavg", "--seed", "3", "--out", str(out)]
        env = {**os.environ, "OMP_NUM_THREADS": "1", KEEP_MEMORY_ENV: keep}
        subprocess.run(cmd, env=env, check=True, capture_output=True)
        summary = json.loads((out / "summary.json").read_text())
        outs[keep] = ((out / "steps.csv").read_bytes(),
                      {k: summary[k] for k in ("accuracy", "accuracy_local", "accuracy_by_domain", "class_correct")})
    assert outs["0"][0] == outs["1"][0]
    assert outs["0"][1] == outs["1"][1]
