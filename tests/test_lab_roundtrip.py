"""A reader's JupyterLab leaves the repository as it was, and shows what the notebooks mean.

* Opening and saving a committed notebook without editing it rewrites no byte of the ``.ipynb`` or of its paired
  ``.py``: tested through the contents API of a JupyterLab started as `make lab` starts it (``test_lab.lab_server``:
  the Makefile's LAB_FLAGS with their config file, jupytext's pairing, ``jupytext.toml``), on a copy of the notebooks
  whose ``.ipynb`` files are newer than their ``.py`` (as after ``python -m ftta_core notebooks --in-place``). Each
  notebook is read (GET with content) and written back (PUT: type notebook, format json, the model's content), as
  JupyterLab's save does; the kernel JupyterLab starts for a notebook is the one it names, under the name the notebook
  records (JupyterLab writes the kernel's display name into the notebook when it connects).
* Figures from an interactive kernel (or plain papermill) go to ``runs/notebooks/<notebook>/figures/``; only an
  ``--in-place`` run writes the committed ``figures/`` (``ftta_core.notebooks.output_folder``).
* The best cells of a table stay bold in an untrusted notebook (JupyterLab's HTML sanitizer, its default rules
  written out below) and are marked ``*`` in the plain-text form a terminal shows.
"""
from __future__ import annotations

import dataclasses
import difflib
import html
import os
import re
import shutil
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Set, Tuple

import nbformat
import numpy as np
import pandas as pd
import pytest

import ftta_core.notebooks as nbrun
from ftta_core import project, tables
from test_lab import LabServer, lab_server
from test_notebook_sources import _cells as source_cells

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = REPO / "notebooks"
COMMITTED = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
CONFIG_FILES = ("jupytext.toml", ".jupyter")  # what `make lab` reads beside the notebooks (LAB_FLAGS' --config)
DIFF_LINES = 40


@dataclass
class Checkout:
    """A copy of the notebooks and of the Jupyter configuration, served by a JupyterLab started as `make lab`."""

    root: Path
    lab: LabServer

    def files(self) -> Dict[str, bytes]:
        """The bytes of every file in the copy's ``notebooks/``."""
        return {p.name: p.read_bytes() for p in sorted((self.root / "notebooks").iterdir()) if p.is_file()}


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Iterator[Checkout]:
    pytest.importorskip("jupyterlab", reason="jupyterlab is not installed (`make lab` or pip install -e '.[lab]')")
    root = tmp_path_factory.mktemp("repository")
    (root / "notebooks").mkdir()
    for notebook in COMMITTED:
        for path in (nbrun.source_path(notebook), notebook):  # the .py first, then its execution (newer, as in-place)
            if path.exists():
                shutil.copyfile(path, root / "notebooks" / path.name)
        source = root / "notebooks" / nbrun.source_path(notebook).name
        if source.exists():
            stamp = source.stat().st_mtime + 60
            os.utime(root / "notebooks" / notebook.name, (stamp, stamp))
    for name in CONFIG_FILES:
        (shutil.copytree if (REPO / name).is_dir() else shutil.copyfile)(REPO / name, root / name)
    with lab_server(root, tmp_path_factory.mktemp("jupyter")) as lab:
        yield Checkout(root, lab)


def cell_summary(raw: bytes) -> str:
    """'N cells (k injected-parameters)' of a notebook's bytes."""
    cells = nbformat.reads(raw.decode(), as_version=4).cells
    injected = sum("injected-parameters" in c.metadata.get("tags", []) for c in cells)
    return f"{len(cells)} cells ({injected} injected-parameters)"


def changes(before: Dict[str, bytes], after: Dict[str, bytes]) -> str:
    """A unified diff (at most ``DIFF_LINES`` lines per file) of the files that differ, a notebook's cell count
    first; '' when none differs."""
    out = []
    for name in sorted(set(before) | set(after)):
        if before.get(name) != after.get(name):
            old, new = (d.get(name, b"").decode(errors="replace").splitlines() for d in (before, after))
            diff = list(difflib.unified_diff(old, new, f"committed/{name}", f"saved/{name}", lineterm="", n=1))
            counts = (f" {cell_summary(before[name])} -> {cell_summary(after[name])}"
                      if name.endswith(".ipynb") and name in before and name in after else "")
            out += [f"{name} changed:{counts}", *diff[:DIFF_LINES], *(["..."] if len(diff) > DIFF_LINES else [])]
    return "\n".join(out)


