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
# # 20 · FedCTTA: collaboration from the clients' outputs on noise probes
#
# **Paper:** Rajib et al., *FedCTTA: A Collaborative Approach to Continual Test-Time Adaptation in Federated
# Learning*. Each client adapts locally (TTA-bn: batch statistics; TTA-grad: entropy minimisation), then:
#
# 1. **probes** — M = 64 uniform-noise images `z_m`, one set shared by every client (drawn from a seed per step);
# 2. **statistic** — each client's mean logits on them, `mu_i = 1/M sum_m f_theta_i(z_m)` (Eq. 6): K = 10 floats;
# 3. **similarity** — `D_ij = -||mu_i - mu_j||_2` (Eq. 5);
# 4. **W** — `W_i. = softmax_j(D_ij)` (Eq. 7), and the server mixes `theta_i <- sum_j W_ij theta_j`.
#
# No server training and nothing kept between rounds (the reference code's EMA of `mu` is an option). This notebook
# opens one round on a small stream of the embedded digits, reads the CIFAR-10-C Table I runs stored so far, shows the
# measured server cost against FedTSA, and runs the Table IV and Fig. 5 ablations on the digits. Implementation:
# `ftta_core/strategies/fedctta.py`; helpers in `studies/fedctta/` (`study.py`, `tables.py`, `server_cost.py`),
# `paper.py`, `plots.py`.

# %% tags=["parameters"]
# smoke=True (or FTTA_SMOKE=1) runs a few steps and a subset of each grid
smoke = False
seed = 0
seeds = [0]
clients = 8
images_per_client = 60
slot_steps = 6
results_dir = "../figures/fedtsa_table1/runs"
cifar_seeds = [0, 1, 2, 3, 4]
case_study_dir = "../figures/case_study/cifar10_bn_fedctta"  # python -m ftta_core study fedtsa case-study --orders fedctta
server_cost_json = "../benchmarks/results/server_cost_cpu.json"
sweep_dir = "../figures/fedtsa_ablations/runs"  # Fig 2's runs, shared with 11_fedtsa_ablations (its Fig 4)
sweep_seeds = [0]
sh_values = [0.05, 0.2, 0.5, 0.75]
th_values = [0.01, 0.02, 0.05, 0.1]
compute_sweeps = False  # True: run Fig 2's missing CIFAR-10-C runs here (or plan them: FTTA_PLAN, README)
compute_claims = False  # True: run the claims' missing Table 1 runs (cifar_seeds) here (or plan them: FTTA_PLAN)
# the reference clients' cell at a larger Adam step (notebook 10's step-size section; its runs are planned)
drift_lr = 3e-4

# %%
import json
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch
from IPython.display import Markdown, display

from ftta_core.training import source_model_line
from ftta_core import plots, style, tables
from ftta_core.loop import Engine
from ftta_core.experiment import ExperimentConfig, build_stream
from studies.fedctta.study import (Variant, batch_size_variants, case_study_order, clean_probe_images,
                                     cluster_groups, distance_contrast, fedctta_round, interval_variants, live_grid,
                                     probe_temperature_grid, probe_temperature_reading, reading, split_table4,
                                     table4_variants, temperature_variants)
from ftta_core.notebooks import smoke_mode
from studies.paper import METHOD_LABELS, TTA_SETTINGS, beside_per_corruption, paper_table
from studies.fedctta.tables import beside_fedctta_table1, beside_fedctta_table4, beside_fedctta_table3
from studies.fedtsa.table1 import missing_table1_runs, stored_table1_runs, table1_config
from studies.fedctta.server_cost import scaling_table
from ftta_core.strategies import build_strategy
from ftta_core.training import load_source_model
from ftta_core.tta import build_local
from ftta_core.workbook import (group_weight_shares, heterogeneity_sweep, per_domain_table, read_stored,
                               stored_summaries, summary_config)
from studies.readings import sweep_reading
from studies.fedctta.clusters import (MEET_SLOT, cluster_reading, cluster_table, departure_reading,
                                        uniform_departure)
from ftta_core.scenarios import CASE_STUDY_GROUPS

torch.set_num_threads(1)
style.use()
smoke = smoke_mode(smoke)
seeds = seeds[:1] if smoke else seeds
cfg = ExperimentConfig(dataset="embedded_digits", scenario="heterogeneity", clients=clients, sh=0.5,
                       corruptions=["fog", "contrast", "frost", "glass_blur", "impulse_noise", "brightness"],
                       images_per_client=images_per_client, slot_steps=slot_steps, local="bn", device="cpu",
                       seed=seed, max_steps=slot_steps if smoke else None)
