"""The run store: crashes at every write leave a resumable or complete run, locks, overwrite refusal, code records."""
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import ftta_core.experiment as experiment
import ftta_core.runstore as runstore
from ftta_core.experiment import ExperimentConfig, run_experiment
from ftta_core.build import code_record
from ftta_core.runstore import (RunLock, RunStoreError, read_summary, run_status, scan_table,
                                source_hash, stale_modules, usable)
from ftta_core.workbook import config_key, run_grid
from conftest import killed_real_run

pytestmark = pytest.mark.usefixtures("one_thread")

SMALL = dict(dataset="embedded_digits", scenario="heterogeneity", corruptions=["gaussian_noise", "contrast"],
             clients=4, batch_size=8, images_per_client=40, sh=0.5, th=0.2, device="cpu")  # 2 slots of 5 steps
CFG = ExperimentConfig(**SMALL, local="tent", local_params={"params": "bn_affine", "lr": 1e-3}, strategy="fedavg",
                       seed=3)


class Crash(BaseException):
    """A simulated kill: not an Exception, so nothing on the way catches it."""


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    os.environ.setdefault("FTTA_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    return run_experiment(CFG, out=tmp_path_factory.mktemp("ref") / "run")


def assert_same_run(folder: Path, ref) -> None:
    steps = pd.read_csv(folder / "steps.csv")
    pd.testing.assert_frame_equal(steps, ref.steps.reset_index(drop=True), check_dtype=False)
    assert np.array_equal(np.load(folder / "collaboration.npz")["W"], ref.collaboration.astype(np.float32))
    summary = json.loads((folder / "summary.json").read_text())
    for key in ("accuracy", "accuracy_local", "accuracy_source", "n_predictions", "accuracy_by_domain"):
        assert summary[key] == ref.summary[key], key
    assert not (folder / "checkpoint.pt").exists() and not (folder / "collaboration_parts").exists()


def crashing(original, at: int, when: str, counter: dict):
    """``original`` (an atomic writer ``(path, arg)``) that crashes at its ``at``-th call: before writing, inside
    (temporary file written, not renamed), or after writing."""

    def wrapper(path, arg):
        counter["n"] += 1
        if counter["n"] != at:
            return original(path, arg)
        if when == "before":
            raise Crash
        if when == "inside":  # killed while the temporary file is half written

            def half(fh):
                if callable(arg):
                    arg(fh)
                    fh.truncate(fh.tell() // 2)
                else:
                    fh.write(arg[:len(arg) // 2].encode())
                raise Crash

            runstore.atomic_write(path, half)
        original(path, arg)
        raise Crash

    return wrapper


WRITES_PER_RUN = 6  # per slot: W part + checkpoint (2 slots); then W and the summary


@pytest.mark.parametrize("when", ["before", "inside", "after"])
@pytest.mark.parametrize("at", range(1, WRITES_PER_RUN + 1))
def test_a_crash_at_any_write_resumes_to_the_uninterrupted_run(tmp_path, monkeypatch, reference, at, when):
    counter = {"n": 0}
    monkeypatch.setattr(experiment, "atomic_write", crashing(runstore.atomic_write, at, when, counter))
    monkeypatch.setattr(experiment, "atomic_write_text", crashing(runstore.atomic_write_text, at, when, counter))
    folder = tmp_path / "run"
    with pytest.raises(Crash):
        run_experiment(CFG, out=folder)
    assert counter["n"] == at
    monkeypatch.undo()
    run_experiment(CFG, out=folder)
    assert_same_run(folder, reference)
    assert counter["n"] == at  # the resume used the real writers
    assert not list(folder.rglob("*.tmp"))  # no temporary file is left behind


def test_a_row_torn_by_a_kill_is_dropped_on_resume(tmp_path, monkeypatch, reference):
    """Killed while appending the second slot's rows: the checkpoint vouches for the first slot's bytes only."""
    counter = {"n": 0}
    monkeypatch.setattr(experiment, "atomic_write", crashing(runstore.atomic_write, 4, "before", counter))
    folder = tmp_path / "run"
    with pytest.raises(Crash):  # second slot: rows appended, W part written, checkpoint not
        run_experiment(CFG, out=folder)
    with open(folder / "steps.csv", "a") as fh:
        fh.write("7,1,gaussian")  # a torn line whose 'step' would parse as an early step
    monkeypatch.undo()
    run_experiment(CFG, out=folder)
    assert_same_run(folder, reference)


def test_checkpoints_written_before_byte_counts_still_resume(tmp_path, monkeypatch, reference):
    counter = {"n": 0}
    monkeypatch.setattr(experiment, "atomic_write", crashing(runstore.atomic_write, 4, "before", counter))
    folder = tmp_path / "run"
    with pytest.raises(Crash):
        run_experiment(CFG, out=folder)
    monkeypatch.undo()
    state = runstore.load_checkpoint(folder / "checkpoint.pt")
    del state["csv_bytes"], state["files"]
    torch.save(state, folder / "checkpoint.pt")  # as written before checkpoints carried byte counts and digests
    run_experiment(CFG, out=folder)
    assert_same_run(folder, reference)


@pytest.mark.slow  # starts real processes: make test, not make test-fast
@pytest.mark.parametrize("kill_when", ["checkpoint.pt", "collaboration.npz"])
def test_kill_9_of_a_real_process_then_resume(tmp_path, reference, kill_when):
    """A real ``python -m ftta_core run`` killed with SIGKILL when ``kill_when`` first appears (after the first
    slot's checkpoint; inside the final writes), then resumed."""
    folder = tmp_path / "run"
    cmd, env = killed_real_run(folder, kill_when)
    assert subprocess.run(cmd, stdout=subprocess.DEVNULL, env=env).returncode == 0
    assert_same_run(folder, reference)


def test_a_second_run_into_a_locked_folder_stops_at_once(tmp_path, reference):
    folder = tmp_path / "run"
    with RunLock(folder):
        with pytest.raises(RunStoreError, match="in use by another run"):
            run_experiment(CFG, out=folder)
    assert not (folder / "steps.csv").exists()
    run_experiment(CFG, out=folder)  # released
    assert_same_run(folder, reference)


def test_a_finished_run_is_read_back_and_never_rewritten(tmp_path, monkeypatch, reference):
    folder = tmp_path / "run"
    run_experiment(CFG, out=folder)
    before = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}

    def no_step(*args, **kwargs):
        raise AssertionError("a finished run was run again")

    monkeypatch.setattr(experiment.Engine, "step", no_step)
    res = run_experiment(CFG, out=folder)
    assert res.summary["accuracy"] == reference.summary["accuracy"]
    assert {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()} == before


def test_another_config_is_refused_unless_overwrite(tmp_path, reference):
    folder = tmp_path / "run"
    run_experiment(CFG, out=folder)
    other = ExperimentConfig(**{**CFG.to_dict(), "seed": 4})
    with pytest.raises(RunStoreError, match="another config.*seed: 3 there, 4 here.*--overwrite"):
        run_experiment(other, out=folder)
    assert_same_run(folder, reference)
    res = run_experiment(other, out=folder, overwrite=True)
    assert json.loads((folder / "summary.json").read_text())["config"]["seed"] == 4
    assert res.summary["config"]["seed"] == 4


def test_a_stale_finished_run_is_refused_unless_reused_or_overwritten(tmp_path, capsys, reference):
    """``run --out`` on a finished run whose code changed meaning since (a unit's version bumped) says so in one
    line and exits 2, instead of printing the stale result; ``--reuse-stale`` reads it back, ``--overwrite`` runs it
    again (current then)."""
    from ftta_core.cli import main

    def bump_fedavg(folder):
        summary = json.loads((folder / "summary.json").read_text())
        summary["code"]["units"]["strategies.basic"] = 0  # as if FedAvg's version had been bumped since
        (folder / "summary.json").write_text(runstore.dumps_summary(summary))  # sealed again: not damaged

    folder = tmp_path / "run"
    run_experiment(CFG, out=folder)
    bump_fedavg(folder)
    with pytest.raises(RunStoreError, match=r"changed since \(strategies.basic@0->1\).*--overwrite.*--reuse-stale"):
        run_experiment(CFG, out=folder)
    assert run_experiment(CFG, out=folder, reuse_stale=True).summary["code"]["units"]["strategies.basic"] == 0
    again = run_experiment(CFG, out=folder, overwrite=True)
    assert again.summary["code"]["units"]["strategies.basic"] == 1
    assert again.summary["accuracy"] == reference.summary["accuracy"]

    cli = ["run", "--dataset", "embedded_digits", "--scenario", "heterogeneity", "--corruptions", "gaussian_noise",
           "--clients", "2", "--batch-size", "8", "--images-per-client", "16", "--local", "bn", "--strategy",
           "fedavg", "--device", "cpu", "--out", str(tmp_path / "cli")]
    assert main(cli) == 0
    capsys.readouterr()
    bump_fedavg(tmp_path / "cli")
    assert main(cli) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "changed since (strategies.basic@0->1)" in err[0]
    assert main(cli + ["--reuse-stale"]) == 0 and main(cli + ["--overwrite"]) == 0


def test_empty_out_is_refused(capsys):
    from ftta_core.cli import main

    with pytest.raises(SystemExit):
        main(["run", "--local", "bn", "--out", ""])
    assert "empty --out" in capsys.readouterr().err
    with pytest.raises(ValueError, match="empty path"):
        run_experiment(CFG, out=" ")


# ---------------------------------------------------------------------------------------------------------------
# code records

def test_source_hash_ignores_docstrings_and_comments_but_not_code():
    a = 'def f(x):\n    """Doc."""\n    return x + 1  # one\n'
    b = 'def f(x):\n    """Other words."""\n\n    return x + 1\n'
    c = 'def f(x):\n    """Doc."""\n    return x + 2\n'
    assert source_hash(a) == source_hash(b) != source_hash(c)


@pytest.mark.usefixtures("certified_as_is")
def test_code_record_names_the_methods_units_and_the_run_loop():
    record = code_record("tent", "fedtsa")
    assert {"tta.basic", "tta.base", "strategies.fedtsa", "ts_block", "loop", "run_builder", "run_summary",
            "client_conv", "bn_running"} <= set(record["units"])
    assert set(record["units"]) == set(record["implementation"]) and all(record["implementation"].values())
    assert "strategies.fedamp" not in record["units"] and "tta.cotta" not in record["units"]
    assert not any(u in record["units"] for u in ("runstore", "units", "progress", "experiment", "workbook"))
    assert stale_modules(code_record("bn", "fedavg")) == []


@pytest.mark.usefixtures("certified_as_is")
def test_stale_runs_are_flagged_and_rerun_on_request(tmp_path, monkeypatch, caplog, reference):
    results = tmp_path / "results"
    cfg = ExperimentConfig(**SMALL, local="bn", strategy="fedavg", seed=0, smoke=True)
    first = run_grid(cfg, {"fedavg": {}}, [0], results_dir=results, progress=False)
    path = results / f"{config_key(cfg)}.json"
    summary = json.loads(path.read_text())
    assert run_status(summary) == "current"
    summary["code"]["units"]["strategies.basic"] = 0  # as if FedAvg's meaning had changed since (a version bump)
    summary["accuracy"] = -1.0
    path.write_text(runstore.dumps_summary(summary))  # sealed again: stale, not damaged
    with caplog.at_level("WARNING"):
        again = run_grid(cfg, {"fedavg": {}}, [0], results_dir=results, progress=False)
    assert again.accuracy.iloc[0] == -1.0  # read back, but not silently:
    assert "changed since (strategies.basic@0->1)" in caplog.text and "FTTA_RERUN_STALE" in caplog.text
    monkeypatch.setenv("FTTA_RERUN_STALE", "1")
    assert usable(path) is None
    rerun = run_grid(cfg, {"fedavg": {}}, [0], results_dir=results, progress=False)
    assert rerun.accuracy.iloc[0] == first.accuracy.iloc[0]
    assert run_status(read_summary(path)) == "current"


@pytest.mark.usefixtures("certified_as_is")
def test_reproduce_marks_a_stale_run_current_only_when_every_number_agrees(tmp_path, capsys, reference):
    from ftta_core.cli import main

    results = tmp_path / "results"
    cfg = ExperimentConfig(**SMALL, local="bn", strategy="fedamp", seed=0, smoke=True)
    run_grid(cfg, {"fedamp": {}}, [0], results_dir=results, progress=False)
    path = results / f"{config_key(cfg)}.json"
    stored = json.loads(path.read_text())
    stale = {**stored, "code": {**stored["code"], "units": {**stored["code"]["units"], "strategies.fedamp": 0}}}
    del stale["absent_uploads"]  # a field added after the run was stored is not asked of it
    path.write_text(runstore.dumps_summary(stale))  # as if FedAMP's version had been bumped, without moving a number
    assert run_status(read_summary(path)) == "stale"
    assert main(["reproduce", str(path)]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["status"] == "reproduced" and result["differences"] == []
    again = read_summary(path)
    assert run_status(again) == "current" and again["accuracy"] == stored["accuracy"]
    assert again["reproduced"][0]["former_changed"] == ["strategies.fedamp@0->1"]
    # a number that today's code does not make: reported, the file left as it is, exit status 1
    wrong = {**stale, "accuracy_by_domain": {**stale["accuracy_by_domain"], "contrast": 1.0}}
    path.write_text(runstore.dumps_summary(wrong))
    assert main(["reproduce", str(path)]) == 1
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["status"] == "differs" and result["differences"][0].startswith("accuracy_by_domain.contrast: 1.0 ->")
    assert read_summary(path) == runstore.without_integrity(wrong)
    # --replace: today's run takes its place, current, with a note of what it replaced
    assert main(["reproduce", "--replace", str(path)]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["status"] == "remade" and len(result["differences"]) == 1
    remade = read_summary(path)
    assert run_status(remade) == "current" and remade["accuracy_by_domain"] == stored["accuracy_by_domain"]
    assert remade["remade"][0]["former"] == {"accuracy": wrong["accuracy"], "accuracy_local": wrong["accuracy_local"]}
    assert remade["remade"][0]["numbers_moved"] == 1 and remade["remade"][0]["former_changed"] == [
        "strategies.fedamp@0->1"]
    assert main(["reproduce", str(tmp_path / "missing.json")]) == 2


@pytest.mark.slow  # starts worker processes: make test, not make test-fast
@pytest.mark.usefixtures("certified_as_is")
def test_reproduce_runs_several_stale_runs_in_worker_processes_through_resumable_folders(tmp_path, capsys,
                                                                                          monkeypatch, reference):
    from ftta_core.cli import main

    monkeypatch.setenv("FTTA_PARTIAL_DIR", str(tmp_path / "partial"))
    results, paths = tmp_path / "results", []
    for seed in (0, 1):
        cfg = ExperimentConfig(**SMALL, local="bn", strategy="fedavg", seed=seed, smoke=True)
        run_grid(cfg, {"fedavg": {}}, [seed], results_dir=results, progress=False)
        paths.append(results / f"{config_key(cfg)}.json")
        stored = json.loads(paths[-1].read_text())
        stored["code"]["units"]["strategies.basic"] = 0
        paths[-1].write_text(runstore.dumps_summary(stored))
    assert main(["reproduce", "--workers", "2", *map(str, paths)]) == 0
    out = [json.loads(line) for line in capsys.readouterr().out.strip().splitlines()]
    assert sorted(r["path"] for r in out) == sorted(map(str, paths)) and {r["status"] for r in out} == {"reproduced"}
    assert all(run_status(read_summary(p)) == "current" for p in paths)
    assert not list((tmp_path / "partial").glob("*"))  # each resumable folder is removed once its run is compared
    assert main(["reproduce", "--workers", "0", str(paths[0])]) == 2


@pytest.mark.usefixtures("certified_as_is")
def test_every_committed_run_is_read_by_the_store():
    table = scan_table([Path(__file__).resolve().parents[1] / "figures"])
    assert len(table) > 900
    assert set(table.status) <= {"current", "stale", "unrecorded"}  # nothing unreadable or unfinished
    assert {"summary-file", "run-folder", "record"} <= set(table.layout)


def test_the_recorded_commit_follows_head_within_one_process(tmp_path, monkeypatch):
    """A process that stores runs while commits land (a kernel, a test session) records each run's commit."""
    from ftta_core import runstore

    git = tmp_path / ".git"
    (git / "refs" / "heads").mkdir(parents=True)
    (git / "HEAD").write_text("ref: refs/heads/main\n")
    (git / "refs" / "heads" / "main").write_text("a" * 40 + "\n")
    monkeypatch.setattr(runstore, "_git_dir", lambda: git)
    assert runstore._git_commit() == "a" * 40
    (git / "refs" / "heads" / "main").write_text("b" * 40 + "\n")  # a commit lands
    assert runstore._git_commit() == "b" * 40
    (git / "refs" / "heads" / "main").unlink()
    (git / "packed-refs").write_text("# pack-refs\n" + "c" * 40 + " refs/heads/main\n")
    assert runstore._git_commit() == "c" * 40


@pytest.mark.usefixtures("certified_as_is")
def test_a_resumable_run_left_by_other_code_is_made_again_not_resumed_or_read_back(tmp_path, monkeypatch):
    """``grid.resumable_run``: a run left in the folder (here a finished one, not yet collected) is read back only
    while the code that made it is unchanged; otherwise, or when its code was not recorded, it is cleared and made
    again; a run during which the code changed is stored nowhere."""
    import ftta_core.grid as grid

    cfg = ExperimentConfig(**SMALL, local="bn", strategy="fedavg", seed=0, smoke=True)
    folder = tmp_path / "partial"
    first = grid.resumable_run(cfg, folder)
    mark = json.loads((folder / grid.CODE_MARK).read_text())
    assert mark["units"] == code_record("bn", "fedavg", cfg)["units"]
    summary = folder / "summary.json"
    stamp = summary.stat().st_mtime_ns
    again = grid.resumable_run(cfg, folder)  # same code: read back, not run again
    assert summary.stat().st_mtime_ns == stamp and again.summary["accuracy"] == first.summary["accuracy"]
    mark["units"]["strategies.basic"] = 0  # as if FedAvg's version changed since
    (folder / grid.CODE_MARK).write_text(json.dumps(mark))
    grid.resumable_run(cfg, folder)
    assert summary.stat().st_mtime_ns != stamp  # made again
    assert run_status(read_summary(summary)) == "current"
    stamp = summary.stat().st_mtime_ns
    (folder / grid.CODE_MARK).unlink()  # a run whose code was never recorded
    grid.resumable_run(cfg, folder)
    assert summary.stat().st_mtime_ns != stamp and (folder / grid.CODE_MARK).exists()
    fresh = tmp_path / "changed"
    monkeypatch.setattr(grid, "stale_modules", lambda record: ["ftta_core.strategies.basic:FedAvg"])
    with pytest.raises(RunStoreError, match="the code changed while the run ran"):
        grid.resumable_run(cfg, fresh)


def test_a_run_killed_after_its_last_commit_resumes_to_the_same_summary(tmp_path, monkeypatch, reference):
    """A kill inside ``RunWriter.finish`` before ``summary.json`` lands leaves a checkpoint at the last step: the
    resume runs no step and must still write the recorder's numbers (upload size per client and step included)."""
    folder = tmp_path / "run"

    def killed(self, *args, **kwargs):
        raise KeyboardInterrupt("killed before the summary was written")

    with monkeypatch.context() as m:
        m.setattr(experiment.RunWriter, "finish", killed)
        with pytest.raises(KeyboardInterrupt):
            run_experiment(CFG, out=folder)
    assert (folder / "checkpoint.pt").exists() and not (folder / "summary.json").exists()

    def no_step(*args, **kwargs):
        raise AssertionError("the resume ran a step although every step was committed")

    monkeypatch.setattr(experiment.Engine, "step", no_step)
    resumed = run_experiment(CFG, out=folder).summary
    assert resumed["upload_bytes_per_client_step"] == reference.summary["upload_bytes_per_client_step"] > 0
    assert resumed["accuracy"] == reference.summary["accuracy"]


def test_temporary_files_of_killed_writes_are_removed_on_the_next_start(tmp_path, reference):
    folder = tmp_path / "run"
    (folder / "collaboration_parts").mkdir(parents=True)
    left = [folder / ".checkpoint.pt.4242.abcd.tmp", folder / "collaboration_parts" / ".00000010.npy.4242.ef.tmp"]
    for path in left:
        path.write_bytes(b"\0" * 1024)  # what a kill during a write leaves
    run_experiment(CFG, out=folder)
    assert not any(path.exists() for path in left) and not list(folder.rglob("*.tmp"))
