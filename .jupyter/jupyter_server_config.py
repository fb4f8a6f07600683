"""The Jupyter server of `make lab` (the Makefile passes this file with ``--config``; ``tests/test_lab.py`` and
``tests/test_lab_roundtrip.py`` start it the same way).

* Contents: jupytext's contents manager pairs ``notebooks/NN_name.ipynb`` (the committed execution) with
  ``NN_name.py`` (its source, py:percent): a notebook opens with the source's cells and the execution's outputs, and
  saving writes both. The execution holds one cell its source cannot: papermill's ``injected-parameters`` cell (what
  ``python -m ftta_core notebooks --in-place`` passed). Jupytext builds the opened notebook from the ``.py``'s cells
  and so drops it; ``ExecutionRecordContentsManager`` puts it back where the ``.ipynb`` has it, so opening and saving
  a notebook without editing it rewrites no byte. The cells' papermill metadata survives through each notebook's
  ``cell_metadata_filter`` (``-papermill``: never written to the ``.py``, restored from the ``.ipynb``), the rest of
  jupytext's settings are in ``jupytext.toml``.
* Listing: the ``.py`` sources of the notebooks are hidden in the file browser (``hide_globs``, matched on file
  names: ``NN_*.py``, a name only the notebooks' sources have here); JupyterLab still reads and writes them through
  the pairing, and any editor opens them.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional

from jupyter_server.services.contents.largefilemanager import AsyncLargeFileManager
from jupytext.async_contentsmanager import build_async_jupytext_contents_manager_class
from jupytext.jupytext import drop_text_representation_metadata

INJECTED_TAG = "injected-parameters"  # papermill's tag on the cell it inserts after the `parameters` cell
SOURCE_GLOB = "[0-9][0-9]_*.py"  # the notebooks' paired sources, notebooks/NN_name.py


def _tags(cell: Dict[str, Any]) -> List[str]:
    return list(cell.get("metadata", {}).get("tags", []))


def _paired(notebook: Dict[str, Any]) -> bool:
    """Whether jupytext pairs the notebook with another file (``formats: ipynb,py:percent``)."""
    return "," in str(notebook.get("metadata", {}).get("jupytext", {}).get("formats", ""))


def restore_injected_cells(opened: Dict[str, Any], stored: Dict[str, Any]) -> Dict[str, Any]:
    """``opened`` (the notebook as jupytext combined it) with the ``injected-parameters`` cells of ``stored`` (the
    ``.ipynb`` on disk) it lacks, each inserted after the cell that precedes it in ``stored`` (matched by cell id;
    a cell whose predecessor is gone, e.g. after an edit of the source, is left out)."""
    cells = list(opened["cells"])
    have = {c.get("id") for c in cells}
    for k, cell in enumerate(stored["cells"]):
        if INJECTED_TAG not in _tags(cell) or cell.get("id") in have or k == 0:
            continue
        before = stored["cells"][k - 1].get("id")
        at = next((i for i, c in enumerate(cells) if c.get("id") == before), None)
        if at is not None:
            cells.insert(at + 1, cell)
            have.add(cell.get("id"))
    opened["cells"] = cells
    return opened


JupytextContentsManager = build_async_jupytext_contents_manager_class(AsyncLargeFileManager)


class ExecutionRecordContentsManager(JupytextContentsManager):
    """Jupytext's contents manager that keeps a paired ``.ipynb``'s ``injected-parameters`` cells: shown when it is
    opened, written back to the ``.ipynb`` (never to the ``.py``) when it is saved."""

    async def get(self, path: str, content: bool = True, type: Optional[str] = None, format: Optional[str] = None,
                  **kwargs: Any) -> Dict[str, Any]:
        model = await super().get(path, content=content, type=type, format=format, **kwargs)
        if not (content and model["type"] == "notebook" and path.endswith(".ipynb") and _paired(model["content"])):
            return model  # not a paired notebook's content: jupytext read one file
        stored = await self.super.get(path, content=True, type="notebook")  # the .ipynb alone, without pairing
        model["content"] = restore_injected_cells(model["content"], stored["content"])
        return model

    async def save(self, model: Dict[str, Any], path: str = "") -> Dict[str, Any]:
        notebook = model.get("content") if model.get("type") == "notebook" else None
        cells = notebook.get("cells", []) if notebook and path.endswith(".ipynb") and _paired(notebook) else []
        if not any(INJECTED_TAG in _tags(c) for c in cells):
            return await super().save(model, path)
        source = {**model, "content": {**model["content"], "cells": [c for c in cells if INJECTED_TAG not in _tags(c)]}}
        saved = await super().save(source, path)  # the pair: the .py, and the .ipynb without those cells
        await self.super.save({"type": "notebook", "content": drop_text_representation_metadata(model["content"])},
                              path)  # the .ipynb with them, as jupytext writes a paired .ipynb
        return saved


c = get_config()  # noqa: F821  (provided by traitlets when it loads this file)
c.ServerApp.contents_manager_class = ExecutionRecordContentsManager
c.ContentsManager.hide_globs.append(SOURCE_GLOB)  # beside jupyter_server's own (__pycache__, *.pyc, ...)
