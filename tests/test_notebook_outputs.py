"""No warnings in the committed notebooks' outputs, and the stale-run warning a notebook can show agrees with
``python -m ftta_core runs``.

A committed notebook (``notebooks/*.ipynb``, as ``python -m ftta_core notebooks --in-place`` executed it) fails when
one of its outputs holds a warning: a stderr stream naming one (``FutureWarning``, ``Pandas4Warning``,
``UserWarning``, ``RuntimeWarning``, ...), any output text with ``Warning:``, or the run store's stale-run warning
(``runstore.STALE_RUN_WARNING``). The failure lists the notebook, the cell index and the line; the fix is in the code
that warned, then the notebook is executed again. The stale-run warning itself is logged exactly for the stored runs
that ``runs`` reports stale (both read ``runstore.stale_modules``).
"""
from __future__ import annotations

import json
import logging
import re
import warnings
from pathlib import Path
from typing import Iterator, List, Tuple

import nbformat
import numpy as np
import pandas as pd
import pytest

from ftta_core import runstore
from studies.fedicon.report import beside_paper
from ftta_core.runstore import STALE_RUN_WARNING, read_summary, scan_table, store_summary, without_integrity
from ftta_core.tables import blank_missing

REPO = Path(__file__).resolve().parent.parent
COMMITTED = sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))
STORE = REPO / "figures" / "your_method" / "runs"  # notebook 60's stored runs (the warnings the issue saw)
# the stale-run warning's fixed text between its path and what changed
STALE_PHRASE = STALE_RUN_WARNING.split("%s")[1].rstrip("(").strip()
STDERR_WARNING = re.compile(r"warning", re.IGNORECASE)


def output_texts(output: dict) -> Iterator[Tuple[bool, str]]:
    """(is stderr, text) of each text an output carries: a stream's text, or a display's text/* data."""
    if output.get("output_type") == "stream":
        yield output.get("name") == "stderr", output.get("text", "")
    for mime, value in (output.get("data") or {}).items():
        if mime.startswith("text/") and isinstance(value, str):
            yield False, value


def warning_lines(path: Path) -> List[str]:
    """``cell N: line`` for each output line of the notebook at ``path`` that holds a warning."""
    found = []
    for index, cell in enumerate(nbformat.read(str(path), as_version=4).cells):
        for output in cell.get("outputs", []):
            for stderr, text in output_texts(output):
                found += [f"cell {index}: {line.strip()}" for line in text.splitlines()
                          if (stderr and STDERR_WARNING.search(line)) or "Warning:" in line or STALE_PHRASE in line]
    return found


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: p.stem)
def test_committed_outputs_hold_no_warning(path):
    found = warning_lines(path)
    assert not found, (f"{path.name} shows {len(found)} warning line(s); fix what warns, then re-execute it "
                       f"(python -m ftta_core notebooks {path.stem} --in-place):\n" + "\n".join(found))


def test_the_check_finds_each_kind_of_warning(tmp_path):
    nb = nbformat.v4.new_notebook()
    stale = STALE_RUN_WARNING % ("../figures/x/runs/a.json", "engine.bank", runstore.RERUN_STALE_ENV)
    nb.cells = [nbformat.v4.new_code_cell("x", outputs=[
        nbformat.v4.new_output("stream", name="stderr", text="/tmp/cell.py:3: Pandas4Warning: fill value\n  x\n"),
        nbformat.v4.new_output("stream", name="stderr", text=stale + "\n")]),
        nbformat.v4.new_code_cell("y", outputs=[nbformat.v4.new_output("stream", name="stdout", text="fine\n")]),
        nbformat.v4.new_code_cell("z", outputs=[nbformat.v4.new_output(
            "display_data", data={"text/plain": "UserWarning: shown", "text/html": "<p>no warnings here</p>"})])]
    path = tmp_path / "nb.ipynb"
    nbformat.write(nb, str(path))
    assert warning_lines(path) == ["cell 0: /tmp/cell.py:3: Pandas4Warning: fill value", f"cell 0: {stale}",
                                   "cell 2: UserWarning: shown"]


def _warned(path: Path, caplog) -> bool:
    """Whether reading the stored run at ``path`` logs the stale-run warning."""
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=runstore.log.name):
        read_summary(path)
    return any(STALE_PHRASE in r.getMessage() for r in caplog.records)


def test_a_stale_run_warning_is_logged_exactly_for_the_runs_runs_calls_stale(tmp_path, caplog):
    """Notebook 60's stored runs as committed, and one of them with a unit recorded at a former version (stale):
    ``read_summary`` warns about a run exactly when ``runs`` (``scan_table``) reports it stale."""
    source = sorted(STORE.glob("*.json"))[0]
    summary = without_integrity(json.loads(source.read_text()))
    unit = sorted(summary["code"]["units"])[0]
    summary["code"]["units"][unit] -= 1
    store_summary(tmp_path / "stale" / source.name, summary)
    for folder in (STORE, tmp_path / "stale"):
        table = scan_table([folder])
        seen = {Path(p): status for p, status in zip(table.path, table.status)}
        assert seen and {p: _warned(p, caplog) for p in seen} == {p: s == "stale" for p, s in seen.items()}
    assert seen == {tmp_path / "stale" / source.name: "stale"}


def test_missing_cells_are_blanked_as_fillna_did_without_a_pandas_warning():
    """Notebook 40's two ``Pandas4Warning``s came from ``fillna("")`` on float columns (deprecated in pandas 3, an
    error in pandas 4); ``tables.blank_missing`` gives the same table without it, and so does ``beside_paper``."""
    table = pd.DataFrame({"ours": [61.5, np.nan], "paper": [60.0, 59.5], "note": ["x", None], "seeds": [3, 3]},
                         index=["FedICON", "Tent"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = table.fillna("")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert blank_missing(table).equals(expected)
        beside = beside_paper(table[["note"]], table[["ours"]].iloc[:1], "paper")
    assert beside["paper ours"].tolist() == [61.5, ""]
