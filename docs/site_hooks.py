"""mkdocs hook (``hooks:`` in mkdocs.yml): the site mirrors the repository's own paths.

mkdocs reads pages from one folder, ``docs_dir``; the workbook's pages are spread over the repository: the README (the
landing page), ``docs/*.md`` and the executed ``notebooks/*.ipynb``. This hook replaces the files mkdocs found in
``docs_dir`` by those, each under its path in the repository (``README.md`` -> ``index.html``, ``docs/data.md`` ->
``docs/data.html``, ``notebooks/10_fedtsa.ipynb`` -> ``notebooks/10_fedtsa.html``), so the relative links that work
on GitHub (``docs/results.md``, ``../README.md``, ``../notebooks/10_fedtsa.ipynb``) work unchanged in the site and
``mkdocs build --strict`` checks them. Repository files those pages link to (a figure, a table, a source file) are
copied into the site beside them; a link to anything else fails the strict build.

Notebook pages are HTML made by nbconvert (mkdocs-jupyter), which mkdocs does not rewrite: their links to ``.md``
and ``.ipynb`` files are pointed at the built pages here (``on_page_content``), and their table of contents is made
from the page's own headings (mkdocs-jupyter 0.26.3 makes it from a Markdown conversion that drops a heading's inline
code, so its anchor missed the heading's id: ``## Fig 3 (`figure_alpha`)`` in notebook 30).
"""
from __future__ import annotations

import html as html_lib
import json
import posixpath
import re
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files, InclusionLevel
from mkdocs.structure.pages import Page
from mkdocs.structure.toc import get_toc

# the pages, as glob patterns relative to the repository's root, in the order they are listed
PAGES = ("README.md", "docs/**/*.md", "notebooks/*.ipynb")
# a link's target in Markdown (``](target)``, ``![alt](target "title")``) or in inline HTML (``src=``, ``href=``)
MD_LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+[\"'][^)]*)?\)")
HTML_LINK = re.compile(r"""\b(?:src|href)\s*=\s*["']([^"']+)["']""")


def repository(config: MkDocsConfig) -> Path:
    """The repository's root: the folder of mkdocs.yml."""
    return Path(config.config_file_path).resolve().parent


def local_target(link: str) -> str | None:
    """The path part of a relative link (``../figures/a.png#x`` -> ``../figures/a.png``); None for a URL with a
    scheme or host, an absolute path, a bare fragment or a data URI."""
    parts = urlsplit(link)
    if parts.scheme or parts.netloc or not parts.path or parts.path.startswith("/"):
        return None
    return unquote(parts.path)


def linked_paths(text: str) -> set[str]:
    """The relative link targets in a page's Markdown or a notebook's markdown cells."""
    return {target for link in (*MD_LINK.findall(text), *HTML_LINK.findall(text))
            if (target := local_target(link)) is not None}


def page_text(path: Path) -> str:
    """A page's Markdown: the file itself, or a notebook's markdown cells joined."""
    if path.suffix != ".ipynb":
        return path.read_text(encoding="utf-8")
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")


def resolve(repo: Path, page_uri: str, target: str) -> str | None:
    """The repository path (posix, relative to ``repo``) of a page's link target; None when it leaves the repository
    or names no file."""
    uri = posixpath.normpath(posixpath.join(posixpath.dirname(page_uri), target))
    if uri.startswith("../") or uri == "..":
        return None
    return uri if (repo / uri).is_file() else None


@event_priority(100)  # before mkdocs-jupyter's on_files, which turns the .ipynb files into pages
def on_files(files: Files, config: MkDocsConfig) -> Files:
    """The README, docs/ and notebooks/ under their repository paths, every repository file they link to, and the
    theme's files (what mkdocs found in ``docs_dir`` is left out: docs/ is added under its repository path)."""
    repo = repository(config)

    def make(uri: str, inclusion: InclusionLevel = InclusionLevel.UNDEFINED) -> File:
        return File(uri, str(repo), config.site_dir, config.use_directory_urls, inclusion=inclusion)

    pages = [p.relative_to(repo).as_posix() for pattern in PAGES for p in sorted(repo.glob(pattern))]
    theme = [f for f in files if f.src_dir != config.docs_dir]
    out = Files([*theme, *(make(uri) for uri in pages)])
    todo = list(pages)
    while todo:
        page = todo.pop()
        for target in linked_paths(page_text(repo / page)):
            uri = resolve(repo, page, target)
            if uri is None or out.get_file_from_path(uri) is not None:
                continue  # mkdocs reports an unresolved link of a Markdown page; docs/site_links.py any other
            out.append(make(uri, InclusionLevel.NOT_IN_NAV))  # linked, not listed in the navigation
            if uri.endswith(".md"):
                todo.append(uri)
    return out


class _Headings(HTMLParser):
    """The ``<h1>``..``<h6>`` with an id of an HTML fragment, as mkdocs' table-of-contents tokens, nested by level;
    a heading's text leaves out its permalink (``<a class="anchor-link">``)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tokens: list[dict] = []
        self._open: list[dict] = []  # the innermost heading of each level so far
        self._heading: dict | None = None
        self._skip = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if re.fullmatch(r"h[1-6]", tag) and values.get("id"):
            self._heading = {"level": int(tag[1]), "id": values["id"], "name": "", "children": []}
        elif self._heading is not None and (self._skip or "anchor-link" in (values.get("class") or "").split()):
            self._skip += 1

    def handle_endtag(self, tag: str) -> None:
        if self._skip:
            self._skip -= 1
        elif self._heading is not None and tag == f"h{self._heading['level']}":
            heading, self._heading = self._heading, None
            heading["name"] = html_lib.escape(" ".join(heading["name"].split()))
            while self._open and self._open[-1]["level"] >= heading["level"]:
                self._open.pop()
            (self._open[-1]["children"] if self._open else self.tokens).append(heading)
            self._open.append(heading)

    def handle_data(self, data: str) -> None:
        if self._heading is not None and not self._skip:
            self._heading["name"] += data


def on_page_content(html: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    """A notebook page's links to repository pages (``../docs/statistics.md``) pointed at the built pages, and its
    table of contents made from its headings."""
    if not page.file.src_uri.endswith(".ipynb"):
        return html
    headings = _Headings()
    headings.feed(html)
    headings.close()
    page.toc = get_toc(headings.tokens)
    repo = repository(config)

    def rewrite(match: re.Match) -> str:
        link = match.group(2)
        target = local_target(link)
        uri = resolve(repo, page.file.src_uri, target) if target else None
        built = files.get_file_from_path(uri) if uri else None
        if built is None or not built.is_documentation_page():
            return match.group(0)
        fragment = urlsplit(link).fragment
        return f'{match.group(1)}{built.url_relative_to(page.file)}{"#" + fragment if fragment else ""}"'

    return re.sub(r'(\bhref=")([^"]+)"', rewrite, html)
