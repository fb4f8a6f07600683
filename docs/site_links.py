"""Check the links of the built site: every internal link and image resolves, external links are listed, not fetched.

    .venv/bin/python docs/site_links.py site            # after `mkdocs build` (`make docs` runs both)

Reads every ``*.html`` under the site folder with the standard library's ``html.parser``. A relative or root-relative
``href``/``src`` must name a file of the site (a folder: its ``index.html``), and its ``#fragment`` an ``id`` (or an
``<a name>``) of the target page; a bare ``#fragment`` one of the same page. Links with a scheme or host are external:
listed with the number of pages that carry each, never fetched (the machines that build the site have no internet).
Exits 1 and prints one line per broken link when any is found.
"""
from __future__ import annotations

import argparse
import posixpath
import sys
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

# (tag, attribute) pairs whose value is a link the browser follows or loads
LINK_ATTRIBUTES = {("a", "href"), ("link", "href"), ("img", "src"), ("script", "src"), ("iframe", "src"),
                   ("source", "src"), ("video", "src"), ("audio", "src"), ("embed", "src")}
# schemes that name no file: nothing to resolve
INERT = ("data:", "javascript:", "mailto:", "tel:", "blob:", "about:")


class _Page(HTMLParser):
    """The links and the anchor names of one HTML page."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.links: list[tuple[str, str]] = []  # (tag, link)
        self.anchors: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if value is None:
                continue
            if name == "id" or (tag == "a" and name == "name"):
                self.anchors.add(value)
            elif (tag, name) in LINK_ATTRIBUTES:
                self.links.append((tag, value.strip()))


@dataclass
class Report:
    """What the check found: pages read, internal links checked, broken ones, external ones with their pages."""

    pages: int = 0
    internal: int = 0
    broken: list[tuple[str, str, str]] = field(default_factory=list)  # (page, link, why)
    external: dict[str, set[str]] = field(default_factory=dict)  # url -> pages

    def lines(self) -> list[str]:
        """The report as printed: the broken links first, then the counts, then the external links."""
        out = [f"broken: {page}: {link} ({why})" for page, link, why in self.broken]
        out.append(f"{self.pages} pages, {self.internal} internal links and images checked, "
                   f"{len(self.broken)} broken; {len(self.external)} distinct external links (not fetched):")
        out += [f"  {url}  ({len(pages)} page(s))" for url, pages in sorted(self.external.items())]
        return out


def _parse(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text(encoding="utf-8", errors="replace"))
    page.close()
    return page


def _target(site: Path, page_uri: str, path: str) -> str | None:
    """The site path (posix, relative to ``site``) a link's path names, or None when it leaves the site or names
    nothing; a folder stands for its ``index.html``."""
    base = "" if path.startswith("/") else posixpath.dirname(page_uri)
    uri = posixpath.normpath(posixpath.join(base, path.lstrip("/"))) if path else page_uri
    if uri == ".." or uri.startswith("../"):
        return None
    if (site / uri).is_dir():
        uri = posixpath.join(uri, "index.html") if uri != "." else "index.html"
    return uri if (site / uri).is_file() else None


def check_site(site: Path) -> Report:
    """Check every link of every HTML page under ``site``."""
    site = Path(site)
    if not site.is_dir():
        raise FileNotFoundError(f"no built site at {site}: run `mkdocs build` (`make docs`) first")
    parsed = {p.relative_to(site).as_posix(): _parse(p) for p in sorted(site.rglob("*.html"))}
    report = Report(pages=len(parsed))
    for page_uri, page in parsed.items():
        for tag, link in page.links:
            if not link or link.lower().startswith(INERT):
                continue
            parts = urlsplit(link)
            if parts.scheme or parts.netloc:
                report.external.setdefault(link, set()).add(page_uri)
                continue
            report.internal += 1
            uri = _target(site, page_uri, unquote(parts.path))
            if uri is None:
                report.broken.append((page_uri, link, f"<{tag}> names no file of the site"))
                continue
            fragment = unquote(parts.fragment)
            if fragment and uri.endswith(".html") and fragment not in _anchors(site, uri, parsed):
                report.broken.append((page_uri, link, f"no id {fragment!r} in {uri}"))
    return report


def _anchors(site: Path, uri: str, parsed: dict[str, _Page]) -> set[str]:
    if uri not in parsed:
        parsed[uri] = _parse(site / uri)
    return parsed[uri].anchors


def main(argv: list[str] | None = None) -> int:
    """Print the report of ``check_site``; 1 when a link is broken."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("site", type=Path, nargs="?", default=Path("site"), help="the built site's folder")
    args = parser.parse_args(argv)
    try:
        report = check_site(args.site)
    except FileNotFoundError as error:
        print(f"site_links: {error}", file=sys.stderr)
        return 2
    print("\n".join(report.lines()))
    return 1 if report.broken else 0


if __name__ == "__main__":
    sys.exit(main())
