"""The workbook figure style: shared colour scales, legends outside the data, error bars from seeds, missing cells."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.colors  # noqa: E402
import matplotlib.container  # noqa: E402
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
    assert set(summary.loc[summary.method == "a", "seeds"]) == {(0, 1, 2)} and set(summary.loc[summary.method == "b",
                                                                                                 "seeds"]) == {(0,)}
    bars = [c for c in ax.containers if c.has_yerr]
    segments = [sum(seg.size > 0 and np.isfinite(seg).all() for seg in c.lines[2][0].get_segments()) for c in bars]
    assert segments == [3]  # method a: 3 seeds at every x; method b: one seed, a line of open markers, no bar
    (b,) = [ln for ln in ax.lines if ln.get_label() == "b"]
    assert b.get_markerfacecolor() == "white" and len(b.get_ydata()) == 3
    handles = dict(zip(*reversed(ax.get_legend_handles_labels())))
    a, b = handles["a"].lines[0], handles["b"]
    assert a.get_color() != b.get_color() and a.get_marker() != b.get_marker()


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
    assert all(ax.get_ylabel() == "gain over Local (points)" for ax in axes)
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
                                                        "open marker: one seed, no bar",
                                                        "±0.5 points: equal within the margin"]
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


def _board():
    rows = [("bn", s, m) for s, m in (("local", 70.0), ("fedavg", 65.0), ("fedtsa", 72.0))]
    rows += [("tent", s, m) for s, m in (("local", 69.0), ("fedavg", 69.5), ("fedtsa", 59.0))]  # the lowest cell
    table = pd.DataFrame(rows, columns=["local", "strategy", "mean"]).set_index(["local", "strategy"])
    table["ci95"], table["seeds"] = 0.3, 3
    table.loc[("tent", "fedtsa"), ["ci95", "seeds"]] = [np.nan, 1]
    return table


def test_leaderboard_heatmap_leaves_out_rows_never_run_on_one_unclipped_scale_with_n_per_cell():
    seed_ids = {k: (0, 1, 2) for k in _board().index}
    seed_ids[("tent", "fedtsa")] = (4,)
    ax = plots.leaderboard_heatmap(_board(), rows=["bn", "tent", "cotta"], seed_ids=seed_ids,
                                   row_labels={"bn": "BN-adapt"})
    vmin, vmax = _limits(ax)
    assert (vmin, vmax) == (59.0, 72.0)  # every cell its own colour: 59.0 and 65.0 differ
    assert [t.get_text() for t in ax.get_yticklabels()] == ["BN-adapt", "tent"]  # cotta: no run, no row
    texts = [t.get_text() for t in ax.texts]
    assert not any("not run" in t for t in texts)
    assert "70.0\n±0.3\nn=3" in texts and "59.0\nn=1" in texts  # n per cell; no interval from one seed
    assert ax.get_ylabel() and ax.get_xlabel().startswith("strategy")
    assert "not shown, no stored run: cotta" in ax.get_xlabel()
    assert "n=3: seeds 0, 1, 2 (5 cells)" in ax.get_xlabel() and "n=1: seed 4 (tent + fedtsa)" in ax.get_xlabel()
    assert "not clipped" in ax.collections[0].colorbar.ax.get_ylabel()
    clipped = plots.leaderboard_heatmap(_board(), ax=plt.figure().gca(), robust=20)
    assert _limits(clipped)[0] > 59.0 and "clipped" in clipped.collections[0].colorbar.ax.get_ylabel()


def test_leaderboard_wrapper_names_rows_and_the_seeds_of_its_grid():
    from studies.leaderboard import leaderboard_heatmap

    grid = pd.DataFrame([{"local": lo, "strategy": st, "seed": s, "accuracy": 60.0 + s}
                         for lo in ("bn", "tent") for st in ("local", "fedavg") for s in (0, 1)])
    from studies.leaderboard import leaderboard_table

    ax = leaderboard_heatmap(leaderboard_table(grid), rows=["bn", "tent", "cotta"], grid=grid)
    assert [t.get_text() for t in ax.get_yticklabels()] == ["BN-adapt (TTA-bn)", "Tent (TTA-grad)"]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["FedAvg", "Local"]
    assert "n=2: seeds 0, 1" in ax.get_xlabel() and "CoTTA" in ax.get_xlabel()


def test_seed_text_names_the_seeds_not_a_count():
    assert style.seed_text([2, 0, 1, 1]) == "seeds 0, 1, 2"
    assert style.seed_text((4,)) == "seed 4" and style.seed_text({3}) == "seed 3"
    assert style.seed_text(np.nan) == "no seed" and style.seed_text([0, 1], prefix=False) == "0, 1"


def test_distinct_colours_and_markers_never_repeat_within_ten_series():
    looks = style.distinct(10)
    assert len({c for c, _ in looks}) == 10 and len({m for _, m in looks}) == 10
    assert [c for c, _ in looks[:7]] == list(style.DISTINCT[:7])


def test_interval_lines_say_what_the_bars_are_and_which_seeds():
    fig, ax = plt.subplots()
    one_seed = _grid()[lambda t: t.seed == 0]
    style.interval_lines(ax, one_seed, "x", "accuracy", hue="method", key_title="method")
    legend = ax.get_legend()
    assert "one seed per point: no interval" in legend.get_title().get_text()
    assert [t.get_text() for t in legend.get_texts()] == ["a (seed 0)", "b (seed 0)"]
    fig2, ax2 = plt.subplots()
    drawn = style.interval_lines(ax2, _grid(), "x", "accuracy", hue="method")
    title = ax2.get_legend().get_title().get_text()
    assert "95 % t interval" in title and "open marker: one seed" in title
    a = drawn[drawn.method == "a"].iloc[0]
    from ftta_core import stats

    assert a["ci95"] == pytest.approx(stats.t_half_width(a["sd"], 3))
    (bar,) = [c for c in ax2.containers if c.has_yerr]
    low, high = bar.lines[2][0].get_segments()[0][:, 1]
    assert (high - low) / 2 == pytest.approx(a["ci95"])  # the bar is the 95 % interval, not 1 sd
    mixed = _grid()[lambda t: ~((t.method == "a") & (t.x == 3) & (t.seed > 0))]
    fig3, ax3 = plt.subplots()
    style.interval_lines(ax3, mixed, "x", "accuracy", hue="method")
    assert {t.get_text() for t in ax3.texts} == {"0, 1, 2", "0"}  # a's seeds differ between points: each says its own


def test_gains_by_panel_marks_an_outlier_off_scale_draws_the_margin_and_names_seeds():
    table = pd.DataFrame([{"setting": "NIID", "method": m, "numbers": "ours", "gain over Local": g, "ci95": 1.0,
                           "seeds": 3, "seed ids": (0, 1, 2)}
                          for m, g in (("FedAvg", 4.0), ("FedProx", 3.5), ("FedAvgM", -33.0), ("FedTSA", 7.0))])
    table = pd.concat([table, table.assign(numbers="paper", ci95=np.nan, **{"gain over Local": 5.0})])
    (ax,) = plots.gains_by_panel(table, ["setting"], hue="numbers", err="ci95", marker_hue="paper", tie=0.5,
                                 clip_outliers=True, err_label="bar: 95 % interval")
    lo, hi = ax.get_ylim()
    assert lo > -10 and hi < 12  # FedAvgM's -33 does not set the scale
    assert any("-33.0 [-34.0, -32.0]" in t.get_text() and "off scale" in t.get_text() for t in ax.texts)
    spans = [p for p in ax.patches if p.get_facecolor()[:3] == matplotlib.colors.to_rgb(style.MARGIN_COLOR)]
    assert len(spans) == 1 and spans[0].get_alpha() >= 0.5  # the margin band, visible
    (key,) = ax.figure.legends
    labels = [t.get_text() for t in key.get_texts()]
    assert "ours (seeds 0, 1, 2)" in labels and "±0.5 points: equal within the margin" in labels
    assert "off the y-range drawn (its value beside it)" in labels
    varied = table.copy()
    varied.loc[(varied.numbers == "ours") & (varied.method == "FedTSA"), "seed ids"] = [(0,)]
    (ax2,) = plots.gains_by_panel(varied, ["setting"], hue="numbers", err="ci95", marker_hue="paper",
                                  group="setting")
    assert {"0, 1, 2", "0"} <= {t.get_text() for t in ax2.texts}  # each point names its seeds
    assert "ours (seeds under each point)" in [t.get_text() for t in ax2.figure.legends[0].get_texts()]


def test_gains_by_panel_shows_an_interval_narrower_than_its_marker():
    """A 95 % interval of +-0.1 point sits inside a marker: its bar is drawn over the marker and its caps reach
    beyond the marker's edge, so the figure still shows that it has one."""
    table = pd.DataFrame([{"setting": "NIID", "method": m, "numbers": "ours", "gain over Local": g, "ci95": 0.1,
                           "seeds": 3, "seed ids": (0, 1, 2)} for m, g in (("FedAvg", -3.5), ("FedTSA", 12.0))])
    (ax,) = plots.gains_by_panel(table, ["setting"], hue="numbers", err="ci95")
    (bars,) = [c for c in ax.containers if isinstance(c, matplotlib.container.ErrorbarContainer)]
    data_line, caps, (stems,) = bars.lines[0], bars.lines[1], bars.lines[2]
    assert caps and all(cap.get_markersize() > data_line.get_markersize() for cap in caps)
    assert stems.get_zorder() > data_line.get_zorder() and all(c.get_zorder() > data_line.get_zorder() for c in caps)