stream = build_stream(cfg)
n_steps = cfg.max_steps or len(stream)
groups = cluster_groups(stream.scenario.domain_map)
print(f"{clients} clients in {len(groups)} clusters {list(groups.values())}, {n_steps} steps of batch "
      f"{cfg.batch_size}, slots of {stream.scenario.slot_steps} steps; seeds {seeds}")

# %% [markdown]
# ## One FedCTTA round, opened up (TTA-bn)
# FedCTTA runs on the stream; at the last step the server's computation is redone in the open from the clients'
# uploads: the probes (three of the 64 shown), each client's mean logits on them, the distances and W. The engine's
# own W at that step is compared with the recomputed one.

# %%
engine = Engine(load_source_model(cfg.model_name), build_local("bn"), build_strategy("fedctta", seed=seed), clients,
                "vectorized")
walk_results = [engine.step(stream.batch(t)) for t in range(n_steps - 1)]
opened = fedctta_round(engine, stream.batch(n_steps - 1))
names = [f"{i}:{stream.scenario.domain_names[d][:6]}" for i, d in enumerate(opened.domains)]
print("engine W == recomputed W:", np.allclose(opened.engine_weights, opened.weights.numpy(), atol=1e-6))

client_group = plots.domain_groups(stream.scenario.domain_map)
fig = plt.figure(figsize=(style.MAX_WIDTH, 7.6), layout="constrained")
top, bottom = fig.subfigures(2, 1, height_ratios=[0.55, 1])
for k, ax in enumerate(top.subplots(1, 3)):
    ax.imshow(opened.probes[0, k].permute(1, 2, 0).numpy())
    ax.set_title(f"probe {k}")
    ax.axis("off")
axes = bottom.subplots(1, 3)
plots.collaboration_heatmap(opened.statistics.numpy(), ax=axes[0], title="mean logits on the probes", vmin=None,
                            vmax=None, cbar_label="mean logit", cmap="rocket")
axes[0].set(xlabel="class", ylabel="client")
axes[0].set_yticks(np.arange(len(names)) + 0.5, names, rotation=0)
plots.collaboration_heatmap(opened.distances.numpy(), ax=axes[1], title="||mu_i - mu_j||", labels=names, vmin=0,
                            vmax=None, groups=client_group, cbar_label="distance", cmap="rocket_r")
plots.collaboration_heatmap(opened.weights.numpy(), ax=axes[2], title="W = softmax(-distance)", labels=names,
                            groups=client_group)

# %% [markdown]
# ## The collaboration matrix over rounds, and client 0 over time
# Same stream and run. Clients in one cluster see the same corruption at every step; FedCTTA's W favours them only
# if their probe statistics are closer to each other than to other clusters' *and* the softmax of the negative
# distances is sharp enough to turn that into weight (the paper's Fig. 3 and 4, there on CIFAR-10-C with 10 clients in
# 3 groups). Below: Local and FedAvg on the same stream, the mean distances within and across clusters at the opened
# step, and how each client splits its weight between itself, its cluster and the other clusters.

# %%
W = np.stack([r.weights for r in walk_results] + [opened.engine_weights])
shown = sorted({0, *range(stream.scenario.slot_steps - 1, n_steps, stream.scenario.slot_steps), n_steps - 1})[:6]
plots.collaboration_snapshots(W, shown, groups=client_group)
fig, ax = plt.subplots(figsize=(style.MAX_WIDTH, 3))
plots.collaboration_over_time(W, 0, ax=ax, slot_steps=stream.scenario.slot_steps, groups=client_group)

steps_done = walk_results + [opened.result]
runs = {}  # live runs already done (config, strategy, parameters) -> accuracies, shared by the grids below
refs = live_grid(cfg, {"local": Variant("local"), "fedavg": Variant("fedavg")}, [seed], cache=runs)
refs = refs.set_index("variant")["accuracy"]
walk = {"Local": refs["local"], "FedAvg": refs["fedavg"],
        "FedCTTA": 100 * sum(r.correct_mixed.sum() for r in steps_done) / sum(r.n.sum() for r in steps_done)}
