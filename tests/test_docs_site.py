"""The workbook as a static site (mkdocs.yml, `make docs`): it builds with ``mkdocs build --strict``, every notebook is
a page of the navigation with its images inline, and no internal link or image of the built HTML is broken.

The site is built once into a temporary folder (with a cold notebook cache: what CI sees on a fresh clone); those
tests are ``slow`` (``make test-fast`` leaves them out). The link checker's own tests build nothing.
"""
from __future__ import annotations

import base64
import importlib.util
import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
IMAGE_TYPES = ("image/png", "image/jpeg", "image/gif")  # rendered as <img src="data:...">; SVG is inlined as markup
INLINE_IMAGE = re.compile(r"""<img[^>]*\bsrc=["']data:image/[\w+.-]+;base64,([^"']+)["']""")


def _load(name: str):
    """A script of docs/ as a module (docs/ is no package)."""
    spec = importlib.util.spec_from_file_location(name, REPO / "docs" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(name, module)  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


site_links = _load("site_links")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site built from this checkout by ``mkdocs build --strict`` into a temporary folder."""
    pytest.importorskip("mkdocs_jupyter", reason="the docs extra is not installed: `pip install -e .[docs]` "
                                                 "(`make install` installs it)")
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "FTTA_DOCS_CACHE": str(tmp_path_factory.mktemp("notebook-cache")),
           "NO_MKDOCS_2_WARNING": "1"}  # mkdocs-material's end-of-life notice (mkdocs.yml)
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(out)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
    return out


def _image_outputs(notebook: Path) -> Counter:
    """The base64 payloads of a notebook's image outputs, counted."""
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    return Counter("".join(output["data"][kind]).replace("\n", "")
                   for cell in cells for output in cell.get("outputs", [])
                   for kind in IMAGE_TYPES if kind in output.get("data", {}))


@pytest.mark.slow
def test_every_notebook_and_page_is_in_the_navigation(site):
    landing = (site / "index.html").read_text(encoding="utf-8")
    assert "<h1" in landing and "Two commands" in landing, "index.html is not the README"
    expected = [f"notebooks/{nb.stem}.html" for nb in NOTEBOOKS]
    expected += [f"docs/{page.stem}.html" for page in sorted((REPO / "docs").glob("*.md"))]
    missing = [uri for uri in expected if not (site / uri).is_file() or f'href="{uri}"' not in landing]
    assert not missing, f"not built or not in the site's navigation (mkdocs.yml nav): {missing}"


@pytest.mark.slow
@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_page_shows_the_notebooks_images_inline(site, notebook):
    page = (site / "notebooks" / f"{notebook.stem}.html").read_text(encoding="utf-8")
    shown = Counter(INLINE_IMAGE.findall(page))
    missing = _image_outputs(notebook) - shown
    assert not missing, (f"{notebook.name}: {sum(missing.values())} image output(s) not inline in its page "
                         f"({sum(shown.values())} inline)")


@pytest.mark.slow
def test_no_internal_link_or_image_of_the_site_is_broken(site):
    report = site_links.check_site(site)
    assert report.pages >= len(NOTEBOOKS) + 2 and report.internal > 0
    assert not report.broken, "\n".join(report.lines()[:len(report.broken)])


# --- the link checker itself, on a small hand-made site -------------------------------------------------------------

def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text, encoding="utf-8")
    return root


def test_link_checker_finds_missing_files_and_anchors_and_lists_external_links(tmp_path):
    png = base64.b64encode(b"png").decode()
    site = _write(tmp_path, {
        "index.html": '<h1 id="top">x</h1><a href="#top">ok</a><a href="#nowhere">bad anchor</a>'
                      '<a href="a/b.html#sec">ok</a><a href="a/">folder</a><img src="img/x.png">'
                      f'<img src="data:image/png;base64,{png}"><a href="https://example.org/p">ext</a>'
                      '<a href="mailto:x@y">mail</a><a href="a/c.html">missing</a><a href="../out.html">outside</a>',
        "a/b.html": '<h2 id="sec">s</h2><a href="../index.html#top">back</a><a href="b.html#gone">bad</a>'
                    '<a href="https://example.org/p">ext</a>',
        "a/index.html": "<p>folder page</p>",
        "img/x.png": "not really a png",
    })
    report = site_links.check_site(site)
    assert report.pages == 3
    assert sorted((page, link) for page, link, _ in report.broken) == [
        ("a/b.html", "b.html#gone"), ("index.html", "#nowhere"), ("index.html", "../out.html"),
        ("index.html", "a/c.html")]
    assert report.external == {"https://example.org/p": {"index.html", "a/b.html"}}
    assert site_links.main([str(site)]) == 1


def test_link_checker_passes_a_whole_site_and_refuses_a_missing_folder(tmp_path, capsys):
    site = _write(tmp_path / "site", {"index.html": '<a href="p.html">p</a>', "p.html": '<a href="index.html">i</a>'})
    assert site_links.main([str(site)]) == 0
    assert "0 broken" in capsys.readouterr().out
    assert site_links.main([str(tmp_path / "nothing")]) == 2
    assert "no built site" in capsys.readouterr().err


def test_the_hook_copies_the_repository_files_a_page_links_to_and_nothing_outside(tmp_path):
    pytest.importorskip("mkdocs", reason="the docs extra is not installed: `pip install -e .[docs]`")
    hooks = _load("site_hooks")
    text = ('![f](../figures/a.png "title") [p](statistics.md#x) <img src="img/b.png"> [e](https://x.org/a.png) '
            '[top](#top) [root](/abs.png) ![d](data:image/png;base64,AAAA)')
    assert hooks.linked_paths(text) == {"../figures/a.png", "statistics.md", "img/b.png"}
    _write(tmp_path, {"figures/a.png": "", "docs/statistics.md": "# s"})
    assert hooks.resolve(tmp_path, "docs/x.md", "../figures/a.png") == "figures/a.png"
    assert hooks.resolve(tmp_path, "docs/x.md", "statistics.md") == "docs/statistics.md"
    assert hooks.resolve(tmp_path, "docs/x.md", "../../outside.png") is None
    assert hooks.resolve(tmp_path, "docs/x.md", "missing.png") is None