def test_interval_dots_start_near_the_data_with_intervals_and_seeds_per_row():
    rows = [{"variant": v, "setting": st, "seed": s, "accuracy": base + 0.1 * s}
            for v, base, seeds in (("FedTSA", 72.0, range(5)), ("S-sim", 65.5, range(3)), ("solo", 70.0, [7]))
            for st in ("NIID", "IID") for s in seeds]
    fig = plots.interval_dots(pd.DataFrame(rows), "variant", panel="setting", title="variants")
    ax = fig.axes[0]
    assert ax.get_xlim()[0] > 60 and ax.get_xlabel() == "accuracy (%)"
    assert [t.get_text() for t in ax.get_yticklabels()] == ["FedTSA", "S-sim", "solo"]
    texts = [t.get_text() for t in ax.texts]
    assert any(t.endswith("seeds 0, 1, 2, 3, 4") for t in texts) and any(t.endswith("seed 7") for t in texts)
    assert "95 % t interval" in fig._suptitle.get_text() and "not at 0" in fig._suptitle.get_text()


def test_sweep_figure_shares_one_y_scale_and_states_single_seeds():
    sh = pd.DataFrame([{"variant": v, "seed": 0, "sh": x, "accuracy": 70 + x + k} for k, v in enumerate(["fedavg",
                       "fedtsa"]) for x in (0.2, 0.5)])
    th = sh.rename(columns={"sh": "th"})
    fig = plots.sweep_figure([(sh, "sh", "SH"), (th, "th", "TH")], labels={"fedavg": "FedAvg", "fedtsa": "FedTSA"},
                             log_x=["th"])
    left, right = fig.axes[:2]
    assert left.get_ylim() == right.get_ylim() and right.get_xscale() == "log"
    assert left.get_ylabel() == "accuracy (%)" and left.get_xlabel() == "sh"
    key = right.get_legend()
    title = key.get_title().get_text()
    assert "one seed per point: no interval" in title and "±1 sd" not in title
    assert [t.get_text() for t in key.get_texts()] == ["FedAvg (seed 0)", "FedTSA (seed 0)"]


