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
# # 90 · Beyond the papers: one leaderboard, and what leaves a client
#
# Each paper compares a few methods on its own protocol. Here **every local TTA method x every strategy** runs on one
# common protocol (the FedTSA CIFAR-10-C protocol of `10_fedtsa`: 20 clients, batch 10, 500 images per client and
# corruption, severity 5, 50-step slots; NIID and IID), over several seeds, so one table shows which combinations win
# and by how much, with 95% confidence intervals over seeds. Runs are stored under `results_dir` and read back, so
# the board fills in as runs are added (`compute=False`, the default, shows only what is stored; `-p compute=True` runs
# the missing ones, GPU-hours for the full board; smoke mode always runs its small board).
#
# The second part asks what each method's uploads reveal: bytes per client per step, and how well the server could
# guess a client's current corruption from one upload (a probing classifier, `ftta_core.leakage`).

# %% tags=["parameters"]
# smoke=True (or FTTA_SMOKE=1): a few steps on the embedded digits in a temporary folder
smoke = False
setting = "niid"
seeds = [0, 1, 2, 3, 4]
locals_ = ["bn", "tent", "eata", "cotta", "rotta", "roid", "bbn"]
strategies = ["local", "fedavg", "fedavgm", "fedprox", "fedamp", "pfedgraph", "ldawa", "moon", "pfedsd", "fedtsa",
              "fedctta", "pfedbbn"]
results_dir = "../figures/leaderboard/runs"
table1_runs = "../figures/fedtsa_table1/runs"  # same configs as the bn and tent rows: read, never written
figure_dir = "../figures/leaderboard"
compute = False  # True: run the board's missing runs (the full board needs a GPU)
leakage_steps = 150  # steps of the stream the leakage probe records (20 clients each)
participation_rates = [1.0, 0.8, 0.5, 0.2]
participation_strategies = ["local", "fedavg", "fedavgm", "fedamp", "pfedgraph", "fedtsa", "fedctta"]

# %%
import dataclasses
import json
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from IPython.display import Markdown

from ftta_core.training import source_model_line
from ftta_core import style, tables
from ftta_core.experiment import ExperimentConfig

from studies.leaderboard import (gains_over_local, leaderboard_heatmap, leaderboard_reading, leaderboard_table,
                                   participation_figure, run_leaderboard)
from ftta_core.leakage import stored_leakage_table
from studies.readings import leakage_reading
from ftta_core.notebooks import output_folder, smoke_mode
from ftta_core.workbook import run_strategy_grid

style.use()
smoke = smoke_mode(smoke)
figure_dir = output_folder(figure_dir, "90_leaderboard")  # ../figures only when run --in-place
compute = compute or smoke  # smoke mode runs its small board in a temporary folder
if smoke:
    results_dir = table1_runs = figure_dir = tempfile.mkdtemp()
    seeds, locals_, strategies, leakage_steps = [0, 1], ["bn", "tent"], ["local", "fedavg", "fedctta"], 12
    participation_rates, participation_strategies = [1.0, 0.5], ["local", "fedavg", "fedamp"]
    base = ExperimentConfig(dataset="embedded_digits", scenario="heterogeneity", clients=8, batch_size=10,
                            images_per_client=20, corruptions=["fog", "contrast", "frost", "glass_blur"], sh=0.5,
                            th=0.5, device="cpu", max_steps=6)
else:
    base = ExperimentConfig(dataset="cifar10", scenario=f"fedtsa_{setting}", clients=20, batch_size=10,
                            images_per_client=500, severity=5)
Path(figure_dir).mkdir(parents=True, exist_ok=True)
print(source_model_line(base.model_name))  # every run of this notebook adapts this model

# %% [markdown]
# ## The leaderboard

# %%
grid = run_leaderboard(base, locals_, strategies, seeds, results_dir=results_dir, only_cached=not compute,
                       also_read=[table1_runs])
if grid.empty:
    print("no stored runs yet: set compute=True")
else:
    table = leaderboard_table(grid)
    fig, ax = plt.subplots(figsize=(style.MAX_WIDTH, 0.6 * len(locals_) + 2))
    leaderboard_heatmap(table, ax=ax, rows=locals_, columns=strategies, grid=grid,
                        title=f"Accuracy after mixing (%) on CIFAR-10-C, FedTSA's {setting.upper()} protocol: "
                              "every local method x strategy")
    fig.savefig(Path(figure_dir) / f"leaderboard_{base.scenario}.png", dpi=120, bbox_inches="tight")
    display(tables.show(table, caption="every stored cell, best first (95% CI: Student t over seeds)"))

