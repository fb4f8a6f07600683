"""The command line: every command has --help, and the FedTSA table command writes tables beside the paper."""
import subprocess
import sys

import pandas as pd
import pytest

from ftta_core.cli import build_parser, main

COMMANDS = ["run", "train-source", "eval-source", "cards", "gallery", "notebooks", "study"]
# every study action registered by the studies package (pyproject.toml's ftta.studies entry points)
STUDY_ACTIONS = [["study", "fedtsa", "table"], ["study", "fedtsa", "case-study"], ["study", "fedtsa", "grad-cells"],
                 ["study", "fedctta", "case-study"], ["study", "fedicon", "table"], ["study", "fedacross", "pretrain"],
                 ["study", "centralized", "table"], ["study", "fedtsa", "claims"]]


@pytest.mark.slow  # starts real processes: make test, not make test-fast
def test_top_level_help_lists_every_command():
    out = subprocess.run([sys.executable, "-m", "ftta_core", "--help"], capture_output=True, text=True, check=True)
    for cmd in COMMANDS:
        assert cmd in out.stdout


@pytest.mark.parametrize("cmd", COMMANDS)
def test_every_command_has_help(cmd, capsys):
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args([cmd, "--help"])
    assert exc.value.code == 0 and "usage" in capsys.readouterr().out


@pytest.mark.parametrize("action", STUDY_ACTIONS, ids=" ".join)
def test_every_study_action_has_help(action, capsys):
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args([*action, "--help"])
    assert exc.value.code == 0 and "usage" in capsys.readouterr().out


def test_the_library_registers_the_studies_through_entry_points():
    """``study`` lists what the ftta.studies entry points register, and the library imports no study to do it."""
    from ftta_core.study_registry import registered_studies

    studies = registered_studies()
    assert {"fedtsa", "fedctta", "pfedbbn", "fedicon", "fedacross", "anchored", "centralized", "results"} <= set(studies)
    assert {"table", "case-study", "grad-cells", "claims", "step-rule"} <= set(studies["fedtsa"].actions)


def test_fedtsa_table_runs_caches_and_sits_beside_the_paper(tmp_path, monkeypatch):
    monkeypatch.setenv("FTTA_CACHE_DIR", str(tmp_path / "cache"))
    args = ["study", "fedtsa", "table", "--tta", "bn", "--strategies", "local", "fedavg", "--seeds", "0", "1", "--settings",
            "niid", "--dataset", "embedded_digits", "--device", "cpu", "--max-steps", "2", "--results",
            str(tmp_path / "results"), "--table", str(tmp_path / "table")]
    assert main(args) == 0
    table = pd.read_csv(tmp_path / "table.csv")
    assert list(table["method"]) == ["No-Adapt", "Local", "FedAvg"]
    assert (table["seeds"] == 2).all()
    assert table["paper_mean"].isna().all()  # the paper has no embedded-digits column
    assert len(list((tmp_path / "results").glob("*.json"))) == 4
    md = (tmp_path / "table.md").read_text()
    assert "Made by: `python -m ftta_core" in md or "Made by:" in md
    assert main(args) == 0  # second time: read from the cache
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "table.csv"), table)


def test_paper_numbers_are_the_fedtsa_table():
    from studies.paper import paper_table

    t = paper_table("fedtsa_table1").set_index(["method", "dataset", "setting", "tta"])
    assert t.loc[("Local", "cifar10", "niid", "bn"), "mean"] == 56.93
    assert t.loc[("FedAvg", "cifar10", "iid", "bn"), "mean"] == 61.29
    assert len(t) == 12 * 8


def test_local_row_is_derived_from_accuracy_local_under_tta_bn():
    from studies.fedtsa.table1 import beside_fedtsa_table1

    grid = pd.DataFrame({"strategy": ["fedavg", "fedavg"], "setting": ["niid", "niid"], "seed": [0, 1],
                         "accuracy": [50.0, 52.0], "accuracy_local": [55.0, 57.0], "accuracy_source": [30.0, 31.0]})
    t = beside_fedtsa_table1(grid, "cifar10", "bn", ["fedavg"]).set_index("method")
    assert t.loc["Local", "ours_mean"] == 56.0 and t.loc["Local", "paper_mean"] == 56.93
    assert t.loc["No-Adapt", "ours_mean"] == 30.5 and t.loc["FedAvg", "ours_mean"] == 51.0


def test_text_outputs_of_an_executed_notebook(tmp_path):
    import nbformat

    from ftta_core.notebooks import text_outputs

    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("x")
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="hello\n"),
                    nbformat.v4.new_output("execute_result", data={"text/plain": "table"}, execution_count=1),
                    nbformat.v4.new_output("display_data", data={"text/plain": "<Figure size 1x1>"})]
    nb.cells.append(cell)
    nbformat.write(nb, str(tmp_path / "n.ipynb"))
    assert text_outputs(tmp_path / "n.ipynb") == ["hello", "table"]