def test_participation_figure_distinct_colours_readable_names_and_seeds():
    from studies.leaderboard import participation_figure

    rates = pd.DataFrame([{"variant": v, "seed": 0, "participation": p, "accuracy": 60 + k + p}
                          for k, v in enumerate(["local", "fedavg", "fedavgm", "fedamp", "pfedgraph", "fedtsa",
                                                 "fedctta"]) for p in (0.2, 1.0)])
    ax = participation_figure(rates)
    texts = [t.get_text() for t in ax.get_legend().get_texts()]
    assert texts[:2] == ["Local (seed 0)", "FedAvg (seed 0)"] and all("seed 0" in t for t in texts)
    assert len({ln.get_color() for ln in ax.lines}) == 7 and len({ln.get_marker() for ln in ax.lines}) == 7
    assert ax.get_xlabel().startswith("participation rate") and ax.get_ylabel() == "accuracy (%)"


def _cells():
    """Rows as ``table1.tta_grad_cells`` gives them, two step sizes and two source models."""
    rows = []
    for model in ("shipped", "resnet8_cifar10_e1_n10000"):
        for lr, seeds in ((1e-5, (0, 1, 2, 3, 4)), (3e-4, (0,))):
            rows.append({"cell": "grad-running-adam", "optimizer": f"adam {lr:g}", "lr": lr, "setting": "niid",
                         "model": model, "seeds": len(seeds), "local - local(bn)": -lr * 1e4,
                         "local - local(bn) ci95": 0.3 if len(seeds) > 1 else np.nan,
                         "paper: local - local(bn)": -7.56, "FedAvg - local": lr * 1e4,
                         "FedAvg - local ci95": 0.2 if len(seeds) > 1 else np.nan, "paper: FedAvg - local": 5.03,
                         "local - local(bn) seed ids": seeds, "FedAvg - local seed ids": seeds[:3]})
    return pd.DataFrame(rows)