# %% [markdown]
# How much each strategy adds over `local` (no collaboration) for each local method, in points, paired by seed (a
# seed fixes the stream), with a 95% interval over seeds; then what the stored board says:

# %%
if not grid.empty:
    gains = gains_over_local(grid)
    display(tables.show(gains.rename(columns={"gain": "mean"}), caption="gain over local (points)"))
    display(Markdown(leaderboard_reading(table, gains, len(locals_), len(strategies), len(seeds), locals_)))

# %% [markdown]
# ### The other setting, from the stored runs
# The board above is one setting (`setting`). The other one's stored runs are read back here, computing nothing: on
# CIFAR-10-C these are the FedTSA Table 1 runs of the `bn` and `tent` rows (the GPU rows ran only in NIID so far).

# %%
other = "iid" if setting == "niid" else "niid"
other_base = base if smoke else dataclasses.replace(base, scenario=f"fedtsa_{other}")
other_grid = run_leaderboard(other_base, locals_, strategies, seeds, results_dir=results_dir, only_cached=True,
                             also_read=[table1_runs])
if other_grid.empty:
    print(f"no stored {other} runs")
else:
    other_table = leaderboard_table(other_grid)
    display(tables.show(other_table, caption=f"{other}: every stored cell, best first"))
    display(Markdown(leaderboard_reading(other_table, gains_over_local(other_grid), len(locals_), len(strategies),
                                         len(seeds), locals_)))

# %% [markdown]
# ## What leaves a client, and what it gives away
# Bytes per client per step come from `benchmarks/results/server_cost_cpu.json`
# (`python benchmarks/server_cost.py`). The guess accuracies come from one run with FedCTTA on TTA-bn (it records
# all kinds of uploads at once: BN statistics, FedTSA's indicator, feature and logit means, FedCTTA's probe logits),
# stored under `results_dir/leakage/` with its code record and read back while that code is unchanged.

# %%
cost_file = Path("../benchmarks/results/server_cost_cpu.json")
if cost_file.exists():
    cost = json.loads(cost_file.read_text())
    display(tables.show(pd.DataFrame(cost["uploads"]).set_index("what"), best=None))
probe_cfg = dataclasses.replace(base, local="bn", local_params={}, strategy="fedctta", strategy_params={},
                                max_steps=None)
leak = stored_leakage_table(probe_cfg, leakage_steps, results_dir)  # computed once, read back while the code is unchanged
display(tables.show(leak, digits=1, best=None))
print(leakage_reading(leak))

# %% [markdown]
# ## Partial participation and stragglers
# FedTSA names synchronous clients as its limitation. Here every client reports at a step with probability p (an
# absent client dropped out, or straggled past the round's deadline): W is computed over the clients that reported,
# an absent client keeps its own model for that step (`ExperimentConfig.participation`; draws from the seed and the
# step, the same for every strategy). TTA-bn, the strategies of one rate sharing one pass.

# %%
rates = []
for p in participation_rates:
    cfg = dataclasses.replace(base, local="bn", local_params={}, participation=p)
    g = run_strategy_grid(cfg, participation_strategies, seeds[:1] if not smoke else seeds, results_dir=results_dir,
                          only_cached=not compute, progress=False, also_read=[table1_runs])
    rates.append(g.assign(participation=p))
rates = pd.concat(rates, ignore_index=True)
if not rates.empty:
    curve = rates.groupby(["participation", "variant"]).accuracy.mean().unstack()
    ax = participation_figure(rates)
    ax.figure.savefig(Path(figure_dir) / f"participation_{base.scenario}.png", dpi=120, bbox_inches="tight")
    display(tables.show(curve))

# %% [markdown]
# ## The papers' claims about their clients, in one table
# Every claim of FedTSA's Table 1, FedCTTA's Table I and pFedBBN's Table 1 / Fig 5 that depends on how the clients
# were run (TTA-grad BatchNorm and optimiser, FedCTTA's probe normalisation, FedAvgM's momentum, pFedBBN's
# temperature), read from the stored runs: the paper's difference, ours paired by seed with its 95 % interval, the
# verdict of the rule stated before the runs it first read (`ftta_core.stats`; docs/statistics.md: 'holds' needs the
# interval on the paper's side of 0 and within 0.5 points of its size, or inside +-0.5 for a tie; fewer than 3 seeds
# is 'undetermined') beside the former rule's verdict, the cell's class (the paper's protocol, the reference code's, a
# factorial cell set before results, the cell the pre-registered step-size rule picked, post hoc, or the post-hoc cell
# on unseen seeds) and the runs that settle it (`studies.fidelity`, `studies.pfedbbn.temperature`; notebooks 10,
# 20 and 30 show each group with its figures). Rows whose two sides are the same computation hold by construction and
# are not counted. FedAvg+FT above Local comes twice: as we predict and as the reference code reports it (notebook
# 10's `ft_forward` reading). A claim without stored runs says so. First the counts per cell class, beside the former
# rule's:

# %%
from studies import fidelity
from studies.results_summary import workbook_claims

# the same table the README's generated results block counts (FedAvg+FT also as the reference code reports it)
claims = workbook_claims(table1_runs, pfedbbn=not smoke)
display(tables.show(fidelity.claims_counts(claims), best=None))
display(tables.show(claims.set_index(["cell class", "source", "claim", "settled by"])[fidelity.CLAIM_COLUMNS],
                    best=None))
display(Markdown(fidelity.claims_reading(claims)))

# %% [markdown]
# ## Clients that cannot drift
# In the drift cell (running BN, Adam 3e-4; a cell chosen *post hoc*, after seeing seed 0's claims, which is why the
# study reruns it on its own seeds and adds the paper's TTA-grad cell at seed 0 as a check) the source-anchored FedProx
# gains more over Local than any strategy of Table 1. Does a strategy still add points once each client is anchored to
# the source on its own? The study `studies.anchored` crosses anchored clients (a proximal term to the source, CoTTA's
# stochastic restore alone, EATA's Fisher term alone, periodic resets) with Local and four strategies, NIID and IID, at
# seeds 0-2; every anchor's strength was stated in that module before its runs. Its plain-client rows are the stored
# Table 1 runs; the anchored rows fill in as `python -m studies.anchored` stores runs (the coverage line says how many).
# Each strategy's gain is paired by seed with Local *using the same client*, and with Local using the plain client. The
# rows of strategy `local` with an anchored client are what the anchor gives alone (Local with it over Local with the
# plain client); the reading then says which of the papers' gains (strategies ahead with the plain client) are still
# ahead with each anchored client, and which the anchor alone matches or beats. The best federated and best local
# results are picked on these runs' means, a post-hoc choice: once a setting's grid is complete the picked pair is run
# again on seeds no choice saw (`anchored.REPLICATION_SEEDS`), and the second table says what it gives there. The last
# table is the check: every gain again in the paper's TTA-grad cell (SGD 1e-4, batch BN) at seed 0, beside the same gain
# in the drift cell at that seed. One seed has no interval, so it gets a direction (beyond the ±0.5 margin or within
# it), not a verdict. A skeptic counts comparisons: the grid has one gain over Local with the same client per client,
# strategy and setting, each read at 95 %. The family table reads those m gains once more as one family (Bonferroni:
# every interval at 1 - 0.05/m), a sensitivity reading beside the rule's verdicts, which stand.

# %%
from studies import anchored

anchored_runs = anchored.study_runs(only_cached=True)
coverage = anchored_runs[anchored_runs.cell == anchored.CELL].groupby("client").size()
print("stored runs of the drift cell per client (of "
      f"{len(anchored.STRATEGIES) * len(anchored.SETTINGS) * len(anchored.SEEDS)} each): "
      + ", ".join(f"{c} {n}" for c, n in coverage.items())
      + "; not stored yet: " + (", ".join(sorted(set(anchored.CLIENTS) - set(coverage.index))) or "none"))
anchored_gains = anchored.gains_table(anchored_runs)
anchored_best = anchored.best_table(anchored_runs)
display(tables.show(anchored_gains.set_index(["setting", "client", "strategy", "versus"])
                    [["gain", "low", "high", "seeds", "comparison"]], best=None, digits=2))
anchored_replication = anchored.replication_table(anchored_runs, anchored.replication_runs(anchored_runs))
display(tables.show(anchored_best.set_index("setting"), best=None, digits=2,
                    caption="The best federated against the best local result, both picked on seeds "
                            f"{', '.join(map(str, anchored.SEEDS))} (post hoc)"))
display(tables.show(anchored_replication.set_index("setting"), best=None, digits=2,
                    caption="The same pair on unseen seeds "
                            f"{', '.join(map(str, anchored.REPLICATION_SEEDS))} (the post-hoc pick replicated)"))
