"""Every stored byte checked on read (issue 53, part two): a damaged checkpoint, W part, ``steps.csv``,
``collaboration.npz`` or summary is named in one line; an unfinished run starts again from step 0 (its last intact
state, same result), a finished one is refused (``--overwrite`` runs it again); summary files are sealed; the base
data caches keep checksum sidecars (a cache written without one is adopted once). Files written before digests
existed are read unchecked."""
from __future__ import annotations

import json
import logging
import subprocess
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import ftta_core.experiment as experiment
import ftta_core.runstore as runstore
from ftta_core.data import cache
from ftta_core.experiment import run_experiment
from ftta_core.runstore import DamagedRun, read_summary, scan, store_summary
from test_runstore import CFG, Crash, assert_same_run, crashing, reference  # noqa: F401  (a fixture)
from conftest import killed_real_run

pytestmark = pytest.mark.usefixtures("one_thread")


def flip(path: Path, at: int = -100) -> None:
    """Flip every bit of one byte of ``path`` (``at`` from the end when negative): a damaged sector."""
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


def unfinished(folder: Path, monkeypatch) -> None:
    """A run of ``CFG`` killed after its first slot's checkpoint (before the second slot's W part)."""
    with monkeypatch.context() as m:
        m.setattr(experiment, "atomic_write", crashing(runstore.atomic_write, 3, "before", {"n": 0}))
        with pytest.raises(Crash):
            run_experiment(CFG, out=folder)
    assert (folder / "checkpoint.pt").exists() and not (folder / "summary.json").exists()