shares = group_weight_shares(W, groups)
contrast = distance_contrast(opened.distances.numpy(), groups)
display(tables.show(pd.DataFrame({"accuracy after mixing (%)": walk})))
print("mean distance at the opened step, within / across clusters:", {k: round(v, 2) for k, v in contrast.items()})
display(tables.show(shares, digits=3, best=None))

# %% [markdown]
# ## Table I: CIFAR-10-C, stored runs beside the paper
# `python -m ftta_core study fedtsa table --tta bn|grad --strategies ... --results figures/fedtsa_table1/runs` runs the
# protocol (20 clients, batch 10, 500 images per client and corruption, severity 5, NIID = 4 clusters SH = 0.2 and
# IID) and stores one summary per run. This cell reads what is stored (it runs nothing) and lays it beside FedCTTA's
# Table I (`paper_*`) and FedTSA's Table 1 (`fedtsa_paper_mean`): the two papers report different numbers for the
# same methods and protocol (compare the No-Adapt rows; see the comments in `data/paper_numbers/fedctta_table1.csv`).
# Our TTA-grad setting is FedTSA's (SGD lr 1e-4); FedCTTA's paper used lr 1e-5.

# %%
table1_strategies = ["local", "fedavg", "fedavg_ft", "fedprox", "fedavgm", "moon", "pfedsd", "pfedgraph", "ldawa",
                     "fedtsa", "fedctta"]
table1 = stored_table1_runs(results_dir, table1_strategies, cifar_seeds)
for tta in ("bn", "grad"):
    found = table1[table1.tta == tta]
    print(f"TTA-{tta}: {len(found)} stored runs")
    if len(found):
        display(tables.show(beside_fedctta_table1(found, "cifar10", tta, table1_strategies)))
missing = missing_table1_runs(table1, table1_strategies, cifar_seeds)
print(f"still missing: {len(missing)} of {4 * len(table1_strategies)} (tta, setting, method) rows lack some of "
      f"seeds {cifar_seeds}")
display(tables.show(missing, best=None))

# %% [markdown]
# ## Table I's claims with the reference clients' probes, and FedAvgM's two momentum variants
# The reference clients compute FedCTTA's probe logits in eval mode: normalised with the previous aggregation's
# statistics under TTA-bn and with the client's running statistics under TTA-grad (`probe_bn="eval"`; running BN is
# the `grad-running-adam` cell of notebook 10). The "reference code" rows add the rest of the reference code's probe
# handling, which the paper does not state: each client its own fresh probe noise every step and an EMA (0.9) of W
# (`probe_bn="eval", probes="per_client", ema=0.9`). FedAvgM's server momentum on every shared tensor (our default)
# or on parameters only, which under TTA-bn is FedAvg by construction. Runs planned in
# `figures/fedctta/fidelity.plan.jsonl` (`python -m ftta_core run-plan FILE --workers 2 --threads 1`); each row is one
# claim, ours paired by seed with its 95 % interval beside the paper's difference, with the verdict of the pre-stated
# rule (`ftta_core.stats`, docs/statistics.md: 'holds' needs the interval on the paper's side and within 0.5 points of
# its size, or inside +-0.5 for a tie; fewer than 3 seeds is 'undetermined'), the former rule's verdict, and the
# cell's class (the drift step is post hoc); a row whose two sides are equal at every seed holds by construction and
# is not counted; rows without stored runs say so. The runs the claims read are `fidelity.claim_grids()`:
# `-p compute_claims=True` runs the missing ones for `cifar_seeds`, and with `FTTA_PLAN=FILE` only plans them (the
# plan file above was extended this way with seeds 0-2, then 3-4).

# %%
from studies import fidelity
from ftta_core.workbook import run_grid

if compute_claims and not smoke:
    for claim_seeds in ([s for s in cifar_seeds if s < 3], [s for s in cifar_seeds if s >= 3]):
        for tta, setting, lr, variants in fidelity.claim_grids():
            run_grid(table1_config("cifar10", setting, tta, lr=lr), variants, claim_seeds, results_dir=results_dir)

claims = pd.DataFrame(fidelity.fedctta_claims(results_dir) + fidelity.fedavgm_claims(results_dir))
display(tables.show(claims.set_index(["cell class", "claim", "settled by"])[fidelity.CLAIM_COLUMNS], best=None))
display(Markdown(fidelity.claims_reading(claims)))

