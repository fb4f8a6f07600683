"""Progress bars for the long operations (notebook runs, grids of runs, run plans): tqdm, shown when someone watches.

A bar is shown in a Jupyter kernel (tqdm's widget) and when stderr is a terminal; it is quiet in logs and pipes
(stderr not a terminal). ``FTTA_PROGRESS=0`` silences every bar, ``FTTA_PROGRESS=1`` shows them even in a log.
``python -m ftta_core notebooks`` runs the notebooks' kernels with ``FTTA_PROGRESS=0`` (unless set): papermill's
bar over cells is shown on the runner's stderr instead, and the executed notebooks hold no bar widgets.
"""
from __future__ import annotations

import os
import sys
from typing import Any, Iterable, Optional

PROGRESS_ENV = "FTTA_PROGRESS"


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


__all__ = ["PROGRESS_ENV", "in_kernel", "progress_wanted", "progress_bar", "papermill_progress"]