def save_unchanged(lab: LabServer, path: str, kernelspec: Optional[Dict[str, str]] = None) -> None:
    """Open the notebook at ``path`` and save it as JupyterLab does (``kernelspec``: what the connected kernel wrote
    into its metadata first)."""
    model = lab.request("GET", f"/api/contents/{path}?content=1&type=notebook")
    if kernelspec is not None:
        model["content"]["metadata"]["kernelspec"] = kernelspec
    lab.request("PUT", f"/api/contents/{path}", {"type": "notebook", "format": "json", "content": model["content"]})


@pytest.mark.slow
@pytest.mark.parametrize("name", [p.name for p in COMMITTED])
def test_saving_an_unedited_notebook_rewrites_no_byte(checkout, name):
    before = checkout.files()
    save_unchanged(checkout.lab, f"notebooks/{name}")
    diff = changes(before, checkout.files())
    if diff:
        committed = NOTEBOOKS / name
        stale = ("" if source_cells(nbformat.read(str(committed), as_version=4)) ==
                 source_cells(nbrun.read_source(committed)) else
                 f" ({committed.stem}.py was edited after its execution, and JupyterLab opens the .py's cells: "
                 f"python -m ftta_core notebooks {committed.stem} --in-place)")
        pytest.fail(f"opening and saving {name} in JupyterLab rewrote tracked files{stale}:\n{diff}", pytrace=False)


@pytest.mark.slow
def test_an_edit_in_lab_reaches_the_source_and_keeps_the_execution_record(checkout):
    """Saving an edited notebook writes the edit to its ``.py`` (jupytext's pairing) and keeps papermill's
    injected-parameters cell in the ``.ipynb`` only."""
    import jupytext

    path, before = "notebooks/00_quickstart.ipynb", checkout.files()
    model = checkout.lab.request("GET", f"/api/contents/{path}?content=1&type=notebook")
    cells = model["content"]["cells"]
    assert sum("injected-parameters" in c["metadata"].get("tags", []) for c in cells) == 1
    markdown = next(c for c in cells if c["cell_type"] == "markdown")
    markdown["source"] += "\n\nAn edit made in JupyterLab."
    try:
        checkout.lab.request("PUT", f"/api/contents/{path}", {"type": "notebook", "format": "json",
                                                              "content": model["content"]})
        source = jupytext.read(checkout.root / "notebooks" / "00_quickstart.py")
        saved = nbformat.read(str(checkout.root / path), as_version=4)
        assert any("An edit made in JupyterLab." in c.source for c in source.cells)
        assert not any("injected-parameters" in c.metadata.get("tags", []) for c in source.cells)
        assert source_cells(saved) == source_cells(source)
        assert [c.metadata.get("tags") for c in saved.cells].count(["injected-parameters"]) == 1
    finally:
        for name, raw in before.items():
            (checkout.root / "notebooks" / name).write_bytes(raw)


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: p.stem)
def test_the_runner_writes_the_metadata_jupyterlab_keeps(path, tmp_path):
    """What ``python -m ftta_core notebooks`` executes carries the committed notebook's metadata (kernel, jupytext
    pairing and filters, no ``text_representation``), so a re-executed notebook still saves unchanged from JupyterLab;
    papermill adds only its own record and the kernel's ``language_info``."""
    staged = nbformat.read(str(nbrun.input_notebook(path, tmp_path)), as_version=4).metadata
    committed = nbformat.read(str(path), as_version=4).metadata
    assert staged == {k: v for k, v in committed.items() if k not in ("papermill", "language_info")}


