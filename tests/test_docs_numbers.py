"""No hand-typed result numbers in the docs pages.

Every result number is generated from stored runs by code: the executed notebooks, the tables under ``figures/`` and
the README's generated block (``python -m studies.results_summary``). A docs page says what was run, where its
numbers are and which command made them; it does not retype them. A result-like number is a decimal with a sign
(``+7.73``, ``-4.74``, ``−0.5``) or with a percent (``72.76 %``, ``63.5%``), outside code spans and code blocks.
Protocol numbers (``5 seeds``, ``Adam 3e-4``, ``750 steps``, ``severity 5``) do not match.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parent.parent / "docs"

# pages allowed to carry such numbers, each with its reason; keep this list small
EXEMPT = {
    "statistics.md": "the verdict rule itself: its margins ([-0.5, 0.5]), the interval coverages that justify it and "
                     "the papers' differences it names are part of the rule's definition",
    "command-line.md": "documents measured speeds (kernel timings, before -> after, with the benchmark and the "
                       "command beside each), which are measurements of the code, not results of the study",
}

RESULT_LIKE = re.compile(r"[+\-\u2212]\d+\.\d+|\d+\.\d+\s?%")
FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")


def _prose_lines(text: str):
    """(line number, line without its code spans) for every line outside fenced code blocks and outside a block
    generated from the stored runs (``studies.results_summary``'s markers; ``tests/test_results_summary.py`` checks
    that block against the runs)."""
    in_block, generated = None, False
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("<!-- results:begin"):
            generated = True
        if generated:
            generated = not line.startswith("<!-- results:end")
            continue
        fence = FENCE.match(line)
        if fence:
            if in_block is None:
                in_block = fence.group(1)
            elif fence.group(1) == in_block:
                in_block = None
            continue
        if in_block is None:
            yield number, CODE_SPAN.sub("", line)


def result_like_numbers(text: str) -> list[tuple[int, str]]:
    """Every result-like number outside code, with its line number."""
    return [(number, match.group(0)) for number, line in _prose_lines(text)
            for match in RESULT_LIKE.finditer(line)]


def _pages():
    return sorted(p for p in DOCS.glob("*.md") if p.name not in EXEMPT)


def test_the_exemptions_name_existing_pages():
    assert set(EXEMPT) <= {p.name for p in DOCS.glob("*.md")}
    assert len(EXEMPT) <= 3, "keep the exemption list small: point to the generated numbers instead"


def test_the_pattern_finds_result_numbers_and_leaves_protocol_numbers_and_code():
    found = result_like_numbers("FedTSA +7.73 over Local, -4.74 NIID, \u22122.0; 63.5% vs 35.2 % clean\n"
                                "5 seeds, 20 clients, Adam 3e-4, 750 steps, severity 5, 2,000 images, 95 % interval\n"
                                "`accuracy -1.25` in a span, 0.91-0.93\n"
                                "```\nprint(+3.5, '12.5%')\n```\n"
                                "<!-- results:begin (generated) -->\n+9.99 generated\n<!-- results:end -->\n")
    assert [n for _, n in found] == ["+7.73", "-4.74", "\u22122.0", "63.5%", "35.2 %", "-0.93"]


@pytest.mark.parametrize("page", _pages(), ids=lambda p: p.name)
def test_docs_page_has_no_hand_typed_result_number(page):
    found = result_like_numbers(page.read_text(encoding="utf-8"))
    assert not found, (f"{page.name} types result numbers by hand (line, number): {found}; point to the notebook "
                       "section, the figures/ table or the README's generated block instead")