def test_step_size_figure_names_the_seeds_of_every_point_and_its_source_models():
    from studies.fedtsa.table1 import step_size_figure

    fig = step_size_figure(_cells())
    ax = fig.axes[0]
    texts = [t.get_text() for t in ax.texts]
    assert texts.count("0, 1, 2, 3, 4") == 2 and texts.count("0, 1, 2") == 2 and texts.count("0") == 4
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert not any("resnet8" in t for t in labels)  # no checkpoint id: the card's recipe
    assert any("1 epoch on 10,000 images" in t for t in labels) and any("shipped: 15 epochs" in t for t in labels)
    assert ax.get_xlabel() and ax.get_ylabel() and fig._supxlabel is None  # one font size for both axis labels
    assert "seeds of each point" in fig.legends[0].get_title().get_text()


def test_grad_drift_figure_keeps_an_outlier_off_scale_with_the_margin_and_the_seeds():
    from studies.fedtsa.table1 import grad_drift_figure

    gains = pd.DataFrame([{"setting": st, "method": m, "paper": 5.0, "ours": g, "low": g - 1, "high": g + 1,
                           "seeds": 3} for st in ("niid", "iid")
                          for m, g in (("FedAvg", 4.0), ("FedAvgM", -33.0), ("FedAMP", 5.0), ("FedTSA", 7.0))])
    runs = pd.DataFrame([{"setting": st, "strategy": s, "seed": seed} for st in ("niid", "iid")
                         for s in ("local", "fedavg", "fedavgm", "fedamp", "fedtsa") for seed in (0, 1, 2)])
    fig = grad_drift_figure(gains, runs, lr=3e-4)
    ax = fig.axes[0]
    assert ax.get_ylim()[0] > -10 and any("off scale" in t.get_text() for t in ax.texts)
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "ours, Adam 3e-4 (seeds 0, 1, 2)" in labels and "±0.5 points: equal within the margin" in labels
    assert "over clients adapting alone" in fig._suptitle.get_text()