def kernel_cwds(server_pid: int) -> List[Path]:
    """The working folders of the ipykernel processes the server started (Linux /proc; [] elsewhere)."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if ppid == server_pid and b"ipykernel" in (entry / "cmdline").read_bytes():
                found.append(Path(os.readlink(entry / "cwd")))
        except (OSError, IndexError, ValueError):
            continue
    return found


@pytest.mark.slow
def test_the_kernel_lab_starts_is_the_one_the_notebook_names(checkout):
    import jupytext

    path = "notebooks/00_quickstart.ipynb"
    lab = checkout.lab
    named = lab.request("GET", f"/api/contents/{path}?content=1")["content"]["metadata"]["kernelspec"]
    session = lab.request("POST", "/api/sessions", {"path": path, "name": Path(path).name, "type": "notebook",
                                                    "kernel": {"name": named["name"]}})
    try:
        assert session["kernel"]["name"] == named["name"] == "python3"
        spec = lab.request("GET", "/api/kernelspecs")["kernelspecs"][session["kernel"]["name"]]["spec"]
        # what JupyterLab writes into the notebook's metadata once the kernel is connected
        connected = {"display_name": spec["display_name"], "language": spec["language"], "name": named["name"]}
        assert named == connected, f"the notebook names {named}; JupyterLab will write {connected}"
        source = jupytext.read(checkout.root / "notebooks" / "00_quickstart.py")
        assert dict(source.metadata["kernelspec"]) == connected, "00_quickstart.py names another kernel"
        if Path("/proc/self/cwd").exists():  # the kernel runs in notebooks/, as under papermill
            assert (checkout.root / "notebooks").resolve() in kernel_cwds(lab.proc.pid)
        before = checkout.files()
        save_unchanged(lab, path, kernelspec=connected)
        diff = changes(before, checkout.files())
        if diff:
            pytest.fail(f"saving {path} once its kernel is connected rewrote tracked files:\n{diff}", pytrace=False)
    finally:
        lab.request("DELETE", f"/api/sessions/{session['id']}")


# ------------------------------------------------------------------------------------- figures of interactive kernels
@pytest.fixture
def in_notebooks(monkeypatch, tmp_path, use_project) -> Path:
    """A kernel's view: the working folder is notebooks/, run folders under a temporary runs/notebooks."""
    monkeypatch.chdir(NOTEBOOKS)
    use_project(dataclasses.replace(project.layout(), scratch=tmp_path / "runs"))
    monkeypatch.delenv(nbrun.IN_PLACE_ENV, raising=False)
    return tmp_path / "runs" / "notebooks"


def test_an_interactive_kernel_writes_figures_to_the_run_folder(in_notebooks, monkeypatch, tmp_path):
    assert nbrun.output_folder("../figures/fedtsa_table1", "10_fedtsa") == in_notebooks / "10_fedtsa" / "figures" / \
        "fedtsa_table1"
    assert nbrun.output_folder("../figures", "00_quickstart") == in_notebooks / "00_quickstart" / "figures"
    assert nbrun.output_folder(tmp_path / "mine", "10_fedtsa") == tmp_path / "mine"  # a folder outside figures/
    # FedICON's stored runs stay the committed ones (linked, as the runner links them): nothing is recomputed
    out = nbrun.output_folder("../figures/fedicon/", "40_fedicon", "results_dir")
    assert (out / "cache").resolve() == (REPO / "figures" / "fedicon" / "cache").resolve()
    assert not (in_notebooks / "10_fedtsa" / "figures" / "fedtsa_table1").exists()  # created by the notebook
    monkeypatch.setenv(nbrun.IN_PLACE_ENV, "1")  # a kernel of `python -m ftta_core notebooks --in-place`
    assert nbrun.output_folder("../figures/fedtsa_table1", "10_fedtsa") == Path("../figures/fedtsa_table1")


def test_only_in_place_runs_tell_their_kernels_to_write_figures(monkeypatch, tmp_path, use_project):
    import papermill

    (tmp_path / "notebooks").mkdir()
    for path in (NOTEBOOKS / "00_quickstart.ipynb", NOTEBOOKS / "00_quickstart.py"):
        shutil.copyfile(path, tmp_path / "notebooks" / path.name)
    use_project(tmp_path)  # notebooks/ and runs/notebooks under tmp_path
    monkeypatch.delenv(nbrun.SMOKE_ENV, raising=False)
    monkeypatch.setenv(nbrun.IN_PLACE_ENV, "1")  # set in the shell: never passed on by a run that is not in place
    seen = []

    def execute(input_path, output_path, **kwargs):
        seen.append(os.environ.get(nbrun.IN_PLACE_ENV))
        nbformat.write(nbformat.read(input_path, as_version=4), output_path)

    monkeypatch.setattr(papermill, "execute_notebook", execute)
    nbrun.execute_notebooks(["00_quickstart"], out_dir=tmp_path / "out", progress=False)
    nbrun.execute_notebooks(["00_quickstart"], in_place=True, progress=False)
    assert seen == [None, "1"]


def assignment_pattern(parameter: str, stem: str) -> str:
    """The line through which a notebook sends its output parameter to ``output_folder``."""
    extra = "" if parameter == "figure_dir" else rf',\s*"{parameter}"'
    return rf'{parameter}\s*=.*output_folder\({parameter},\s*"{stem}"{extra}\)'


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: p.stem)
def test_notebooks_pass_their_figure_folders_through_output_folder(path):
    """Every output parameter the runner redirects (a default under ../figures) goes through ``output_folder`` in the
    notebook's source, and the path printed for a figure is relative to the repository."""
    source = nbrun.source_path(path).read_text()
    for parameter in nbrun.redirected_outputs(path, Path("unused")):
        assert re.search(assignment_pattern(parameter, path.stem), source), (
            f"{path.stem}.py writes {parameter} under ../figures without output_folder: an interactive run would "
            "write over the committed figures")
    assert "relative to notebooks/" not in source


