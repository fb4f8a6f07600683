"""The collaboration explorer (``ftta_core.explorer``): clients grouped by domain, a fixed [0, 1] scale, the static
fallback (what executed notebooks show) and the ipywidgets explorer (what JupyterLab shows)."""
from __future__ import annotations

import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from ftta_core.explorer import (CollaborationExplorer, CollaborationRun, domain_groups, explore, find_runs,  # noqa: E402
                                interactive_frontend, load_run, run_name, snapshot_figure, snapshot_steps)

N, T, SLOT = 6, 8, 4
# slot 0: clients {0,1} on a, {2,3} on b, {4,5} on c; slot 1: {0,2} on a, {1,3} on b (clients 1 and 2 swap)
DOMAINS = np.array([["a", "a", "b", "b", "c", "c"]] * SLOT + [["a", "b", "a", "b", "c", "c"]] * SLOT, dtype=object)


def synthetic_run() -> CollaborationRun:
    """W [T, N, N], row-stochastic, drawn with an explicit generator."""
    w = np.random.default_rng(0).random((T, N, N))
    return CollaborationRun("synthetic", w / w.sum(-1, keepdims=True), DOMAINS, SLOT, {"strategy": "test"})


def boundaries(ax) -> tuple:
    """(horizontal, vertical) positions of the straight lines drawn on ``ax``."""
    horizontal = sorted({ln.get_ydata()[0] for ln in ax.lines if ln.get_ydata()[0] == ln.get_ydata()[1]})
    vertical = sorted({ln.get_xdata()[0] for ln in ax.lines if ln.get_xdata()[0] == ln.get_xdata()[1]})
    return horizontal, vertical


def test_domain_groups_orders_clients_by_their_domain():
    order, labels = domain_groups(DOMAINS[SLOT], N)
    assert order.tolist() == [0, 2, 1, 3, 4, 5]
    assert labels == ["a", "a", "b", "b", "c", "c"]
    order, labels = domain_groups(None, 3)
    assert order.tolist() == [0, 1, 2] and labels == ["", "", ""]


def test_static_fallback_shares_the_unit_scale_and_draws_group_boundaries():
    run = synthetic_run()
    fig = snapshot_figure(run, steps=[1, 5], client=2)
    try:
        images = [im for ax in fig.axes for im in ax.images]
        assert len(images) == 3  # two W snapshots and the client's row over time
        assert all(im.get_clim() == (0.0, 1.0) for im in images)
        assert sum(ax.get_label() == "<colorbar>" for ax in fig.axes) == 1  # one colour bar for all panels
        second = fig.axes[1]
        order = [0, 2, 1, 3, 4, 5]  # the domain order at step 5
        np.testing.assert_allclose(second.images[0].get_array(), run.weights[5][np.ix_(order, order)])
        assert boundaries(second) == ([1.5, 3.5], [1.5, 3.5])
        assert [t.get_text() for t in second.get_xticklabels()] == [str(c) for c in order]
        assert {t.get_text() for t in second.texts} == {"a", "b", "c"}  # domain labels
    finally:
        plt.close(fig)


def test_snapshot_steps_are_mid_slot_and_explore_falls_back_outside_a_frontend():
    run = synthetic_run()
    assert snapshot_steps(run) == [2, 6]
    assert not interactive_frontend()  # pytest is no Jupyter kernel
    fig = explore({"synthetic": run}, step=5)
    try:
        assert [ax.get_title() for ax in fig.axes[:2]] == ["step 2 (slot 0)", "step 5 (slot 1)"]
    finally:
        plt.close(fig)


def test_widget_builds_and_the_slider_changes_the_shown_step():
    pytest.importorskip("ipywidgets")
    import ipywidgets

    run = synthetic_run()
    other = CollaborationRun("other", run.weights[:3, :4, :4], None, None, None)
    explorer = CollaborationExplorer({"synthetic": run, "other": other}, step=1, client=0)
    assert isinstance(explorer.widget, ipywidgets.VBox) and isinstance(explorer.image, ipywidgets.Image)
    assert explorer.shown == ("synthetic", 1, 0) and explorer.step_slider.max == T - 1
    before = explorer.image.value
    explorer.step_slider.value = 5
    assert explorer.shown == ("synthetic", 5, 0)
    assert explorer.image.value != before
    order = [0, 2, 1, 3, 4, 5]
    np.testing.assert_allclose(explorer.figure.axes[0].images[0].get_array(), run.weights[5][np.ix_(order, order)])
    explorer.client_select.value = 3
    assert explorer.shown == ("synthetic", 5, 3)
    explorer.run_select.value = "other"  # fewer steps and clients: the controls follow
    assert explorer.step_slider.max == 2 and explorer.shown == ("other", 2, 3)
    assert len(explorer.client_select.options) == 4


def test_find_runs_and_load_run_read_domains_from_slots(tmp_path):
    run = synthetic_run()
    folder = tmp_path / "study" / "fedx"
    folder.mkdir(parents=True)
    np.savez_compressed(folder / "collaboration.npz", W=run.weights.astype(np.float32))
    (folder / "summary.json").write_text(json.dumps({"config": {"scenario": "not-a-scenario"}}))
    pd.DataFrame([{"slot": t // SLOT, "client": c, "domain": DOMAINS[t, c]} for t in (0, SLOT) for c in range(N)]
                 ).to_csv(folder / "slots.csv", index=False)
    (tmp_path / "study" / "unfinished").mkdir()
    np.savez_compressed(tmp_path / "study" / "unfinished" / "collaboration.npz", W=run.weights)  # no summary
    found = find_runs(tmp_path)
    assert found == {"study/fedx": folder}
    assert find_runs(tmp_path, where=lambda cfg: cfg["scenario"] == "another") == {}
    assert run_name(found, folder) == run_name(found, "study/fedx") == run_name(found) == "study/fedx"
    loaded = load_run(folder, "fedx")
    assert loaded.slot_steps == SLOT and loaded.n_steps == T and loaded.n_clients == N
    assert (loaded.domains == DOMAINS).all()
