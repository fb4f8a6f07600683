"""What the server could infer from uploads: the probing classifier and the upload collection."""
import numpy as np
import pandas as pd
import pytest

from ftta_core.experiment import ExperimentConfig
from ftta_core.leakage import collect_uploads, guess_accuracy, leakage_table


def test_guess_accuracy_separates_informative_from_random_uploads():
    rng = np.random.default_rng(0)
    y = np.repeat(np.arange(3), 40)
    groups = np.arange(120) // 10
    informative = np.eye(3)[y] * 5 + rng.normal(size=(120, 3))
    noise = rng.normal(size=(120, 3))
    assert guess_accuracy(informative, y, groups) > 90
    assert guess_accuracy(noise, y, groups) < 60
    with pytest.raises(ValueError, match="two slots"):
        guess_accuracy(noise, y, np.zeros(120))


def test_collected_uploads_have_one_row_per_client_and_step(tmp_path, monkeypatch):
    monkeypatch.setenv("FTTA_CACHE_DIR", str(tmp_path / "cache"))
    cfg = ExperimentConfig(dataset="embedded_digits", scenario="heterogeneity", clients=4, batch_size=10,
                           images_per_client=20, corruptions=["fog", "contrast", "frost"], sh=0.5, th=0.5,
                           local="bn", strategy="fedctta", device="cpu")
    got = collect_uploads(cfg, max_steps=6)
    assert set(got.uploads) == {"indicator", "feature_mean", "logits_mean", "bn_stats", "probe_logits"}
    assert all(len(v) == 24 for v in got.uploads.values()) and len(got.domains) == 24
    assert got.uploads["probe_logits"].shape[1] == 10 and got.uploads["indicator"].shape[1] == got.uploads[
        "feature_mean"].shape[1]
    table = leakage_table(got, folds=3)
    assert table["guess accuracy (%)"].between(0, 100).all() and (table["chance (%)"] > 0).all()


def test_leakage_reading_orders_uploads_and_names_small_uploads_that_reveal_more():
    from studies.readings import leakage_reading

    table = pd.DataFrame({"upload": ["bn_stats", "probe_logits", "feature_mean"], "bytes (float32)": [10752, 40, 1024],
                          "guess accuracy (%)": [94.9, 55.7, 30.1], "chance (%)": [8.3] * 3}).set_index("upload")
    text = leakage_reading(table)
    assert text.index("bn_stats 94.9%") < text.index("probe_logits 55.7%") < text.index("feature_mean 30.1%")
    assert "(chance 8.3%)" in text
    assert "probe_logits (40 bytes, 55.7%) more than feature_mean (1024 bytes, 30.1%)" in text
    assert "bn_stats (" not in text.split("Fewer bytes")[1]
    assert "Fewer bytes" not in leakage_reading(table.drop(index="probe_logits"))


@pytest.mark.usefixtures("certified_as_is")
def test_stored_leakage_table_is_read_back_until_its_code_changes(tmp_path, monkeypatch):
    import json

    from ftta_core import leakage
    from ftta_core.runstore import dumps_summary

    monkeypatch.setenv("FTTA_CACHE_DIR", str(tmp_path / "cache"))
    cfg = ExperimentConfig(dataset="embedded_digits", scenario="heterogeneity", clients=4, batch_size=10,
                           images_per_client=20, corruptions=["fog", "contrast", "frost"], sh=0.5, th=0.5,
                           local="bn", strategy="fedctta", device="cpu")
    first = leakage.stored_leakage_table(cfg, 6, tmp_path)
    (path,) = (tmp_path / "leakage").glob("*.json")
    calls = []
    monkeypatch.setattr(leakage, "collect_uploads", lambda *a, **k: calls.append(a) or pytest.fail("recomputed"))
    pd.testing.assert_frame_equal(leakage.stored_leakage_table(cfg, 6, tmp_path), first, check_dtype=False)
    stored = json.loads(path.read_text())
    stored["code"]["units"]["leakage"] = 0  # as if the leakage unit's version had been bumped since
    path.write_text(dumps_summary(stored))  # sealed again (``store_summary`` seals): stale, not damaged
    with pytest.raises(pytest.fail.Exception, match="recomputed"):  # stale: computed again
        leakage.stored_leakage_table(cfg, 6, tmp_path)
    assert len(calls) == 1
