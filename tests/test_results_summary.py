"""The README's results block is generated from the stored runs, and stays so."""
from __future__ import annotations

import pandas as pd

from studies import results_summary
from studies.results_summary import BEGIN, END, PAGE, README, generate, generate_page, replace_block


def test_readme_results_block_equals_what_the_stored_runs_give_today():
    """Regenerates the block (claims recount, source model, step-size rule) and fails on any difference: run
    ``python -m studies.results_summary`` after adding runs or changing a reading."""
    text = README.read_text(encoding="utf-8")
    assert replace_block(text, generate()) == text, "README.md's results block is out of date"


def test_results_page_block_equals_what_the_stored_runs_give_today():
    """The step rule's replication and the speed table, generated into docs/results.md (too long for the README)."""
    text = PAGE.read_text(encoding="utf-8")
    assert replace_block(text, generate_page()) == text, "docs/results.md's generated block is out of date"


def test_replace_block_keeps_everything_around_the_markers_and_check_reports_a_stale_block(tmp_path, monkeypatch):
    text = f"# title\n\nbefore\n{BEGIN}\nold numbers\n{END}\nafter\n"
    assert replace_block(text, "new") == f"# title\n\nbefore\n{BEGIN}\nnew\n{END}\nafter\n"
    readme = tmp_path / "README.md"
    readme.write_text(text, encoding="utf-8")
    monkeypatch.setattr(results_summary, "generate", lambda: "new")
    page = tmp_path / "none.md"  # absent: only the README is checked
    assert results_summary.main(["--check", "--readme", str(readme), "--page", str(page)]) == 1
    assert results_summary.main(["--readme", str(readme), "--page", str(page)]) == 0
    assert results_summary.main(["--check", "--readme", str(readme), "--page", str(page)]) == 0
    assert "new" in readme.read_text()


def test_claims_section_counts_per_cell_class_and_names_the_moves():
    rows = pd.DataFrame([
        {"claim": "a", "cell class": "paper protocol", "verdict": "holds", "former verdict": "holds", "seeds": 5,
         "not counted": "", "identical": False},
        {"claim": "b", "cell class": "post hoc", "verdict": "undetermined", "former verdict": "holds", "seeds": 2,
         "not counted": "", "identical": False},
        {"claim": "c", "cell class": "paper protocol", "verdict": "holds", "former verdict": "holds", "seeds": 5,
         "not counted": "by construction", "identical": True}])
    text = results_summary.claims_section(rows)
    assert "| paper protocol | 1 | 0 | 1 | 1 |" in text  # holds, undetermined, by construction, former holds
    assert "1 counted row(s) changed verdict under the rule (1 holds -> undetermined); not counted: 1 by construction" \
        in text
