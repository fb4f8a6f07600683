"""Disk full and permission errors while writing a run (issue 53, part two): one line naming the folder, what was
being written and that the run is resumable; no temporary file left behind; the same command resumes to the run an
uninterrupted one makes."""
from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest

import ftta_core.runstore as runstore
from ftta_core.experiment import run_experiment
from ftta_core.runstore import RunLock, RunWriteError, store_summary
from test_runstore import CFG, assert_same_run, reference  # noqa: F401  (a fixture)

pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc to tell files apart")]

# regular-file fsyncs of a run of CFG: per slot the rows, the W part and the checkpoint (2 slots); then W and the
# summary
FSYNCS = {1: "rows", 2: "W part", 3: "checkpoint", 6: "second checkpoint", 7: "collaboration.npz", 8: "summary"}


def failing_fsync(monkeypatch, at: int, code: int, where: Path) -> None:
    """``os.fsync`` that raises ``OSError(code)`` at its ``at``-th call on a file under ``where`` (what a full disk
    or a revoked permission does to a write there: the data cannot be made durable); other fsyncs pass (folders,
    the data caches elsewhere)."""
    real, calls = os.fsync, {"n": 0}

    def fsync(fd: int) -> None:
        if stat.S_ISREG(os.fstat(fd).st_mode) and Path(os.readlink(f"/proc/self/fd/{fd}")).is_relative_to(where):
            calls["n"] += 1
            if calls["n"] == at:
                raise OSError(code, os.strerror(code))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)


SAYS = {errno.ENOSPC: "the disk is full", errno.EACCES: "permission denied"}
CASES = [(at, errno.ENOSPC) for at in sorted(FSYNCS)] + [(3, errno.EACCES), (8, errno.EACCES)]


@pytest.mark.parametrize("at, code", CASES, ids=[f"{FSYNCS[a]}-{errno.errorcode[c]}" for a, c in CASES])
def test_a_failed_write_ends_in_one_line_and_the_run_resumes(tmp_path, monkeypatch, reference, at, code):
    says = SAYS[code]
    folder = tmp_path / "run"
    with monkeypatch.context() as m:
        failing_fsync(m, at, code, folder)
        with pytest.raises(RunWriteError) as err:
            run_experiment(CFG, out=folder)
    line = str(err.value)
    assert "\n" not in line and f"in {folder}:" in line and says in line and "the run is resumable" in line, line
    assert not list(folder.rglob("*.tmp"))  # the temporary file of the failed write is gone
    run_experiment(CFG, out=folder)  # space freed / permission back: the same call resumes
    assert_same_run(folder, reference)


def test_the_command_line_reports_a_full_disk_in_one_line_with_exit_status_2(tmp_path, monkeypatch, capsys):
    from ftta_core.cli import main

    folder = tmp_path / "run"
    cli = ["run", "--dataset", "embedded_digits", "--scenario", "heterogeneity", "--corruptions", "gaussian_noise",
           "--clients", "2", "--batch-size", "8", "--images-per-client", "16", "--local", "bn", "--strategy",
           "fedavg", "--device", "cpu", "--out", str(folder)]
    with monkeypatch.context() as m:
        failing_fsync(m, 1, errno.ENOSPC, folder)
        assert main(cli) == 2
    err = [line for line in capsys.readouterr().err.replace("\r", "\n").splitlines() if line.startswith("error:")]
    assert len(err) == 1 and str(folder) in err[0] and "disk is full" in err[0] and "resumable" in err[0], err
    assert main(cli) == 0


def test_a_lock_file_that_cannot_be_created_names_the_folder(tmp_path, monkeypatch):
    def denied(path, *args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr(runstore, "open", denied, raising=False)
    with pytest.raises(RunWriteError, match=f"cannot write the lock file .lock in {tmp_path / 'run'}: permission "
                                            "denied; the run is resumable"):
        with RunLock(tmp_path / "run"):
            pass


def test_a_summary_file_on_a_full_disk_names_its_folder(tmp_path, monkeypatch):
    failing_fsync(monkeypatch, 1, errno.ENOSPC, tmp_path)
    with pytest.raises(RunWriteError, match=f"cannot write the summary x.json in {tmp_path}: the disk is full"):
        store_summary(tmp_path / "x.json", {"accuracy": 1.0})
    assert not list(tmp_path.iterdir())


@pytest.mark.skipif(os.geteuid() == 0, reason="running as root: file permissions are not enforced, so a read-only "
                                              "folder cannot be made (the permission error is simulated above)")
def test_a_read_only_run_folder_is_refused_in_one_line(tmp_path, reference):
    folder = tmp_path / "run"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        with pytest.raises(RunWriteError, match=f"in {folder}: permission denied; the run is resumable"):
            run_experiment(CFG, out=folder)
    finally:
        folder.chmod(0o755)
    run_experiment(CFG, out=folder)
    assert_same_run(folder, reference)