def test_case_study_stores_compact_runs_and_reuses_them(tmp_path, monkeypatch):
    monkeypatch.setenv("FTTA_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "case"
    args = ["study", "fedtsa", "case-study", "--strategies", "local", "fedavg", "--dataset", "embedded_digits", "--device", "cpu",
            "--max-steps", "3", "--out", str(out)]
    assert main(args) == 0
    table = pd.read_csv(out / "table.csv", index_col=[0, 1])
    assert len(table) == 2 * 4 and table["mean"].between(0, 100).all()  # 3 groups + all clients, 2 strategies
    slots = pd.read_csv(out / "fedavg" / "slots.csv")
    assert set(slots.client) == set(range(10)) and (slots.n == 30).all()  # 3 steps x batch 10
    stamp = (out / "fedavg" / "summary.json").stat().st_mtime_ns
    assert main(args) == 0  # second time: the stored runs are read back, not rerun
    assert (out / "fedavg" / "summary.json").stat().st_mtime_ns == stamp
    pd.testing.assert_frame_equal(pd.read_csv(out / "table.csv", index_col=[0, 1]), table)


def test_train_source_stores_a_named_variant_of_a_recipe(tmp_path, capsys):
    import json

    assert main(["train-source", "--model", "digits_cnn_embedded", "--epochs", "1", "--name", "digits_e1",
                 "--out-dir", str(tmp_path), "--device", "cpu"]) == 0
    card = json.loads((tmp_path / "digits_e1.json").read_text())
    assert (tmp_path / "digits_e1.pt").exists() and card["name"] == "digits_e1"
    assert card["spec"]["epochs"] == 1 and card["spec"]["arch"] == "digits_cnn"
    assert "--name digits_e1" in card["command"] and "--epochs 1" in card["command"]
    assert main(["train-source", "--model", "digits_cnn_embedded", "--name", "resnet8_cifar10",
                 "--out-dir", str(tmp_path)]) == 2
    assert "a shipped model of another recipe" in capsys.readouterr().err
    # a registered variant's name is accepted with exactly its recipe (how its card says it was made), or alone
    assert main(["train-source", "--model", "resnet8_cifar10", "--epochs", "1", "--name",
                 "resnet8_cifar10_e1_n10000", "--out-dir", str(tmp_path)]) == 2  # all images: another recipe
    assert main(["train-source", "--model", "digits_cnn_embedded", "--train-images", "64",
                 "--out-dir", str(tmp_path)]) == 2
    assert "--train-images needs --name" in capsys.readouterr().err
    assert main(["train-source", "--model", "digits_cnn_embedded", "--epochs", "1", "--train-images", "64", "--name",
                 "digits_64", "--out-dir", str(tmp_path), "--device", "cpu"]) == 0
    small = json.loads((tmp_path / "digits_64.json").read_text())
    assert small["train_images"] == 64 and card["train_images"] > 64
    assert small["clean_test_accuracy"] < card["clean_test_accuracy"]


def test_case_study_keeps_a_strategy_with_parameters_under_its_spec(tmp_path, monkeypatch, capsys):
    """``name@key=value`` runs the strategy with those parameters, resumably, in a folder named by the spec; the
    stored run is read back for that spec only; a malformed spec is a one-line error."""
    import json

    monkeypatch.setenv("FTTA_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("FTTA_PARTIAL_DIR", str(tmp_path / "partial"))
    out = tmp_path / "case"
    common = ["--dataset", "embedded_digits", "--device", "cpu", "--max-steps", "3", "--out", str(out)]
    spec = "fedctta@probe_bn=eval,temperature=2"
    assert main(["study", "fedtsa", "case-study", "--orders", "fedctta", "--strategies", "fedctta", spec, *common]) == 0
    config = json.loads((out / spec / "summary.json").read_text())["config"]
    assert config["strategy"] == "fedctta" and config["strategy_params"] == {"probe_bn": "eval", "temperature": 2}
    assert json.loads((out / "fedctta" / "summary.json").read_text())["config"]["strategy_params"] == {}
    assert not list((tmp_path / "partial").glob("*"))  # the resumable folder is gone once the run is kept
    table = pd.read_csv(out / "table.csv", index_col=[0, 1])
    assert {spec, "fedctta"} <= set(table.index.get_level_values("strategy"))
    stamp = (out / spec / "summary.json").stat().st_mtime_ns
    assert main(["study", "fedtsa", "case-study", "--orders", "fedctta", "--strategies", spec, *common]) == 0
    assert (out / spec / "summary.json").stat().st_mtime_ns == stamp
    assert main(["study", "fedtsa", "case-study", "--strategies", "fedctta@probe_bn", *common]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "fedctta@probe_bn" in err[0]
