"""Headless notebook execution with papermill, and the smoke switch every notebook reads."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

NOTEBOOK_DIR = Path(__file__).resolve().parent.parent / "notebooks"
SMOKE_ENV = "FTTA_SMOKE"


def smoke_mode(smoke: bool) -> bool:
    """True when the notebook's ``smoke`` parameter is set or ``FTTA_SMOKE=1`` (how CI runs notebooks via nbval)."""
    return bool(smoke) or os.environ.get(SMOKE_ENV, "0") == "1"


def notebook_paths(names: Sequence[str] = ()) -> List[Path]:
    """The notebooks named (by file name or stem), or all numbered notebooks in ``notebooks/``."""
    available = sorted(NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb"))
    if not names:
        return available
    by_key = {**{p.stem: p for p in available}, **{p.name: p for p in available}}
    missing = [n for n in names if n not in by_key]
    if missing:
        raise ValueError(f"unknown notebook(s) {missing}; available: {[p.stem for p in available]}")
    return [by_key[n] for n in names]


def execute_notebooks(names: Sequence[str] = (), smoke: bool = False, parameters: Optional[Dict[str, Any]] = None,
                      out_dir: Optional[Path] = None) -> List[Path]:
    """Execute notebooks with papermill (``smoke`` and ``parameters`` injected); returns the executed paths."""
    import papermill as pm

    done = []
    for path in notebook_paths(names):
        target = path if out_dir is None else Path(out_dir) / path.name
        target.parent.mkdir(parents=True, exist_ok=True)
        pm.execute_notebook(str(path), str(target), parameters={**(parameters or {}), "smoke": smoke},
                            cwd=str(NOTEBOOK_DIR), kernel_name="python3", progress_bar=False)
        done.append(target)
    return done


def text_outputs(path: Path) -> List[str]:
    """The printed text and plain-text results of an executed notebook's cells (figures skipped)."""
    import nbformat

    out = []
    for cell in nbformat.read(str(path), as_version=4).cells:
        for o in cell.get("outputs", []):
            if o.get("output_type") == "stream":
                out.append(o["text"].rstrip())
            elif "data" in o and "text/plain" in o["data"] and not o["data"]["text/plain"].startswith("<Figure"):
                out.append(o["data"]["text/plain"].rstrip())
    return out