def test_conclusions_figure_two_panels_readable_model_names_seeds_per_point():
    from studies.fedtsa.source_regime import PAPER_T1_LABEL, conclusions_figure

    rows = []
    for setting in ("niid", "iid"):
        for tta in ("bn", "grad-running-adam"):
            for model, seeds in (("resnet8_cifar10", (0, 1, 2)), ("resnet8_cifar10_e1_n10000", (0,))):
                rows.append({"tta": tta, "setting": setting, "method": "FedAvg", "model": model,
                             "gain over Local": 1.0, "sd": 0.5 if len(seeds) > 1 else np.nan, "seeds": len(seeds),
                             "same sign": True, "seed ids": seeds})
            rows.append({"tta": tta, "setting": setting, "method": "FedAvg", "model": PAPER_T1_LABEL,
                         "gain over Local": 2.0, "sd": np.nan, "seeds": 5, "same sign": None, "seed ids": np.nan})
    fig = conclusions_figure(pd.DataFrame(rows), [("bn", None), ("grad-running-adam", None)])
    panels = [ax for ax in fig.axes if ax.get_title()]
    assert [ax.get_title() for ax in panels] == ["NIID clients", "IID clients"]
    assert {"TTA-bn", "gradient TTA, Adam 1e-5"} <= {t.get_text() for t in panels[0].texts}  # the groups
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert not any("resnet8" in t for t in labels)
    assert any(t.startswith("shipped: 15 epochs") and "seeds 0, 1, 2" in t for t in labels)


def test_temperature_curve_key_in_words_with_seeds():
    from ftta_core.variants import with_factors
    from studies.pfedbbn.temperature import (SCALE_LABELS, curve_figure, reference_variants, setting_name,
                                             temperature_variants)

    rows = [(t, sc, (0, 1, 2) if t == 1 else (0,)) for t in (1.0, 2.0) for sc in ("none", "row_median")]
    grid = pd.DataFrame([{"alpha": 0.1, "variant": setting_name(t, sc), "seed": s, "accuracy": 60 + t + s,
                          "self": 0.5, "same domain": 0.3, "uniform same-domain": 0.2} for t, sc, seeds in rows
                         for s in seeds])
    grid = pd.concat([grid, pd.DataFrame([{"alpha": 0.1, "variant": "BBN alone", "seed": s, "accuracy": 61.0}
                                          for s in (0, 1, 2)])], ignore_index=True)
    grid = with_factors(grid, {**temperature_variants([1.0, 2.0]), **reference_variants()})  # T, scale: the factors
    fig = curve_figure(grid)
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert SCALE_LABELS["none"] in labels and SCALE_LABELS["row_median"] in labels
    assert "none" not in labels and "row_median" not in labels
    assert "BBN alone (seeds 0, 1, 2)" in labels
    assert "0, 1, 2" in [t.get_text() for t in fig.axes[1].texts]  # the seeds under the x axis
    assert all(ax.get_ylabel() for ax in fig.axes[:2]) and fig.axes[1].get_xlabel() == "softmax temperature T"


def test_fedacross_caption_says_whether_adapted_curves_are_above_or_below_no_adaptation():
    from studies.fedacross.study import accuracy_vs_k_figure, against_g_caption

    def per_seed(shift):
        return pd.DataFrame([{"k": k, "selection": sel, "seed": s, "accuracy": 40 + (shift if k else 0) + 0.1 * s}
                             for k in (0, 3, 5) for sel in (["none"] if k == 0 else ["random", "vessal"])
                             for s in (0, 1, 2)])

    assert against_g_caption(per_seed(-5)).startswith("Every adapted point (4 of 4: k x selection) is below g")
    assert against_g_caption(per_seed(+5)).startswith("Every adapted point (4 of 4: k x selection) is above g")
    mixed = per_seed(-5)
    mixed.loc[mixed.selection == "random", "accuracy"] += 10
    assert against_g_caption(mixed).startswith("Of the 4 adapted points (k x selection), 2 are")
    ax = accuracy_vs_k_figure(per_seed(-5))
    assert "is below g" in ax.figure._supxlabel.get_text()
    assert ax.get_xlabel() and ax.get_ylabel()
    assert all("seeds 0, 1, 2" in t.get_text() for t in ax.get_legend().get_texts())


def test_category_key_outside_with_one_entry_per_name():
    fig, ax = plt.subplots()
    plots.scenario_map(ax, np.array([[0, 1, 2], [2, 1, 0]]))
    legend = style.category_key(ax, ["fog", "snow", "frost"], cmap="tab20")
    assert [t.get_text() for t in legend.get_texts()] == ["fog", "snow", "frost"]
    fig.canvas.draw()
    assert style.legend_is_outside(ax)
