"""Progress bars for the long operations (notebook runs, grids of runs, run plans): tqdm, shown when someone watches.

A bar is shown in a Jupyter kernel (tqdm's widget) and when stderr is a terminal; it is quiet in logs and pipes
(stderr not a terminal). ``FTTA_PROGRESS=0`` silences every bar, ``FTTA_PROGRESS=1`` shows them even in a log.
``python -m ftta_core notebooks`` runs the notebooks' kernels with ``FTTA_PROGRESS=0`` (unless set): papermill's
bar over cells is shown on the runner's stderr instead, and the executed notebooks hold no bar widgets.

Progress lines (``progress_line``, ``progress_task``) say which stage a long operation is in: a run starting, data
decoded or corrupted on first use (then cached), a figure written. A kernel's stderr is not the terminal, so the
runner gives its kernels ``$FTTA_PROGRESS_FILE`` (a file of lines) and relays what they append to its own stderr
(``relay_progress``, above papermill's bar): the lines reach the terminal and never the executed notebook. Outside a
runner they go to stderr when a bar would be shown (terminal, ``FTTA_PROGRESS=1``), except in a kernel, where the
bars show instead.
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional, Set

PROGRESS_ENV = "FTTA_PROGRESS"
PROGRESS_FILE_ENV = "FTTA_PROGRESS_FILE"  # set by the notebook runner for its kernels: where their lines go
LINE_INTERVAL_S = 10.0  # a counted task's progress line at most this often
_SHOWN: Set[str] = set()  # the lines shown ``once`` in this process


def in_kernel() -> bool:
    """True inside a Jupyter (IPython) kernel."""
    ip = sys.modules.get("IPython")
    shell = ip.get_ipython() if ip is not None and hasattr(ip, "get_ipython") else None
    return shell is not None and getattr(shell, "kernel", None) is not None


def progress_wanted(requested: Optional[bool] = True) -> bool:
    """Whether to show a bar: never when ``requested`` is False or ``$FTTA_PROGRESS`` is 0; always when it is 1;
    otherwise in a Jupyter kernel or when stderr is a terminal."""
    env = os.environ.get(PROGRESS_ENV, "").strip()
    if requested is False or env == "0":
        return False
    if env == "1":
        return True
    return in_kernel() or bool(getattr(sys.stderr, "isatty", lambda: False)())


def progress_bar(iterable: Optional[Iterable] = None, total: Optional[int] = None, desc: str = "",
                 unit: str = "run", requested: Optional[bool] = True, **kwargs: Any) -> Any:
    """A ``tqdm.auto`` bar over ``iterable`` (or counting to ``total`` with ``update``), disabled when
    ``progress_wanted(requested)`` says so (a disabled bar still iterates and counts)."""
    from tqdm.auto import tqdm

    return tqdm(iterable, total=total, desc=desc, unit=unit, disable=not progress_wanted(requested), **kwargs)


def papermill_progress(desc: str, requested: Optional[bool] = True) -> Any:
    """papermill's ``progress_bar`` option: tqdm arguments of its bar over a notebook's cells (on stderr), or False
    when no bar is wanted."""
    return {"desc": desc, "unit": "cell"} if progress_wanted(requested) else False


def progress_file() -> Optional[Path]:
    """The file of progress lines ``$FTTA_PROGRESS_FILE`` names (the notebook runner sets it for its kernels)."""
    name = os.environ.get(PROGRESS_FILE_ENV, "").strip()
    return Path(name) if name else None


def lines_wanted(requested: Optional[bool] = True) -> bool:
    """Whether progress lines are shown: always into ``$FTTA_PROGRESS_FILE`` when it is set (the runner asked for
    them; ``requested`` only keeps bars out of a notebook); otherwise on stderr when ``progress_wanted(requested)``,
    except in a kernel (its bars show there)."""
    return progress_file() is not None or (progress_wanted(requested) and not in_kernel())


def progress_line(text: str, requested: Optional[bool] = True, once: bool = False) -> None:
    """Show one progress line (``lines_wanted``): appended to ``$FTTA_PROGRESS_FILE``, else written to stderr above
    any tqdm bar. ``once``: only the first time this process shows ``text``."""
    if not lines_wanted(requested) or (once and text in _SHOWN):
        return
    if once:
        _SHOWN.add(text)
    line = " ".join(text.split("\n")) + "\n"
    path = progress_file()
    if path is None:
        from tqdm import tqdm

        tqdm.write(line, file=sys.stderr, end="")
        return
    with contextlib.suppress(OSError), open(path, "a", encoding="utf-8") as fh:  # one write: lines never interleave
        fh.write(line)


class _Lines:
    """A task shown as progress lines: its start, its count at most every ``LINE_INTERVAL_S``, its end and time."""

    def __init__(self, desc: str, total: Optional[int], unit: str, requested: Optional[bool]) -> None:
        self.desc, self.total, self.unit, self.requested = desc, total, unit, requested
        self.n = 0
        self.started = self.shown = time.monotonic()
        what = f": {total:,} {unit}s" if total is not None else ""
        progress_line(f"{desc}{what} ...", requested)

    def update(self, n: int = 1) -> None:
        """Count ``n`` more; a line when ``LINE_INTERVAL_S`` passed since the last."""
        self.n += n
        now = time.monotonic()
        if now - self.shown >= LINE_INTERVAL_S:
            self.shown = now
            of = f" of {self.total:,}" if self.total is not None else ""
            progress_line(f"{self.desc}: {self.n:,}{of} {self.unit}s, {now - self.started:.0f} s", self.requested)

    def close(self, failed: bool = False) -> None:
        """The closing line: done (or stopped) after how many seconds."""
        how = "stopped" if failed else "done"
        progress_line(f"{self.desc}: {how} in {time.monotonic() - self.started:.1f} s", self.requested)

    def __enter__(self) -> "_Lines":
        return self

    def __exit__(self, kind: Any, *rest: Any) -> None:
        self.close(failed=kind is not None)


def progress_task(desc: str, total: Optional[int] = None, unit: str = "item",
                  requested: Optional[bool] = True) -> Any:
    """A context manager counting a long task (``update(n)``): a tqdm bar where bars are shown and the task has a
    ``total`` (terminal, kernel), else progress lines (``lines_wanted``: start, count every ``LINE_INTERVAL_S``,
    end with its time); a quiet counter when neither is wanted."""
    if progress_file() is None and progress_wanted(requested) and (total is not None or in_kernel()):
        return progress_bar(total=total, desc=desc, unit=unit, requested=requested)
    if lines_wanted(requested):
        return _Lines(desc, total, unit, requested)
    return progress_bar(total=total, desc=desc, unit=unit, requested=False)


@contextlib.contextmanager
def relay_progress(path: Optional[Path], interval_s: float = 0.25) -> Iterator[None]:
    """While the block runs, show on stderr (above tqdm's bars) each line another process appends to ``path`` (a
    notebook's kernel, through ``$FTTA_PROGRESS_FILE``), and the last ones when it ends; ``path`` None: nothing."""
    if path is None:
        yield
        return
    from tqdm import tqdm

    Path(path).touch()
    stop = threading.Event()
    position, pending = 0, b""

    def show_new() -> None:
        nonlocal position, pending
        with contextlib.suppress(OSError), open(path, "rb") as fh:
            fh.seek(position)
            chunk = fh.read()
            position += len(chunk)
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                tqdm.write(line.decode("utf-8", "replace"), file=sys.stderr)

    def follow() -> None:
        while not stop.wait(interval_s):
            show_new()

    thread = threading.Thread(target=follow, name="ftta-progress-relay", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        show_new()


__all__ = ["PROGRESS_ENV", "PROGRESS_FILE_ENV", "in_kernel", "progress_wanted", "progress_bar", "papermill_progress",
           "progress_file", "lines_wanted", "progress_line", "progress_task", "relay_progress"]