# ------------------------------------------------------------------------------- tables in an untrusted notebook
# JupyterLab's default HTML sanitizer, applied to the HTML outputs of an untrusted notebook (one the reader has not
# executed: every notebook freshly opened from a clone): packages/apputils/src/sanitizer.ts, class Sanitizer, option
# allowedTags / allowedAttributes / allowedStyles (JupyterLab 4; checked against the installed bundle below).
LAB_ALLOWED_TAGS = frozenset(
    "a abbr acronym address area article aside audio b bdi bdo big blockquote br button canvas caption center cite "
    "code col colgroup colspan command data datalist dd del details dfn dir div dl dt em fieldset figcaption figure "
    "font footer form h1 h2 h3 h4 h5 h6 header hgroup hr i img input ins kbd label legend li map mark menu meter nav "
    "nobr ol optgroup option output p pre progress q rowspan s samp section select small source span strike strong "
    "sub summary sup table tbody td textarea tfoot th thead time tr track tt u ul var video wbr".split())
LAB_ATTRIBUTES = {  # '*': on every tag; then the table tags' own (the other tags' own are not needed here)
    "*": frozenset("class data-jupyter-id dir draggable hidden id inert itemprop itemref itemscope lang spellcheck "
                   "style title translate".split()),
    "caption": frozenset({"align"}),
    "table": frozenset("align bgcolor border cellpadding cellspacing frame rules summary width".split()),
    "thead": frozenset("align char charoff valign".split()),
    "tbody": frozenset("align char charoff valign".split()),
    "tr": frozenset("align bgcolor char charoff valign".split()),
    "td": frozenset("abbr align axis bgcolor char charoff colspan headers height nowrap rowspan scope valign "
                    "width".split()),
    "th": frozenset("abbr align axis bgcolor char charoff colspan headers height nowrap rowspan scope valign "
                    "width".split()),
}
# allowedStyles: a value pattern per CSS property (CssProp); the two a table uses, the others dropped (stricter)
LAB_STYLES = {"font-weight": re.compile(r"^(normal|bold|bolder|lighter|[1-9]00)$", re.IGNORECASE),
              "text-align": re.compile(r"^(left|right|center|justify)$", re.IGNORECASE)}
# sanitize-html drops these disallowed tags with their content (its nonTextTags); other disallowed tags lose the tag
NON_TEXT_TAGS = frozenset({"script", "style", "textarea", "option", "noscript"})
BOLD_TAGS = frozenset({"b", "strong"})


def kept_style(value: str) -> str:
    """The declarations of a ``style`` attribute the sanitizer keeps."""
    kept = []
    for declaration in value.split(";"):
        name, _, val = (part.strip() for part in declaration.partition(":"))
        if name.lower() in LAB_STYLES and LAB_STYLES[name.lower()].match(val):
            kept.append(f"{name}: {val}")
    return "; ".join(kept)