# %% [markdown]
# Each probe normalisation against FedAvg under TTA-bn, paired by seed, with W's mean shares where the stored runs
# kept them (older summaries did not). In eval mode every client normalises the shared probes with the statistics of
# the last mix; the case study's W (Figs. 3-4 below) and the digits curve at the end of this notebook show what W then
# does.

# %%
probe_contrast = fidelity.fedctta_probe_contrast(results_dir, seeds=cifar_seeds)
display(tables.show(probe_contrast.set_index(["setting", "FedCTTA"]), best=None))
display(Markdown(fidelity.probe_contrast_reading(probe_contrast)))

# %% [markdown]
# The same under TTA-grad as the reference clients ran it (running BN statistics, Adam 1e-5; notebook 10's
# `grad-running-adam` cell), against Local (NIID for every probe normalisation; IID, Table I's other column, for the
# reference clients' two): there the server mixes the whole state, running statistics included, so a W near uniform
# mixing behaves like FedAvg in that cell (FedAvg − Local is in the claims table above and in notebook 10, with the
# contrast that averages or keeps the running statistics).

# %%
grad_contrast = fidelity.fedctta_probe_contrast(results_dir, settings=("niid", "iid"), seeds=cifar_seeds,
                                                tta="grad-running-adam", against="local")
display(tables.show(grad_contrast.set_index(["setting", "FedCTTA"]), best=None))
display(Markdown(fidelity.probe_contrast_reading(grad_contrast)))

# %% [markdown]
# The same FedCTTA runs against FedAvg in that cell (uniform mixing of the whole state), paired by seed: how far
# FedCTTA's learned W lands from uniform mixing in accuracy.

# %%
grad_vs_fedavg = fidelity.fedctta_probe_contrast(results_dir, settings=("niid", "iid"), seeds=cifar_seeds,
                                                 tta="grad-running-adam", against="fedavg")
display(tables.show(grad_vs_fedavg.set_index(["setting", "FedCTTA"])[["against", "difference", "low", "high", "seeds",
                                                                     "comparison", "stale runs"]], best=None))
display(Markdown(fidelity.probe_contrast_reading(grad_vs_fedavg)))

# %% [markdown]
# The paper's TTA-grad Local is below its TTA-bn Local; notebook 10's step-size section reads the same cell at larger
# Adam steps, where our Local can drift too. At `drift_lr` the first line below says, from the stored runs, how far
# Local(grad) falls and what FedAvg gains there; then the same FedCTTA (the reference code's handling) at that step,
# against Local and against FedAvg, paired by seed (runs planned in `figures/fedtsa_table1/step_size.plan.jsonl`):

# %%
from studies.fedtsa.table1 import degraded_local_reading, tta_grad_cells

display(Markdown(degraded_local_reading(tta_grad_cells(results_dir=results_dir, seeds=cifar_seeds,
                                                       cells=["grad-running-adam"], lrs=[drift_lr]))))
drift = pd.concat([fidelity.fedctta_probe_contrast(results_dir, settings=("niid", "iid"), seeds=cifar_seeds,
                                                   tta="grad-running-adam", against=against, lr=drift_lr)
                   for against in ("local", "fedavg")], ignore_index=True)
drift = drift[drift.seeds > 0]
if len(drift):
    display(tables.show(drift.set_index(["setting", "FedCTTA", "against"])[["difference", "low", "high", "seeds",
                                                                            "comparison", "stale runs", "W self",
                                                                            "W same domain",
                                                                            "W uniform same-domain"]], best=None))
    display(Markdown(f"Adam {drift_lr:g}:\n" + fidelity.probe_contrast_reading(drift)))
else:
    print(f"no FedCTTA run at Adam {drift_lr:g} paired with Local or FedAvg is stored yet")

# %% [markdown]
# ## Table II: CIFAR-10-C per corruption, IID, TTA-bn
# Per-corruption accuracy of the stored IID TTA-bn runs, beside FedCTTA's Table II (its CIFAR-10-C rows), over the
# seeds every method has a per-corruption run for (only summaries written since commit 159d4e0, 2026-11-22, carry
# per-corruption numbers), so every difference between rows compares the same seeds (the No-Adapt row counts one
# entry per distinct run, CPU and GPU runs of one seed included).
# The paper's source model scores 30.5% without adaptation, ours is named below (from the runs' config): compare each
# method's gap to FedAvg, not the absolute values.

