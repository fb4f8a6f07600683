"""The workbook figure style: shared colour scales, legends outside the data, error bars from seeds, missing cells."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from ftta_core import plots, style  # noqa: E402


@pytest.fixture(autouse=True)
def _close():
    style.use()
    yield
    plt.close("all")


def _limits(ax):
    return ax.collections[0].get_clim()


def test_collaboration_matrices_share_the_fixed_w_scale_and_one_colour_bar():
    n = 8
    fedavg = np.full((n, n), 1 / n)
    local = np.eye(n)
    fig, axes = style.collaboration_matrices({"Local": local, "FedAvg": fedavg}, groups=[0, 0, 1, 1, 2, 2, 3, 3])
    assert [_limits(ax) for ax in axes] == [style.W_RANGE, style.W_RANGE]
    assert len(fig.axes) == 3  # two panels + one colour bar
    # group boundaries: 3 horizontal + 3 vertical lines per panel
    assert len(axes[0].lines) == 6


def test_heatmaps_share_limits_from_all_matrices():
    _, axes = style.heatmaps({"a": np.array([[0.0, 1.0]]), "b": np.array([[5.0, 2.0]])})
    assert _limits(axes[0]) == _limits(axes[1]) == (0.0, 5.0)


def test_collaboration_heatmap_defaults_to_unit_scale():
    ax = plots.collaboration_heatmap(np.full((4, 4), 0.25))
    assert _limits(ax) == (0.0, 1.0)
    assert _limits(plots.collaboration_heatmap(np.full((2, 2), 3.0), ax=plt.figure().gca(), vmax=None))[1] == 3.0


def test_snapshots_over_time_use_one_scale():
    rng = np.random.default_rng(0)
    w = rng.dirichlet(np.ones(4), size=(5, 4))
    axes = plots.collaboration_snapshots(w, [0, 2, 4])
    assert {_limits(ax) for ax in axes} == {(0.0, 1.0)}


def test_panels_wrap_into_rows_no_wider_than_max():
    fig, axes = style.panels(6)
    assert len(axes) == 6 and fig.get_figwidth() <= style.MAX_WIDTH
    assert len({ax.get_subplotspec().rowspan.start for ax in axes}) > 1


def _grid():
    rng = np.random.default_rng(1)
    return pd.DataFrame([{"x": x, "method": m, "seed": s, "accuracy": 60 + x + rng.normal()}
                         for x in (1, 2, 3) for m in ("a", "b") for s in range(3 if m == "a" else 1)])


def test_legend_outside_the_data():
    fig, ax = plt.subplots()
    plots.accuracy_curve(_grid(), "x", hue="method", ax=ax)
    fig.canvas.draw()
    assert style.legend_is_outside(ax)
    fig2, ax2 = plt.subplots()
    ax2.plot([0, 1], [0, 1], label="in")
    ax2.legend(loc="center")
    fig2.canvas.draw()
    assert not style.legend_is_outside(ax2)


def test_error_bars_only_where_seeds_exist():
    fig, ax = plt.subplots()
    summary = style.errorbar_lines(ax, _grid(), "x", "accuracy", hue="method")
    assert set(summary.loc[summary.method == "a", "n"]) == {3}
    bars = [c for c in ax.containers if c.has_yerr]
    segments = [sum(seg.size > 0 and np.isfinite(seg).all() for seg in c.lines[2][0].get_segments()) for c in bars]
    assert segments == [3, 0]  # method a: 3 seeds at every x, method b: one seed (no bar, open marker)


def test_method_comparison_bars_from_zero_with_seed_counts():
    fig, ax = plt.subplots()
    table = _grid().assign(x=lambda t: t.x.astype(str))
    plots.method_comparison(table, x="x", hue="method", ax=ax)
    assert ax.get_ylim()[0] == 0
    texts = [t.get_text() for t in ax.texts]
    assert any("n=3" in t for t in texts) and any("n=1" in t for t in texts)
    fig.canvas.draw()
    assert style.legend_is_outside(ax)


def test_gains_by_panel_one_shared_panel_per_cell_paper_as_crosses_single_seeds_open():
    table = pd.DataFrame([
        {"tta": "bn", "setting": "niid", "method": "FedAvg", "model": "a", "gain over Local": -2.0, "sd": 0.3, "seeds": 3},
        {"tta": "bn", "setting": "niid", "method": "FedAvg", "model": "b", "gain over Local": -1.0, "sd": np.nan,
         "seeds": 1},
        {"tta": "bn", "setting": "niid", "method": "FedAvg", "model": "paper", "gain over Local": 0.4, "sd": np.nan,
         "seeds": 5},
        {"tta": "bn", "setting": "iid", "method": "FedAvg", "model": "a", "gain over Local": 5.0, "sd": 0.2, "seeds": 3},
    ])
    axes = plots.gains_by_panel(table, ["tta", "setting"], marker_hue="paper", tie=0.5)
    assert [ax.get_title() for ax in axes] == ["bn iid", "bn niid"]
    assert axes[0].get_ylim() == axes[1].get_ylim()  # one scale for every panel
    niid = axes[1]
    crosses = [c for c in niid.collections if c.get_offsets().shape[0] and c.get_offsets().shape[0] == 1
               and c.get_offsets()[0, 1] == 0.4]
    assert len(crosses) == 1 and crosses[0].get_offsets()[0, 1] == pytest.approx(0.4)
    bars = [c for c in niid.containers if getattr(c, "has_yerr", False) and len(c.lines[0].get_ydata())]
    assert [list(c.lines[0].get_ydata()) for c in bars] == [[-2.0]]  # only the 3-seed point has a bar
    open_points = [ln for ln in niid.lines if ln.get_markerfacecolor() == "white" and len(ln.get_ydata())]
    assert [list(ln.get_ydata()) for ln in open_points] == [[-1.0]]
    fig = axes[0].figure
    fig.canvas.draw()
    (key,) = fig.legends  # one key for the figure, below every panel
    renderer = fig.canvas.get_renderer()
    assert not any(key.get_window_extent(renderer).overlaps(ax.get_window_extent(renderer)) for ax in axes)
    assert [t.get_text() for t in key.get_texts()] == ["a (3 seeds)", "b (1 seed)", "paper",
                                                        "open marker: one seed, no bar"]
    every_seeded = plots.gains_by_panel(table[table.model != "b"], ["tta", "setting"], marker_hue="paper")
    (key,) = every_seeded[0].figure.legends  # no open marker drawn: the key does not explain one
    assert [t.get_text() for t in key.get_texts()] == ["a (3 seeds)", "paper"]
    # axes given by the caller: the key goes right of the last one
    _, given = plt.subplots(1, 2, sharey=True, layout="constrained")
    plots.gains_by_panel(table, ["tta", "setting"], marker_hue="paper", tie=0.5, axes=given)
    given[0].figure.canvas.draw()
    assert given[-1].get_legend() is not None and style.legend_is_outside(given[-1])
    in_order = plots.gains_by_panel(table, ["tta", "setting"], marker_hue="paper", sort=False)
    assert [ax.get_title() for ax in in_order] == ["bn niid", "bn iid"]  # as the table first shows them
    # panels per row: a 2-panel table in one column
    stacked = plots.gains_by_panel(table, ["tta", "setting"], marker_hue="paper", ncols=1)
    assert stacked[0].get_position().y0 > stacked[1].get_position().y0


def test_honest_ylim_widens_a_tiny_range():
    fig, ax = plt.subplots()
    ax.plot([0, 1], [72.6, 73.0])
    assert style.honest_ylim(ax, min_span=2.0) == pytest.approx(2.0)
    assert ax.get_ylim()[1] - ax.get_ylim()[0] == pytest.approx(2.0)


def test_leaderboard_heatmap_clips_outlier_and_hatches_missing_row():
    rows = [("bn", s, m) for s, m in (("local", 70.0), ("fedavg", 65.0), ("fedtsa", 72.0))]
    rows += [("tent", s, m) for s, m in (("local", 69.0), ("fedavg", 69.5), ("fedtsa", 20.0))]  # one outlier
    table = pd.DataFrame(rows, columns=["local", "strategy", "mean"]).set_index(["local", "strategy"])
    table["ci95"] = 0.3
    ax = plots.leaderboard_heatmap(table, rows=["bn", "tent", "cotta"], robust=20)
    vmin, vmax = _limits(ax)
    assert vmin > 20.0 and vmax == 72.0  # the outlier does not set the scale
    assert [t.get_text() for t in ax.get_yticklabels()] == ["bn", "tent", "cotta"]
    assert sum(t.get_text() == "not run" for t in ax.texts) == 3


def test_category_key_outside_with_one_entry_per_name():
    fig, ax = plt.subplots()
    plots.scenario_map(ax, np.array([[0, 1, 2], [2, 1, 0]]))
    legend = style.category_key(ax, ["fog", "snow", "frost"], cmap="tab20")
    assert [t.get_text() for t in legend.get_texts()] == ["fog", "snow", "frost"]
    fig.canvas.draw()
    assert style.legend_is_outside(ax)
