"""Variants are data (``ftta_core.variants``): their parameters reach a grid's table as typed columns, and no study or
notebook recovers a parameter by parsing a display label."""
import dataclasses
import re
from pathlib import Path

import pandas as pd
import pytest

from ftta_core.experiment import ExperimentConfig
from ftta_core.variants import Variant, factor_table, factors_of, overrides_of, with_factors

REPO = Path(__file__).resolve().parents[1]


def test_a_variant_reads_as_its_overrides_and_builds_its_config():
    v = Variant({"strategy": "fedavg", "seed": 3}, {"strategy": "FedAvg", "k": 2})
    assert dict(v) == {"strategy": "fedavg", "seed": 3} == overrides_of(v)
    assert v["strategy"] == "fedavg" and v.get("nope", 1) == 1
    base = ExperimentConfig(dataset="embedded_digits")
    assert v.config(base) == dataclasses.replace(base, strategy="fedavg", seed=3)
    assert v.config(base, strategy_params={}).seed == 3
    assert overrides_of({"strategy": "local"}) == {"strategy": "local"} and factors_of({"strategy": "local"}) == {}


def test_factors_become_columns_whatever_the_labels_say():
    variants = {"anything at all": Variant({}, {"T": 4.0, "scale": "none"}),
                "T=1, scale=median": Variant({}, {"T": 2.0}),  # a label that lies: the factor wins
                "baseline": {"strategy": "fedavg"}}
    grid = pd.DataFrame({"variant": ["baseline", "anything at all", "T=1, scale=median"], "seed": [0, 0, 0],
                         "accuracy": [50.0, 60.0, 70.0]})
    out = with_factors(grid, variants)
    assert list(out.columns) == ["variant", "seed", "accuracy", "T", "scale"]
    assert out["T"].tolist()[1:] == [4.0, 2.0] and pd.isna(out["T"].iloc[0])
    assert out["scale"].tolist()[1] == "none"
    assert list(factor_table(variants).index) == list(variants)
    with pytest.raises(ValueError, match="not given"):
        with_factors(grid.assign(variant=["x", "y", "z"]), variants)


# what reads a parameter back out of a label: string splitting or regex extraction on a table's text column
LABEL_PARSING = re.compile(r"\.str\.(split|rsplit|extract|extractall|partition|rpartition)\(|"
                           r"(variant|label|setting)\b[\"'\]]*\.str\.(startswith|endswith|contains|count|slice)\(|"
                           r"\.variant\.str\.|lambda \w+: \w+\.(split|rsplit|partition)\(")
# searches of a text column that are not a parameter read back (a claim's source names the paper's table)
ALLOWED = {("studies/commands.py", "source")}


def test_no_study_or_notebook_parses_a_display_label():
    found = []
    for path in sorted((REPO / "studies").rglob("*.py")) + sorted((REPO / "notebooks").glob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if LABEL_PARSING.search(line) and not any(rel == f and word in line for f, word in ALLOWED):
                found.append(f"{rel}:{number}: {line.strip()}")
    assert not found, "parameters read back from labels (give the variants factors instead):\n" + "\n".join(found)


def test_the_check_would_catch_the_parsing_it_forbids():
    for line in ('parts = out["variant"].str.extract(r"T=([\\d.]+)")', "g.variant.str.split().str[-1]",
                 'grid[~grid["variant"].str.startswith("T=")]', 'x.str.rsplit(" / ", n=1)',
                 'domains.rename(index=lambda k: k.split(" ")[0])'):
        assert LABEL_PARSING.search(line), line
