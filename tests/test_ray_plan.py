"""run-plan on a Ray cluster: a head and a worker node started on 127.0.0.1 run the planned jobs, storing exactly the
summaries local workers store (same accuracies), with plugins propagated, failures reported per job, stored jobs
skipped on a re-run, and every process the test started gone at the end."""
import argparse
import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from ftta_core.experiment import ExperimentConfig
from ftta_core.plan import read_plan
from ftta_core.plan_runner import run_plan
from ftta_core.plugins import PLUGINS_ENV
from ftta_core.ray_plan import RAY_BIN, LocalCluster, add_ray_option, plan_executor, run_plan_ray, worker_env
from ftta_core.runstore import read_summary

BASE = ExperimentConfig(dataset="embedded_digits", scenario="fedtsa_niid", clients=4, batch_size=5,
                        images_per_client=10, corruptions=["fog", "contrast", "frost", "glass_blur"], local="bn",
                        device="cpu", max_steps=3)
PLUGIN = ("from ftta_core import register_strategy\nfrom ftta_core.strategies import FedAvg\n"
          "register_strategy('ray_test_avg', type('RayTestAvg', (FedAvg,), {}))\n")
# a strategy whose worker is SIGKILLed at its first server step, the first time only (the marker file remembers)
DIES_ONCE = """
import os, signal
from pathlib import Path


class RayDiesOnce(FedAvg):
    def collaboration(self, inputs):
        if not Path({mark!r}).exists():
            Path({mark!r}).write_text("died")
            os.kill(os.getpid(), signal.SIGKILL)
        return super().collaboration(inputs)


register_strategy("ray_dies_once", RayDiesOnce)
"""


def _write_plan(path, results):
    """Three jobs: a shared TTA-bn pass (local + fedavg), a strategy only a plugin knows, and a broken config."""
    jobs = [{"config": BASE.to_dict(), "results_dir": str(results), "strategies": ["local", "fedavg"]},
            {"config": dict(BASE.to_dict(), strategy="ray_test_avg"), "results_dir": str(results)},
            {"config": dict(BASE.to_dict(), strategy="no_such_strategy"), "results_dir": str(results)}]
    path.write_text("".join(json.dumps(j) + "\n" for j in jobs))
    return read_plan(path)


def _summaries(folder):
    """Each stored summary by file name, without its wall time (the only field that may differ between runs) and
    the digest that seals it (of the wall time too)."""
    out = {}
    for f in sorted(folder.glob("*.json")):
        summary = read_summary(f)  # checked against its digest
        summary.pop("wall_time_s", None)
        out[f.name] = summary
    return out


def test_worker_env_puts_this_checkout_first_and_never_plans(monkeypatch):
    env = worker_env({"FTTA_PLAN": "p.jsonl", "FTTA_PLUGINS": "/x/p.py", "PYTHONPATH": "/elsewhere", "HOME": "/h"})
    assert "FTTA_PLAN" not in env and env["FTTA_PLUGINS"] == "/x/p.py" and "HOME" not in env
    assert env["PYTHONPATH"].endswith(":/elsewhere") and (__import__("pathlib").Path(
        env["PYTHONPATH"].split(":")[0]) / "ftta_core" / "ray_plan.py").is_file()


def test_run_plan_runs_locally_without_ray_and_on_ray_with_it():
    parser = argparse.ArgumentParser()
    add_ray_option(parser)
    assert plan_executor(parser.parse_args([])) is run_plan
    ray_run = plan_executor(parser.parse_args(["--ray", "127.0.0.1:6379"]))
    assert ray_run.func is run_plan_ray and ray_run.keywords == {"address": "127.0.0.1:6379", "gpus": 0.0}
    assert plan_executor(parser.parse_args(["--ray", "auto", "--ray-gpus", "0.25"])).keywords["gpus"] == 0.25


@pytest.mark.skipif(not RAY_BIN.exists(), reason="the ray command line is not installed")
def test_a_plan_on_a_two_node_ray_cluster_stores_what_local_workers_store(tmp_path, monkeypatch, capsys):
    """``python -m ftta_core run-plan FILE --ray ADDRESS`` on a head and a worker node started on 127.0.0.1."""
    pytest.importorskip("ray")
    from ftta_core.cli import main

    plugin = tmp_path / "ray_test_plugin.py"
    plugin.write_text(PLUGIN + DIES_ONCE.format(mark=str(tmp_path / "died-once")))
    monkeypatch.setenv(PLUGINS_ENV, str(plugin))
    jobs = _write_plan(tmp_path / "ray.jsonl", tmp_path / "ray")
    with open(tmp_path / "ray.jsonl", "a") as fh:  # on Ray only: its worker dies once, Ray runs it again
        fh.write(json.dumps({"config": dict(BASE.to_dict(), strategy="ray_dies_once"),
                             "results_dir": str(tmp_path / "ray")}) + "\n")
    lines = []
    with ThreadPoolExecutor(1) as pool:  # the local reference (one thread, as a Ray task) while the nodes start
        local = pool.submit(run_plan, _write_plan(tmp_path / "local.jsonl", tmp_path / "local"), threads=1,
                            log=lambda line: None)
        with LocalCluster(nodes=2, cpus_per_node=1) as cluster:
            code = main(["run-plan", str(tmp_path / "ray.jsonl"), "--ray", cluster.address])
        assert cluster.leftovers() == []  # every process of both nodes (raylets, GCS, agents, workers) is gone
    assert sorted(d["runs"] for d in local.result()) == [0, 1, 2]
    lines += [line for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    done = [json.loads(line) for line in lines]
    assert code == 1  # the broken job fails the command, after the others ran

    by_job = {d["job"]: d for d in done}
    assert len(lines) == 4 and all("\n" not in line for line in lines)
    assert by_job["bn/fedtsa_niid/local+fedavg/seed0"]["runs"] == 2
    assert by_job["bn/fedtsa_niid/ray_test_avg/seed0"]["runs"] == 1  # the plugin reached the Ray workers
    assert "no_such_strategy" in by_job["bn/fedtsa_niid/no_such_strategy/seed0"]["error"]
    assert (tmp_path / "died-once").exists() and by_job["bn/fedtsa_niid/ray_dies_once/seed0"]["runs"] == 1  # retried
    assert len({d["node"] for d in done if "node" in d}) == 2  # the head and the worker node both ran jobs
    ray_runs, local_runs = _summaries(tmp_path / "ray"), _summaries(tmp_path / "local")
    assert len(ray_runs) == 4 and {k: v for k, v in ray_runs.items() if k in local_runs} == local_runs
    # resumable: stored jobs are not submitted (no cluster needed to find that out)
    assert all(d["stored"] for d in run_plan_ray(jobs[:2], address="127.0.0.1:1", log=lambda line: None))
