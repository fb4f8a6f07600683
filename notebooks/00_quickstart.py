# ---
# jupyter:
#   jupytext:
#     cell_metadata_filter: tags,-papermill
#     formats: ipynb,py:percent
#     notebook_metadata_filter: -jupytext.text_representation.jupytext_version
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 00 · Quickstart: federated test-time adaptation in one minute
#
# A digit classifier trained once on clean digits is deployed on **8 clients**. Every client receives an unlabeled
# stream of batches whose corruption changes every slot (fog, contrast, frost, ...), and clients come in **4 clusters**:
# clients of a cluster see the same corruption at the same time, different clusters see different ones (spatial
# heterogeneity SH = 4/8 = 0.5). Each client adapts on the fly with **BN adaptation** (normalise with the current
# batch's statistics) and uploads its per-layer BN statistics; the server mixes them with a collaboration matrix
# `W` and sends every client its personal mixture.
#
# We compare four ways of building `W`: **Local** (`W = I`, no collaboration), **FedAvg** (uniform), **FedAMP**
# (attention from the distance between clients' feature means) and **pFedGraph** (a per-client quadratic programme
# that trades off similarity and data share). Data: scikit-learn's bundled digits (1,797 real images), no download.

# %% tags=["parameters"]
# smoke=True (or FTTA_SMOKE=1, as CI sets it) runs a few steps only
smoke = False
seed = 0
clients = 8
local = "bn"
strategies = ["local", "fedavg", "fedamp", "pfedgraph"]
corruptions = ["fog", "contrast", "frost", "glass_blur", "impulse_noise", "brightness"]
figure_dir = "../figures"

# %%
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from ftta_core import plots, style, tables
from ftta_core.experiment import ExperimentConfig
from ftta_core.notebooks import output_folder, repository_path, smoke_mode
from ftta_core.workbook import mean_std, run_grid

style.use()
smoke = smoke_mode(smoke)
figure_dir = Path("../runs/smoke") if smoke else output_folder(figure_dir, "00_quickstart")  # ../figures: --in-place
figure_dir.mkdir(parents=True, exist_ok=True)
base = ExperimentConfig(dataset="embedded_digits", scenario="heterogeneity", corruptions=corruptions, severity=5,
                        clients=clients, batch_size=10, images_per_client=100, sh=0.5, th=0.1,
                        local=local, device="auto", seed=seed, max_steps=6 if smoke else None)
print(f"{base.clients} clients, {len(corruptions)} corruptions, batch {base.batch_size}, smoke={smoke}")

# %% [markdown]
# ## Run
# `run_grid` runs one experiment per strategy with the same stream (same seed); each step, every client adapts and
# predicts **before** mixing (`local`) and **after** mixing (`mixed`, the number the papers report).

# %%
grid = run_grid(base, {s: {"strategy": s} for s in strategies}, seeds=[seed], keep=True, progress=False)
table = mean_std(grid, "variant", "accuracy")[["mean"]].rename(columns={"mean": "accuracy after mixing (%)"})
table["accuracy before mixing (%)"] = grid.groupby("variant", sort=False)["accuracy_local"].mean()
table["no adaptation (%)"] = grid.groupby("variant", sort=False)["accuracy_source"].mean()
tables.show(table, caption=f"accuracy (%), seed {seed}; bold: best per column")

# %% [markdown]
# ## Who learns from whom
# Each heatmap is `W` at the last step: row *i* says how much client *i* takes from every client *j*, all four on the
# same [0, 1] colour scale (FedAvg's uniform 1/N is then visibly low, not "maximum"). Clients are ordered by cluster
# (pairs 0-1, 2-3, 4-5, 6-7 share a corruption); white lines separate the clusters.

# %%
results = grid.attrs["results"]
groups = plots.domain_groups(results[(strategies[0], seed)].steps)
fig = plt.figure(figsize=(style.MAX_WIDTH, 6.4), layout="constrained")
top, bottom = fig.subfigures(2, 1, height_ratios=[1.1, 1])
style.collaboration_matrices({s: results[(s, seed)].collaboration[-1] for s in strategies}, groups=groups,
                             axes=top.subplots(1, len(strategies)))
acc_ax = bottom.subplots()
for s in strategies:
    plots.accuracy_per_slot(results[(s, seed)].steps, ax=acc_ax, label=s)
style.legend_outside(acc_ax, title="strategy")
acc_ax.set_title("accuracy after mixing, per slot (each slot: a new corruption per cluster)")
fig.savefig(figure_dir / "quickstart_collaboration.png", dpi=110)
print("figure:", repository_path(figure_dir / "quickstart_collaboration.png"), "(relative to the repository)")

# %% [markdown]
# ## What this shows
# Without adaptation the source model fails under most of these corruptions, and BN adaptation alone recovers much
# of the accuracy (compare the first and last columns of the table). Whether mixing then helps depends on *whom* a
# client mixes with. FedAvg averages the statistics of clients that currently see different corruptions, which blurs
# every client's normalisation and costs accuracy in this spatially heterogeneous setting. A similarity-based matrix
# can instead concentrate its weight on the clients of the same cluster — the 2x2 blocks along the diagonal of the
# FedAMP and pFedGraph heatmaps — and so lose less or gain a little over Local; how much depends on which similarity
# it uses (FedAMP: source-feature means; pFedGraph: the cosine of the clients' updates). The table holds the measured
# numbers of this run; rerun with another `seed` or other `strategies` (papermill `-p`) to see how stable they are.
# The papers' protocols follow in the numbered notebooks.