# %%
table2_methods = ["local", "fedavg", "pfedgraph", "fedtsa", "fedctta"]
iid_bn = table1_config("cifar10", "iid", "bn")
print(source_model_line(iid_bn.model_name))
table2_runs = stored_summaries(iid_bn, {s: {"strategy": s} for s in table2_methods}, cifar_seeds, results_dir)
# differences between rows are only meaningful over the same seeds: keep the seeds every method has a run for
table2_seeds = sorted(set.intersection(*[{seed for (v, seed) in table2_runs if v == s} for s in table2_methods]))
print(f"seeds with a stored per-corruption run of every method: {table2_seeds}")
table2 = per_domain_table({k: v for k, v in table2_runs.items() if k[1] in table2_seeds})
if table2.empty:
    print("no stored IID TTA-bn runs with per-corruption numbers yet")
else:
    display(tables.show(table2.rename(index=lambda s: METHOD_LABELS.get(s, s))))
display(tables.show(beside_per_corruption(table2, "fedctta_table2", dataset="cifar10")))

# %% [markdown]
# ## Table III: the 10-client case study with the paper's orders (TTA-bn)
# Clients 1-4 walk the corruptions in order, clients 5-7 the same walk four corruptions ahead (from Glass blur),
# clients 8-10 in reverse; 500 images per client and corruption, batch 10. This cell reads the runs stored by
# `python -m ftta_core study fedtsa case-study --orders fedctta --strategies local fedavg pfedgraph fedtsa fedctta --out
# figures/case_study/cifar10_bn_fedctta` (stored runs are reused, so adding a strategy runs only that one). Rows:
# accuracy of all ten clients per slot, ours and the paper's; the mean is over the slots both have.

# %%
# FedCTTA as the reference clients normalise the probes (eval mode: under TTA-bn the last aggregation's statistics),
# with the paper's shared noise and no EMA; and as the reference code runs it (each client its own noise, EMA 0.9)
CASE_VARIANTS = {"fedctta@probe_bn=eval": "FedCTTA, eval-mode probes",
                 "fedctta@probe_bn=eval,probes=per_client,ema=0.9": "FedCTTA, the reference code's probes"}
case_label = lambda s: CASE_VARIANTS.get(s, METHOD_LABELS.get(s, s))  # noqa: E731
all_case_runs = read_stored(Path(case_study_dir), ["local", "fedavg", "pfedgraph", "fedtsa", "fedctta", *CASE_VARIANTS])
case_runs = {s: r for s, r in all_case_runs.items() if s not in CASE_VARIANTS}
if case_runs:
    display(tables.show(beside_fedctta_table3(case_runs)))
else:
    print(f"no stored case study under {case_study_dir}: run the command above")

# %% [markdown]
# The same table with FedCTTA's probes handled as the reference clients do standing in FedCTTA's row: eval mode
# (`fedctta@probe_bn=eval`), and the reference code's whole handling (`fedctta@probe_bn=eval,probes=per_client,
# ema=0.9`), each stored by `study fedtsa case-study --orders fedctta --strategies SPEC --out ...`; and the order of the methods
# each gives:

# %%
for spec, label in CASE_VARIANTS.items():
    if spec in all_case_runs and case_runs:
        table3_variant = beside_fedctta_table3({**case_runs, "fedctta": all_case_runs[spec]})
        display(tables.show(table3_variant, caption=f"FedCTTA's row: {label}"))
        display(Markdown(f"With {label[len('FedCTTA, '):]}: " + case_study_order(table3_variant)))
    else:
        print(f"no stored {spec} run under {case_study_dir}: run the command above")

# %% [markdown]
# ## Figs. 3-4: the case study's collaboration matrices
# The paper's Fig. 3 shows W over rounds for pFedGraph, FedTSA and FedCTTA on this case study, and says FedCTTA
# clusters the clients with similar distributions; its Fig. 4 shows client 1's row over time and says clients 8-10 gain
# weight at the 8th distribution shift, where they see client 1's corruption. Below: W averaged over three slots
# (first, the meeting slot 8, last), every panel on one [0, 1] scale, groups separated by white lines; then client 1's
# row over time; then the shares each run gives, beside uniform mixing (`fedctta.clusters`).