DAMAGE = {
    "checkpoint bit flip": ("checkpoint.pt", lambda f: flip(f, len(f.read_bytes()) // 2)),
    "checkpoint truncated": ("checkpoint.pt", lambda f: f.write_bytes(f.read_bytes()[:1000])),
    "W part bit flip": ("collaboration_parts/00000005.npy", lambda f: flip(f, -3)),
    "W part missing": ("collaboration_parts/00000005.npy", lambda f: f.unlink()),
    "row bit flip": ("steps.csv", lambda f: flip(f, 200)),
    "rows cut short": ("steps.csv", lambda f: f.write_bytes(f.read_bytes()[:300])),
}


@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_a_damaged_file_of_an_unfinished_run_is_named_and_the_run_starts_again(tmp_path, monkeypatch, caplog,
                                                                                reference, case):
    folder = tmp_path / "run"
    unfinished(folder, monkeypatch)
    name, damage = DAMAGE[case]
    damage(folder / name)
    with caplog.at_level(logging.WARNING, logger="ftta_core"):
        run_experiment(CFG, out=folder)
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) == 1 and "\n" not in lines[0], lines
    assert str(folder / name) in lines[0] and "starts again from step 0" in lines[0], lines[0]
    assert_same_run(folder, reference)  # not the numbers of a damaged state


def test_an_intact_unfinished_run_resumes_without_a_word(tmp_path, monkeypatch, caplog, reference):
    folder = tmp_path / "run"
    unfinished(folder, monkeypatch)
    state = runstore.load_checkpoint(folder / "checkpoint.pt")
    assert state["next_step"] == 5 and set(state["files"]) == {"steps.csv", "collaboration_parts/00000005.npy"}

    def no_early_step(self, batch):
        assert batch.step >= 5, "a step the checkpoint covers was run again"
        return original(self, batch)

    original = experiment.Engine.step
    monkeypatch.setattr(experiment.Engine, "step", no_early_step)
    with caplog.at_level(logging.WARNING, logger="ftta_core"):
        run_experiment(CFG, out=folder)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert_same_run(folder, reference)


FINISHED_DAMAGE = {
    "summary number changed": ("summary.json", lambda f: f.write_text(f.read_text().replace(
        '"accuracy": ', '"accuracy": 1', 1))),
    "summary truncated": ("summary.json", lambda f: f.write_text(f.read_text()[:50])),
    "W bit flip": ("collaboration.npz", lambda f: flip(f, len(f.read_bytes()) // 2)),
    "W missing": ("collaboration.npz", lambda f: f.unlink()),
    "rows bit flip": ("steps.csv", lambda f: flip(f, 300)),
}


@pytest.mark.parametrize("case", sorted(FINISHED_DAMAGE))
def test_a_damaged_finished_run_is_refused_in_one_line_until_overwritten(tmp_path, capsys, case):
    from ftta_core.cli import main

    folder = tmp_path / "run"
    cli = ["run", "--dataset", "embedded_digits", "--scenario", "heterogeneity", "--corruptions", "gaussian_noise",
           "--clients", "2", "--batch-size", "8", "--images-per-client", "16", "--local", "bn", "--strategy",
           "fedavg", "--device", "cpu", "--out", str(folder)]
    assert main(cli) == 0
    first = json.loads((folder / "summary.json").read_text())
    assert set(first["integrity"]["files"]) == {"steps.csv", "collaboration.npz"}
    capsys.readouterr()
    name, damage = FINISHED_DAMAGE[case]
    damage(folder / name)
    assert main(cli) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(folder / name) in err[0] and "--overwrite" in err[0], err
    assert [e.status for e in scan(tmp_path)] == ["unreadable" if "truncated" in case else "damaged"]
    assert main(cli + ["--overwrite"]) == 0  # made again, intact
    again = json.loads((folder / "summary.json").read_text())
    assert again["accuracy"] == first["accuracy"] and runstore.integrity_problem(folder / "summary.json", again) is None


@pytest.mark.usefixtures("certified_as_is")
def test_a_run_folder_written_before_digests_is_read_unchecked(tmp_path, reference):
    folder = tmp_path / "run"
    run_experiment(CFG, out=folder)
    summary = json.loads((folder / "summary.json").read_text())
    del summary["integrity"]
    (folder / "summary.json").write_text(json.dumps(summary, indent=2))  # as older code wrote it
    assert run_experiment(CFG, out=folder).summary["accuracy"] == reference.summary["accuracy"]
    assert [e.status for e in scan(tmp_path)] == ["current"]


@pytest.mark.slow  # starts real processes: make test, not make test-fast
def test_kill_9_then_a_flipped_checkpoint_restarts_a_real_process_with_one_line(tmp_path, reference):
    """A real ``python -m ftta_core run`` SIGKILLed after its first checkpoint, whose checkpoint then loses a byte:
    the next command names the file in one line on stderr and makes the run the uninterrupted run makes."""
    folder = tmp_path / "run"
    cmd, env = killed_real_run(folder, "checkpoint.pt")
    if not (folder / "checkpoint.pt").exists():
        pytest.skip("the run finished before it could be killed")
    flip(folder / "checkpoint.pt", len((folder / "checkpoint.pt").read_bytes()) // 2)
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    assert done.returncode == 0
    named = [line for line in done.stderr.replace("\r", "\n").splitlines() if "checkpoint.pt" in line]
    assert len(named) == 1 and "damaged" in named[0] and "step 0" in named[0], done.stderr[-2000:]
    assert_same_run(folder, reference)


@pytest.mark.usefixtures("certified_as_is")
def test_a_grid_remakes_a_damaged_finished_run_left_in_its_resumable_folder(tmp_path, caplog, reference):
    from ftta_core.workbook import resumable_run

    folder = tmp_path / "partial"
    first = resumable_run(CFG, folder)
    flip(folder / "collaboration.npz", -30)
    with caplog.at_level(logging.WARNING, logger="ftta_core"):
        again = resumable_run(CFG, folder)
    (line,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert str(folder / "collaboration.npz") in line and "running it again" in line, line
    assert again.summary["accuracy"] == first.summary["accuracy"] == reference.summary["accuracy"]
    assert_same_run(folder, reference)


# ---------------------------------------------------------------------------------------------------------------
# summary files

def test_summary_files_are_sealed_and_checked_on_read(tmp_path, caplog):
    path = tmp_path / "runs" / "abc.json"
    path.parent.mkdir()
    store_summary(path, {"accuracy": 61.25, "config": {"seed": 0}, "accuracy_by_domain": {"fog": 1 / 3}})
    assert read_summary(path) == {"accuracy": 61.25, "config": {"seed": 0}, "accuracy_by_domain": {"fog": 1 / 3}}
    assert [e.status for e in scan(tmp_path)] == ["unrecorded"]
    path.write_text(path.read_text().replace("61.25", "71.25"))  # a number changed by hand or by a bad sector
    with pytest.raises(DamagedRun) as err:
        read_summary(path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)
    assert [e.status for e in scan(tmp_path)] == ["damaged"]
    legacy = tmp_path / "runs" / "old.json"
    legacy.write_text(json.dumps({"accuracy": 50.0, "config": {"seed": 1}}))  # stored before digests
    assert read_summary(legacy)["accuracy"] == 50.0


# ---------------------------------------------------------------------------------------------------------------
# base data caches

def test_base_data_caches_keep_sidecars_and_are_rebuilt_when_damaged(tmp_path, monkeypatch):
    monkeypatch.setenv("FTTA_CACHE_DIR", str(tmp_path))
    images = np.arange(4 * 8 * 8 * 3, dtype=np.uint8).reshape(4, 8, 8, 3)
    builds = []

    def build():
        builds.append(1)
        return {"images": images.copy(), "labels": np.arange(4, dtype=np.int64)}

    def load():
        return cache.cached_arrays("cifar10/test", {"size": 1}, ("images", "labels"), build)

    first = load()
    (path,) = tmp_path.glob("*.images.npy")
    assert cache.checksum_path(path).is_file() and len(builds) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert np.array_equal(load()["images"], images) and len(builds) == 1  # intact: read back
    np.save(path, np.zeros_like(images))  # zeroed pixels, same shape: only the checksum tells
    with pytest.warns(UserWarning, match=f"{path.name}.*does not match its checksum"):
        again = load()
    assert np.array_equal(again["images"], images) and len(builds) == 2
    path.write_bytes(path.read_bytes()[:100])  # truncated
    with pytest.warns(UserWarning, match="unreadable"):
        assert np.array_equal(load()["images"], images) and len(builds) == 3
    for sidecar in tmp_path.glob("*.sha256.json"):  # as a cache written by older code
        sidecar.unlink()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert np.array_equal(load()["images"], first["images"]) and len(builds) == 3  # adopted, not rebuilt
    assert cache.checksum_path(path).is_file()
    np.save(path, np.zeros_like(images))
    with pytest.warns(UserWarning, match="does not match its checksum"):
        load()  # the adopted sidecar now guards it
    assert len(builds) == 4


def test_a_checkpoint_carries_its_digest_and_a_plain_one_is_still_read(tmp_path):
    state = {"config": {"seed": 0}, "engine": {"w": torch.ones(3)}, "next_step": 5}
    path = tmp_path / "checkpoint.pt"
    path.write_bytes(runstore.checkpoint_bytes(state))
    assert torch.equal(runstore.load_checkpoint(path)["engine"]["w"], torch.ones(3))
    flip(path, len(path.read_bytes()) // 2)
    with pytest.raises(DamagedRun, match="checkpoint.pt is damaged"):
        runstore.load_checkpoint(path)
    torch.save(state, path)  # written before checkpoints carried a digest
    assert runstore.load_checkpoint(path)["next_step"] == 5