class LabSanitizer(HTMLParser):
    """HTML as JupyterLab shows it in an untrusted notebook (the allowlists above)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=False)
        self.out: List[str] = []
        self.dropped = 0  # depth inside a tag dropped with its content

    def handle_starttag(self, tag: str, attrs: List[Tuple[str, str]]) -> None:
        if tag in NON_TEXT_TAGS:
            self.dropped += 1
        if self.dropped or tag not in LAB_ALLOWED_TAGS:
            return
        allowed = LAB_ATTRIBUTES["*"] | LAB_ATTRIBUTES.get(tag, frozenset())
        kept = [(k, kept_style(v or "") if k == "style" else (v or "")) for k, v in attrs if k in allowed]
        self.out.append(f"<{tag}" + "".join(f' {k}="{html.escape(v)}"' for k, v in kept if v or k != "style") + ">")

    def handle_endtag(self, tag: str) -> None:
        if tag in NON_TEXT_TAGS:
            self.dropped = max(0, self.dropped - 1)
        elif not self.dropped and tag in LAB_ALLOWED_TAGS:
            self.out.append(f"</{tag}>")

    def handle_data(self, data: str) -> None:
        if not self.dropped:
            self.out.append(data)

    def handle_entityref(self, name: str) -> None:
        self.handle_data(f"&{name};")

    def handle_charref(self, name: str) -> None:
        self.handle_data(f"&#{name};")


def sanitized(markup: str) -> str:
    parser = LabSanitizer()
    parser.feed(markup)
    parser.close()
    return "".join(parser.out)


class BoldCells(HTMLParser):
    """The (row, column) of the data cells (``<td id="..._rowR_colC">``) whose text renders bold."""

    def __init__(self) -> None:
        super().__init__()
        self.cell = None
        self.stack: List[bool] = []  # per open tag: whether it makes its content bold
        self.bold: Set[Tuple[int, int]] = set()

    def handle_starttag(self, tag: str, attrs: List[Tuple[str, str]]) -> None:
        attrs_ = dict(attrs)
        weight = re.search(r"font-weight:\s*(bold|bolder|[6-9]00)", attrs_.get("style") or "")
        self.stack.append(tag in BOLD_TAGS or bool(weight))
        found = re.search(r"row(\d+)_col(\d+)$", attrs_.get("id") or "")
        if tag == "td" and found:
            self.cell = (int(found.group(1)), int(found.group(2)))

    def handle_endtag(self, tag: str) -> None:
        if self.stack:
            self.stack.pop()
        if tag == "td":
            self.cell = None

    def handle_data(self, data: str) -> None:
        if self.cell is not None and data.strip() and any(self.stack):
            self.bold.add(self.cell)


def bold_cells(markup: str) -> Set[Tuple[int, int]]:
    parser = BoldCells()
    parser.feed(markup)
    parser.close()
    return parser.bold


def example_tables() -> Iterator[tables.Table]:
    beside = pd.DataFrame({"method": ["Local", "FedAvg", "FedTSA"], "ours_mean": [63.49, 64.1, np.nan],
                           "ours_std": [0.1, 0.2, np.nan], "seeds": [5, 1, 0], "paper_mean": [60.0, np.nan, 62.0],
                           "paper_std": [1.0, np.nan, 0.5], "difference": [3.49, np.nan, np.nan]}).set_index("method")
    yield tables.show(beside)
    yield tables.show(beside, best="min")
    quickstart = pd.DataFrame({"accuracy after mixing (%)": [70.1, 72.4, 71.0],
                               "no adaptation (%)": [40.0, 40.0, 41.5]},
                              index=pd.MultiIndex.from_tuples([("bn", "<local>"), ("bn", "fedavg"), ("grad", "fedamp")],
                                                              names=["tta", "strategy"]))
    yield tables.show(quickstart, caption="accuracy (%); bold: best per column")


@pytest.mark.parametrize("k", range(len(list(example_tables()))))
def test_best_cells_stay_bold_in_an_untrusted_notebook_and_marked_in_text(k):
    styled = list(example_tables())[k]
    ctx = styled._compute().ctx
    best = {cell for cell, props in ctx.items() if ("font-weight", "bold") in props}
    assert best, "the example marks no cell"
    shown = sanitized(styled._repr_html_())
    assert "<style" not in shown and "font-weight" not in re.sub(r'style="[^"]*"', "", shown)
    assert bold_cells(shown) == best, "the best cells are not bold once JupyterLab has sanitized the table"
    text = repr(styled)
    marked = [f"{styled.data.iloc[i, j]} *" for i, j in sorted(best)]
    assert all(m in text for m in marked) and text.count(" *") == len(best), text


def test_the_sanitizer_rules_are_jupyterlabs():
    """The allowlists above are those of the installed JupyterLab (its built ``jlab_core`` bundle)."""
    import importlib.util
    import sys

    if importlib.util.find_spec("jupyterlab") is None:
        pytest.skip("jupyterlab is not installed")
    bundles = sorted(Path(sys.prefix, "share", "jupyter", "lab", "static").glob("jlab_core.*.js"))
    if not bundles:
        pytest.skip("no built JupyterLab bundle in this environment")
    code = bundles[0].read_text(errors="replace")
    options = re.search(r'allowedTags:\[("a","abbr"[^\]]*)\],allowedAttributes:\{"\*":\[([^\]]*)\]', code)
    assert options, f"no sanitizer options in {bundles[0].name}"
    tags, everywhere = ({s.strip('"') for s in group.split(",")} for group in options.groups())
    assert tags == LAB_ALLOWED_TAGS and everywhere == LAB_ATTRIBUTES["*"]
    assert "style" not in tags and BOLD_TAGS <= tags
