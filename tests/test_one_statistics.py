"""One statistics module: every verdict, paired difference and interval of the package and the notebooks goes
through ``ftta_core.stats`` (docs/statistics.md). Checked on the source with ``ast``: a function whose name says it
computes one (``verdict``, ``paired``, ``ci95``, ``half_width``) must call into ``ftta_core.stats``, and nothing but
``stats.py`` reaches ``scipy.stats`` or a Student-t quantile (``t.ppf``) itself."""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Iterator, List, Set, Tuple

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "ftta_core"
STUDIES = REPO / "studies"
STATS = PACKAGE / "stats.py"
# being rewritten onto ``stats`` in parallel (issue 52); drop it from here once it is
ALLOWED: set = set()  # every module is checked
WORDS = ("verdict", "paired", "ci95", "half_width")


def checked_files() -> List[Path]:
    """Every module of the library but ``stats.py`` (and ``ALLOWED``), of the studies, and every notebook source."""
    files = sorted(PACKAGE.rglob("*.py")) + sorted(STUDIES.rglob("*.py")) + sorted((REPO / "notebooks").glob("*.py"))
    return [f for f in files if f != STATS and f not in ALLOWED]


def _is_stats_module(module: str, level: int) -> bool:
    """Whether ``from <level dots><module> import ...`` names ``ftta_core.stats`` (absolute or relative)."""
    return module == "ftta_core.stats" or (level > 0 and module == "stats")


def stats_names(tree: ast.AST) -> Tuple[Set[str], Set[str]]:
    """(names bound to the module ``ftta_core.stats``, names imported from it) anywhere in ``tree``."""
    modules, members = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if _is_stats_module(module, node.level):
                members |= {a.asname or a.name for a in node.names}
            elif module == "ftta_core" or (node.level > 0 and not module):
                modules |= {a.asname or a.name for a in node.names if a.name == "stats"}
        elif isinstance(node, ast.Import):
            modules |= {a.asname for a in node.names if a.name == "ftta_core.stats" and a.asname}
    return modules, members


def _root(node: ast.AST) -> ast.AST:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node


def calls_stats(func: ast.AST, modules: Set[str], members: Set[str]) -> bool:
    """Whether ``func`` calls a function of ``ftta_core.stats`` (``stats.paired(...)`` or an imported name)."""
    for node in ast.walk(func):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Name) and f.id in members:
            return True
        if isinstance(f, ast.Attribute):
            root = _root(f)
            if isinstance(root, ast.Name) and root.id in modules:
                return True
            # ftta_core.stats.paired(...)
            if isinstance(f.value, ast.Attribute) and f.value.attr == "stats" and isinstance(_root(f), ast.Name) \
                    and _root(f).id == "ftta_core":
                return True
    return False


def statistics_functions(tree: ast.AST) -> Iterator[ast.AST]:
    """The functions (methods and nested ones too) whose name says they compute a verdict, a paired difference or
    an interval."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(w in node.name.lower() for w in WORDS):
            yield node


def direct_statistics(tree: ast.AST) -> List[Tuple[int, str]]:
    """(line, what) of every use of ``scipy.stats`` and of a Student-t quantile (``t.ppf``) in ``tree``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.startswith("scipy.stats") or (node.module == "scipy"
                                                         and any(a.name == "stats" for a in node.names)):
                found.append((node.lineno, f"imports from {node.module}"))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, f"imports {a.name}") for a in node.names if a.name.startswith("scipy.stats")]
        elif isinstance(node, ast.Attribute):
            if node.attr == "stats" and isinstance(node.value, ast.Name) and node.value.id == "scipy":
                found.append((node.lineno, "scipy.stats"))
            if node.attr == "ppf" and ((isinstance(node.value, ast.Attribute) and node.value.attr == "t")
                                       or (isinstance(node.value, ast.Name) and node.value.id == "t")):
                found.append((node.lineno, "t.ppf"))
    return found


def problems(path: Path) -> List[str]:
    """What in ``path`` computes statistics outside ``ftta_core.stats``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    modules, members = stats_names(tree)
    where = path.relative_to(REPO)
    out = [f"{where}:{f.lineno} {f.name}() does not call into ftta_core.stats"
           for f in statistics_functions(tree) if not calls_stats(f, modules, members)]
    return out + [f"{where}:{line} {what}: use ftta_core.stats" for line, what in direct_statistics(tree)]


def test_every_verdict_and_interval_goes_through_stats():
    found = [p for f in checked_files() for p in problems(f)]
    assert not found, "statistics computed outside ftta_core.stats:\n" + "\n".join(found)


def test_the_check_covers_the_package_and_the_notebooks():
    files = checked_files()
    assert STUDIES / "leaderboard.py" in files and STUDIES / "fedicon" / "report.py" in files
    assert REPO / "notebooks" / "60_your_method.py" in files and STATS not in files


SOURCES = {
    "own_verdict": ("def verdict(row):\n    return 'above' if row.gain > row.ci95 else 'below'\n", 1),
    "own_paired": ("import pandas as pd\ndef paired(a, b):\n    d = (a - b).dropna()\n"
                   "    return d.mean(), d.std(ddof=1)\n", 1),
    "scipy_quantile": ("from scipy import stats\ndef ci95_half_width(sd, n):\n"
                       "    return stats.t.ppf(0.975, n - 1) * sd / n ** 0.5\n", 3),
    "scipy_import": ("import scipy.stats\nx = scipy.stats.norm\n", 2),
    "module_call": ("from ftta_core import stats\ndef paired_gain(a, b):\n    return stats.paired(a, b).mean\n", 0),
    "relative_member": ("from ..stats import comparison, paired\ndef paired_verdict(a, b):\n"
                        "    return comparison(paired(a, b))\n", 0),
    "relative_module": ("from .. import stats\nclass A:\n    def half_width(self, sd, n):\n"
                        "        return stats.t_half_width(sd, n)\n", 0),
    "absolute_module": ("import ftta_core.stats as fs\ndef verdict_of(e):\n    return fs.verdict(e, None)\n", 0),
    "unrelated_name": ("def summary(a, b):\n    return (a - b).mean()\n", 0),
    "scipy_other_module": ("from ..stats import paired\nfrom scipy.ndimage import zoom\n"
                           "def paired_zoom(a, b):\n    return zoom(paired(a, b).values, 2)\n", 0),
}


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_the_check_catches_a_statistics_of_its_own(tmp_path, name, monkeypatch):
    source, expected = SOURCES[name]
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    monkeypatch.setattr(f"{__name__}.REPO", tmp_path)
    assert len(problems(path)) == expected, problems(path)