# %%
fig34 = [s for s in ["pfedgraph", "fedtsa", "fedctta", *CASE_VARIANTS] if s in all_case_runs]
if fig34:
    case_cfg = summary_config(all_case_runs[fig34[0]].summary)
    case_slot = case_cfg.images_per_client // case_cfg.batch_size
    case_groups = [next(g for g, members in CASE_STUDY_GROUPS.items() if c in members) for c in range(case_cfg.clients)]
    shown_slots = [0, MEET_SLOT, all_case_runs[fig34[0]].collaboration.shape[0] // case_slot - 1]
    style.collaboration_matrices({f"{case_label(s)}, slot {k + 1}":
                                  all_case_runs[s].collaboration[k * case_slot:(k + 1) * case_slot].mean(0)
                                  for s in fig34 for k in shown_slots}, groups=case_groups, ncols=len(shown_slots))
    fig, axes = plt.subplots(len(fig34), 1, figsize=(style.MAX_WIDTH, 2.2 * len(fig34)), squeeze=False, sharex=True)
    for ax, s in zip(axes[:, 0], fig34):
        plots.collaboration_over_time(all_case_runs[s].collaboration, client=0, ax=ax, slot_steps=case_slot,
                                      groups=case_groups, cbar=False, title=f"{case_label(s)}: client 1's weights")
    for ax in axes[:-1, 0]:
        ax.set_xlabel("")  # one step axis, under the last panel
    fig.colorbar(axes[0, 0].images[0], ax=axes[:, 0], label=style.W_LABEL, shrink=0.8)
    clusters = cluster_table(all_case_runs)
    display(tables.show(clusters.rename(index=case_label).T, digits=3, best=None))
    display(Markdown(cluster_reading(clusters, case_label)))
    for spec in [s for s in CASE_VARIANTS if s in all_case_runs]:  # W (float32) against uniform mixing, per step
        display(Markdown(departure_reading(case_label(spec),
                                           uniform_departure(all_case_runs[spec].collaboration, case_slot))))
else:
    print(f"no stored case study under {case_study_dir}: run the command above")

# %% [markdown]
# ## Fig. 2: robustness to spatial and temporal heterogeneity (CIFAR-10-C, TTA-bn)
# The paper varies SH with TH = 0.02 fixed, and TH with SH = 0.2 fixed (20 clients, its Fig. 2a/2b for CIFAR-10-C;
# the figure's values are not in the text, so only its claims can be set beside ours: every method loses accuracy as
# SH grows, FedAvg most, FedCTTA stays best; at high TH FedCTTA is close to FedTSA). Our runs use the `heterogeneity`
# scenario (SH = clusters / clients, TH = 1 / slot length; `ftta_core.scenarios.heterogeneity_scenario`), the
# protocol's other settings, and are stored in `sweep_dir`, shared with notebook 11's Fig. 4. This cell reads what is
# stored and lists what is missing: `-p compute_sweeps=True` runs it, `FTTA_PLAN` plans it for `run-plan`.
#
# Under TTA-bn a strategy without state (Local, FedAvg, FedAMP: each step normalises with that step's batch statistics
# and mixes that step's uploads) cannot depend on TH as long as the slot length divides the 50 steps a client spends
# on a corruption (TH = 0.02, 0.1 here; not 0.05): a shorter slot then only reorders the same per-step batches, and
# the corruptions the clusters meet at one step, in time (tested in `tests/test_workbook.py`).
# Only a server that carries something between steps (FedTSA's memory, pFedGraph's state) or draws something per
# step (FedCTTA's probes) can respond to TH here; the paper's TH curves come from a setting where the client models
# themselves change over time.

# %%
FIG2 = ["local", "fedavg", "fedamp", "pfedgraph", "fedtsa", "fedctta"]
if smoke:
    sweep_dir, compute_sweeps, sh_values, th_values = tempfile.mkdtemp(), True, [0.5], [0.2]
    FIG2, sweep_base = ["local", "fedavg", "fedctta"], cfg
else:
    sweep_base = table1_config("cifar10", "niid", "bn")
fig2 = {field: heterogeneity_sweep(sweep_base, field, values, fixed, FIG2, sweep_seeds, sweep_dir,
                                   only_cached=not compute_sweeps)
        for field, values, fixed in (("sh", sh_values, {"th": 0.02}), ("th", th_values, {"sh": 0.2}))}
fig, axes = plt.subplots(1, 2, figsize=(style.MAX_WIDTH, 3.6), sharey=True)
for ax, (field, table) in zip(axes, fig2.items()):
    if table.empty:
        ax.set_title(f"{field.upper()}: no stored runs")
        continue
    means = table.groupby(["variant", field]).accuracy.mean().unstack(0)
    style.errorbar_lines(ax, table, field, "accuracy", hue="variant", labels=METHOD_LABELS)
    ax.set(xlabel=field.upper(), ylabel="accuracy (%)", xscale="log" if field == "th" else "linear",
           title="spatial heterogeneity (TH = 0.02)" if field == "sh" else "temporal heterogeneity (SH = 0.2)")
    display(tables.show(means.rename(columns=lambda s: METHOD_LABELS.get(s, s))))
style.legend_outside(axes[-1], title="strategy (±1 sd; open: 1 seed)")
missing = [(field, value, s) for field, values in (("sh", sh_values), ("th", th_values)) for value in values
           for s in FIG2 if fig2[field].empty
           or len(fig2[field].query(f"{field} == @value and variant == @s")) < len(sweep_seeds)]
print(f"{len(missing)} (point, strategy) cells not stored for all of seeds {sweep_seeds}:", missing)
for field, table in fig2.items():
    display(Markdown(sweep_reading(table, field, "fedctta", METHOD_LABELS)))

# %% [markdown]
# ## Server cost: FedCTTA vs FedTSA (FedAvg as the floor)
# Measured by `benchmarks/server_cost.py` (command and machine in `benchmarks/results/server_cost_cpu.md`): the
# strategies driven with synthetic uploads of the ResNet-8 shapes, FedTSA at its defaults (T = 10, 100 server
# steps per round, bank prefilled to T). Left: server seconds per round (W + mixing the BN statistics); middle: bytes
# the strategy holds between rounds; right: bytes held after each round from an empty server.

# %%
cost_result = json.loads(Path(server_cost_json).read_text())
cost = scaling_table(cost_result)
print(cost_result["command"], "|", cost_result["device_name"], "|", cost_result["date"])
display(tables.show(cost.pivot(index="clients", columns="strategy", values="s_per_round"), digits=4, best="min",
                    caption="server seconds per round"))
display(tables.show(cost.pivot(index="clients", columns="strategy", values="held_bytes"), best=None,
                    caption="bytes held between rounds"))
display(tables.show(pd.DataFrame(cost_result["uploads"]), best=None))
display(tables.show(pd.DataFrame(cost_result["probe_forward"])[["clients", "seconds", "seconds_per_client"]], digits=4,
                    best=None))
plots.server_cost_figure(cost_result)

# %% [markdown]
# ## Table IV on the digits: probe data x statistic x distance
# Every cell is FedCTTA on the digits stream with a different probe set (uniform noise, or 64 clean training
# digits drawn once from a seed) and statistic (mean logits, or mean penultimate features) and distance. The paper's
# Table IV is TTA-grad on CIFAR-10-C; here it is TTA-bn, because under TTA-grad with lr 1e-4 on this stream the
# client models barely move and W has little to act on (the Local and FedAvg references below show it).

# %%
probe_images = clean_probe_images("embedded_digits", build_strategy("fedctta").n_probes, seed)
t4_variants = table4_variants(probe_images)
if smoke:
    keep = ["random_noise/logits/euclidean", "clean_images/logits/euclidean", "local", "fedavg"]
    t4_variants = {k: t4_variants[k] for k in keep}
t4_grid = live_grid(cfg, t4_variants, seeds, cache=runs)
t4 = beside_fedctta_table4(split_table4(t4_grid))
refs = t4_grid[t4_grid.probes.isna()].groupby("variant")["accuracy"].mean()  # the baselines: no Table IV cell
print("references (TTA-bn):", {METHOD_LABELS[k]: round(v, 2) for k, v in refs.items()})
grad_cfg = ExperimentConfig(**{**cfg.to_dict(), **TTA_SETTINGS["grad"]})
grad_grid = live_grid(grad_cfg, {"Local": Variant("local"), "FedAvg": Variant("fedavg")}, seeds, cache=runs)
grad_refs = grad_grid.groupby("variant")["accuracy"].mean().to_dict()
print("references (TTA-grad):", {k: round(v, 2) for k, v in grad_refs.items()})
display(tables.show(t4))

# %% [markdown]
# ## Fig. 5 on the digits: aggregation interval and batch size (and the temperature)
# (a) FedCTTA aggregating every k-th step (W = I in between). (b) Local, FedAvg and FedCTTA at several batch sizes;
# each distribution still lasts `images_per_client` images per client, so larger batches mean fewer steps per
# distribution. (c) Not in the paper: the softmax temperature (the paper fixes 1), because W's sharpness depends on
# the scale of the model's logits.

# %%
# each grid carries its variants' factors as columns: interval; strategy and batch; temperature
intervals = [1, 3] if smoke else [1, 2, 3, 6, 12, 36]
interval_grid = live_grid(cfg, interval_variants(intervals), seeds, cache=runs)
batches = [10, 30] if smoke else [10, 20, 30, 60]
batch_grid = live_grid(cfg, batch_size_variants(batches, images_per_client,
                                               ("fedavg", "fedctta") if smoke else ("local", "fedavg", "fedctta")), seeds,
                       cache=runs)
temperatures = [1, 10] if smoke else [1, 3, 10, 30]
temperature_grid = live_grid(cfg, temperature_variants(temperatures), seeds, cache=runs)
fig, axes = style.panels(3, ncols=3, panel=(3.6, 3.6))
for ax, grid_, x, title in ((axes[0], interval_grid, "interval", "(a) aggregation interval"),
                            (axes[2], temperature_grid, "temperature", "(c) softmax temperature (not in the paper)")):
    plots.accuracy_curve(grid_, x, ax=ax, log_x=True, label="FedCTTA")
    ax.axhline(refs.get("fedavg", np.nan), color="gray", ls="--", lw=1, label="FedAvg")
    ax.axhline(refs.get("local", np.nan), color="k", ls=":", lw=1, label="Local")
    ax.set_title(title)
style.legend_outside(axes[0], loc="upper center", anchor=(0.5, -0.2), ncol=3)
plots.accuracy_curve(batch_grid, "batch", hue="strategy", ax=axes[1], labels=METHOD_LABELS)
style.legend_outside(axes[1], loc="upper center", anchor=(0.5, -0.2), ncol=3, title=None)
axes[1].set_title("(b) batch size")
axes[2].get_legend() and axes[2].get_legend().remove()  # same key as (a)
fig.suptitle("mean ± 1 sd over seeds (open marker: one seed); (c) uses the key of (a)", fontsize=9)

# %% [markdown]
# ## The temperature with the reference clients' probes and EMA (digits)
# FedCTTA's W depends on how the clients normalise the probes (`probe_bn`: ours by default with the statistics of the
# client's real batch at this step; the reference clients in eval mode, i.e. under TTA-bn with the statistics of the
# previous aggregation), on whether all clients share one probe set (the paper) or draw their own every step (the
# reference code) and on whether the server smooths the probe statistics (EMA 0.9 in the reference code, none in the
# paper); the last setting is the reference code's. One line per setting across temperatures, on the stream above: (a)
# accuracy, with FedAvg dashed and Local dotted; (b) W's mean self-weight, with FedAvg's 1/N dashed.

# %%
probe_temperatures = [1, 10] if smoke else [1, 3, 10, 30]
probe_grid = probe_temperature_grid(cfg, probe_temperatures, seeds, cache=runs)
fig, axes = style.panels(2, ncols=2, panel=(3.6, 3.4))
plots.accuracy_curve(probe_grid, "temperature", hue="setting", ax=axes[0], log_x=True)
axes[0].axhline(refs.get("fedavg", np.nan), color="gray", ls="--", lw=1)
axes[0].axhline(refs.get("local", np.nan), color="k", ls=":", lw=1)
axes[0].set_title("(a) accuracy")
axes[0].get_legend() and axes[0].get_legend().remove()  # one key, beside the right panel
plots.accuracy_curve(probe_grid, "temperature", y="self weight", hue="setting", ax=axes[1], log_x=True)
axes[1].axhline(1 / clients, color="gray", ls="--", lw=1)
axes[1].set(ylabel="W's mean self-weight", title="(b) self-weight")
display(Markdown(probe_temperature_reading(probe_grid, refs.to_dict(), clients)))

# %% [markdown]
# ## Reading it
# Written from the numbers computed above (and the stored runs and the benchmark file): every comparison in it is
# computed; a sentence about a mechanism that no run here tests says so.

# %%
display(Markdown(reading(walk, shares, contrast, t4, grad_refs, interval_grid, temperature_grid, batch_grid, cost,
                         table1, pd.DataFrame(cost_result["over_rounds"]),
                         beside_fedctta_table3(case_runs) if case_runs else None, fig2)))