display(tables.show(anchored.cost_table(anchored_runs, anchored_gains).set_index(["setting", "strategy", "client"]),
                    best=None, digits=2, caption="What collaboration costs (upload per client step) for what it gains"))
fig = anchored.gains_figure(anchored_gains)
fig.savefig(Path(figure_dir) / "anchored_gains.png", dpi=120, bbox_inches="tight")
anchored_check = anchored.check_table(anchored_runs)
display(tables.show(anchored_check.set_index(["setting", "client", "strategy", "versus"]), best=None, digits=2,
                    caption=f"Check: the paper's TTA-grad cell at seed {anchored.CHECK_SEED} beside the drift cell"))
anchored_family = anchored.family_table(anchored_runs)
display(tables.show(anchored_family.set_index(["setting", "client", "strategy"]), best=None, digits=2,
                    caption="The grid's gains over Local with the same client as one family (Bonferroni)"))
display(Markdown(anchored.reading(anchored_gains, anchored_best, anchored_replication, anchored_check,
                                  anchored_family)))

# %% [markdown]
# ### The anchored clients on the leaderboard
# The same runs as a board: each client x strategy of the drift cell, mean accuracy with its 95 % half-width and
# seeds, NIID above IID on one colour scale (`anchored.board`, `studies.leaderboard`'s table and heatmap).

# %%
for anchored_setting in anchored.SETTINGS:
    anchored_board, _ = anchored.board(anchored_runs, anchored_setting)
    display(tables.show(anchored_board, best=None, digits=2,
                        caption=f"{anchored_setting.upper()}, drift cell: every stored client x strategy, best first"))
fig = anchored.board_figure(anchored_runs)
fig.savefig(Path(figure_dir) / "anchored_board.png", dpi=120, bbox_inches="tight")

# %% [markdown]
# ## Reading it
# The leaderboard's best cells and the gains over `local` are the headline: a strategy is only worth its
# communication where it adds points over `local` with a confidence interval that excludes zero. The leakage table
# says how much one upload tells the server about a client's current conditions, against the chance level, and the
# sentence under it names every case where a smaller upload reveals more than a larger one. FedCTTA's probes are
# shared noise, not client data, yet their outputs pass through the client's adapted BN statistics and carry the
# corruption with them: sending fewer bytes is not the same as revealing less. On CIFAR-10-C the leaderboard fills
# in as runs are added (`compute=True`; most local methods need a GPU); its `bn` and `tent` rows are the FedTSA Table 1
# configs, so their five seeds come from `figures/fedtsa_table1/runs`, and the coverage line above says how much of
# the board is stored. The EATA, ROID, BBN and RoTTA rows ran on one H100 (2026-11-23, 14 runs at a time
# under MPS; their FedTSA column at seed 0 there, with batched server rounds, and at seeds 1-4 on the CPU, 8-14 min
# per run on one core). CoTTA's row is missing: with its 32 augmented
# teacher passes per step, no run of this 750-step protocol finished within 6 min on a shared H100 (an estimate,
# not a measurement: 20-40 min per run, 1.5-3 GPU-hours for the row; `benchmarks/README.md`, "One H100, 2026-11-23").

# %% [markdown]
# ## Explore W of the stored runs
# The leaderboard keeps one summary per run, not W over time. The explorer offers every stored run of the workbook
# that kept W (the run folders under `figures/`), starting at one on this board's scenario where one is stored.
# Rows and columns are ordered by the domain each client sees at the step shown, with white lines between the
# domains and their names on the right, all on the fixed [0, 1] colour scale; beside it, the chosen client's row
# of W over every step (red line: the step shown). In JupyterLab this is an interactive widget (run, step slider
# with a play button, client; `ftta_core.explorer`); an executed copy (papermill, nbval) shows its static
# version: W at a few steps spread over the run and the client's row over time.

# %%
from ftta_core.explorer import explore, find_runs
from ftta_core.workbook import run_stored

if smoke:  # the smoke config's strategies with W kept, a few steps in a temporary folder
    explorer_root = Path(tempfile.mkdtemp())
    run_stored(base, strategies, explorer_root, progress=False)
else:
    explorer_root = Path(results_dir).parents[1]  # ../figures: read, never written
explorer_runs = find_runs(explorer_root)
on_board = find_runs(explorer_root, where=lambda config: config.get("scenario") == base.scenario)
view = explore(explorer_runs, run=next(iter(on_board), None))
