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
# # 60 · Your method: a local method and a strategy in a few lines, checked, run and ranked
#
# A new federated TTA method has two halves: what each client does with its batch (a *local method*) and how the
# server lets clients learn from each other (a *strategy*, which computes the collaboration matrix `W`). This
# notebook writes one of each, registers them under names, checks that they give the same results on both client
# banks (the backend-agreement contract every built-in method passes), runs them on the leaderboard's protocol and
# ranks them beside the papers' methods. The two classes live in a file of their own, a *plugin*
# (`examples/my_plugin.py`, 50 lines), which this notebook loads as the command line and `run-plan` workers do
# (`--plugin`); its code is shown where each method is introduced.
#
# - **PriorBN** (local): BN adaptation with a source prior (Schneider et al., NeurIPS 2020). Each BN layer normalises
#   with a mixture of the source model's statistics (weight `prior`, in images) and the test batch's (weight: the
#   batch size), instead of the batch's alone as TTA-bn does. Gradient-free, like TTA-bn.
# - **IndicatorSoftmax** (strategy): `W` is the row-softmax of the negative distances between the clients'
#   indicators (FedTSA's upload: the frozen source model's mean features of the batch), scaled by their mean: a
#   client takes most from the clients whose data currently look like its own.

# %% tags=["parameters"]
# smoke=True (or FTTA_SMOKE=1): a few steps on the embedded digits in a temporary folder
smoke = False
seeds = [0, 1, 2]
max_steps = 100  # the leaderboard protocol's first two corruption slots (see "The protocol")
papers_locals = ["bn"]
papers_strategies = ["local", "fedavg", "fedtsa"]
results_dir = "../figures/your_method/runs"
figure_dir = "../figures/your_method"

# %%
import dataclasses
import inspect
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import torch
from IPython.display import Code, Markdown

from ftta_core import check_backends_agree
from ftta_core.plugins import load_plugins
from ftta_core.experiment import ExperimentConfig, run_experiment
from ftta_core import stats
from studies.leaderboard import (gains_over_local, leaderboard_heatmap, leaderboard_reading, leaderboard_table,
                                   run_leaderboard)
from ftta_core.notebooks import output_folder, smoke_mode
from ftta_core.strategies import STRATEGIES
from ftta_core.tta import LOCAL_METHODS

smoke = smoke_mode(smoke)
figure_dir = output_folder(figure_dir, "60_your_method")  # ../figures only when run --in-place
if smoke:
    results_dir = figure_dir = tempfile.mkdtemp()
    seeds, papers_strategies = [0, 1], ["local", "fedavg"]
Path(figure_dir).mkdir(parents=True, exist_ok=True)
pd.set_option("display.width", 140)

# %% [markdown]
# ## The local method
# A local method adapts all N clients at once on the client bank and says what the server may mix (`shares`). PriorBN
# installs a *normaliser* (the engine's BN mode `custom` asks it for every layer's mean and variance; `x` holds the
# layer's input `[clients, batch, channels, pixels]`) and shares the statistics it normalised with, as TTA-bn does.

# %%
plugin = Path("../examples/my_plugin.py")  # a file of your own: it registers its methods when imported
load_plugins([str(plugin)])                # as --plugin FILE does for the command line and run-plan workers
PriorBN, IndicatorSoftmax = LOCAL_METHODS["prior_bn"], STRATEGIES["indicator_softmax"]
Code(inspect.getsource(PriorBN), language="python")

# %% [markdown]
# ## The strategy
# A strategy reads the uploads it names in `needs` and returns a row-stochastic `W[N, N]`; the engine mixes the shared
# state with it (`theta_i <- sum_j W_ij theta_j`). That is all a strategy that only computes `W` implements.

# %%
Code(inspect.getsource(IndicatorSoftmax), language="python")

# %% [markdown]
# ## The contract: the same results on both client banks
# Runs use the vectorized bank (all clients as one batched model); the loop bank (one model per client) is the
# specification. `check_backends_agree` runs 3 steps of 4 clients on real digits on both and raises naming the step
# and what differs (predictions exactly, `W` to 1e-5, the shared state to 1e-4). Each new method is checked with a
# built-in partner and with the other new one.

# %%
pairs = [("prior_bn", "fedavg"), ("bn", "indicator_softmax"), ("prior_bn", "indicator_softmax")]
contract = pd.DataFrame([{"local": local, "strategy": strategy, **check_backends_agree(local=local, strategy=strategy)}
                         for local, strategy in pairs])
contract

# %% [markdown]
# ## The protocol
# The leaderboard's protocol (`90_leaderboard`, the FedTSA CIFAR-10-C protocol: 20 clients in the NIID 4-area map,
# batch 10, 500 images per client and corruption, severity 5, 50-step slots, 750 steps) with one difference: the
# runs here stop after `max_steps` steps (100: the first two corruption slots). A 750-step run of either new method
# takes minutes on one CPU core (the measured times of the runs here, and the extrapolation, are printed under the
# board), so the full board for them would take hours on the CPU this notebook ran on. The stored
# leaderboard runs under `figures/leaderboard/runs` are of the full 750-step config, so they are **not** compared
# with these: the papers' methods (`bn` = TTA-bn with `local`, FedAvg, FedTSA) are run here on the same
# truncated config, same seeds, and stored under `results_dir`. In smoke mode a tiny embedded-digits config runs
# instead.

# %%
if smoke:
    base = ExperimentConfig(dataset="embedded_digits", scenario="heterogeneity", clients=8, batch_size=10,
                            images_per_client=20, corruptions=["fog", "contrast", "frost", "glass_blur"], sh=0.5,
                            th=0.5, device="cpu", max_steps=6)
else:
    base = ExperimentConfig(dataset="cifar10", scenario="fedtsa_niid", clients=20, batch_size=10,
                            images_per_client=500, severity=5, max_steps=max_steps)
locals_ = [*papers_locals, "prior_bn"]
strategies = [*papers_strategies, "indicator_softmax"]
print(f"{base.dataset} / {base.scenario}: {base.clients} clients, batch {base.batch_size}, "
      f"{base.max_steps} steps; local methods {locals_}, strategies {strategies}, seeds {seeds}")

# %% [markdown]
# ## On the leaderboard
# Every local method x strategy x seed, each run stored under `results_dir` and read back on a re-run (`bn`'s
# strategies share one pass per seed, the results are those of separate runs). Mean accuracy after mixing with a
# 95% interval over seeds:

# %%
grid = run_leaderboard(base, locals_, strategies, seeds, results_dir=results_dir, settings={"prior_bn": {}})
table = leaderboard_table(grid)
fig, ax = plt.subplots(figsize=(1.2 * len(strategies) + 3, 0.8 * len(locals_) + 2))
leaderboard_heatmap(table, ax=ax, title=f"accuracy after mixing (%), {base.dataset} {base.scenario}, "
                                        f"{base.max_steps} steps, mean ± 95% CI over {len(seeds)} seeds")
fig.savefig(Path(figure_dir) / "your_method_leaderboard.png", dpi=120, bbox_inches="tight")
table.round(2)

# %% [markdown]
# What a run cost, and what the full 750-step board would cost for the new local method at that rate:

# %%
from ftta_core.experiment import resolve_device

per_run = grid[grid.local == "prior_bn"].wall_time_s.mean()
full_steps = dataclasses.replace(base, max_steps=None)
full_len = len(full_steps.corruption_list) * full_steps.images_per_client // full_steps.batch_size
print(f"prior_bn: {per_run:.0f} s per {base.max_steps}-step run on {resolve_device(base.device)} "
      f"({torch.get_num_threads()} torch threads); a {full_len}-step run at that rate: "
      f"{per_run * full_len / base.max_steps / 60:.1f} min; its {len(strategies) * len(seeds)} runs of the full "
      f"board: {per_run * full_len / base.max_steps * len(strategies) * len(seeds) / 3600:.1f} h")

# %% [markdown]
# Each strategy's gain over `local` (no collaboration) for each local method, paired by seed, and what the board
# says:

# %%
gains = gains_over_local(grid)
display(gains.round(2))
display(Markdown(leaderboard_reading(table, gains, len(locals_), len(strategies), len(seeds), locals_)))

# %% [markdown]
# And the two questions a new method is asked: does PriorBN beat TTA-bn under the same strategy, and does
# IndicatorSoftmax beat the papers' strategies under the same local method? Differences in points, paired by seed,
# with a 95% interval (Student t over seeds) and the comparison of `ftta_core.stats` (ahead / behind only when the
# interval excludes 0; under 3 seeds, undetermined):

# %%
def gains_of(grid: pd.DataFrame, column: str, new: str, others) -> pd.DataFrame:
    """``new`` minus each of ``others`` in column ``column`` (local or strategy), paired by seed within each value of
    the other column (``stats.paired_table``): mean difference, 95% interval, seeds and ``stats.comparison``."""
    other = "strategy" if column == "local" else "local"
    wide = grid.pivot_table(index=[other, "seed"], columns=column, values="accuracy")
    return stats.paired_table(wide, new, others, by=other).set_index([other, "versus"])


local_gain = gains_of(grid, "local", "prior_bn", papers_locals)
strategy_gain = gains_of(grid, "strategy", "indicator_softmax", papers_strategies)
display(local_gain.round(2), strategy_gain.round(2))


def said(row: pd.Series) -> str:
    """'+1.23 [+0.10, +2.36] (3 seeds): ahead', a row of ``gains_of`` (no interval from one seed)."""
    interval = f" [{row.low:+.2f}, {row.high:+.2f}]" if row.seeds > 1 else ""
    return f"{row.gain:+.2f}{interval} ({row.seeds} seed{'s' if row.seeds > 1 else ''}): {row.comparison}"


best = table.index[0]
display(Markdown(
    f"**Reading.** Over {len(seeds)} seeds of this config, the best cell is {best[0]} + {best[1]} "
    f"({table.iloc[0]['mean']:.2f}%). PriorBN minus TTA-bn, per strategy: "
    + "; ".join(f"{s} {said(r)}" for (s, _), r in local_gain.iterrows())
    + ". IndicatorSoftmax minus each paper's strategy, per local method: "
    + "; ".join(f"{l} vs {v} {said(r)}" for (l, v), r in strategy_gain.iterrows()) + "."))

# %% [markdown]
# ## The plugin path: the same file from the command line
# Loaded with `--plugin`, `examples/my_plugin.py` runs from the command line exactly as in this kernel; the check
# below runs one small config (embedded digits, seconds) both ways and compares the accuracies.

# %%
small = ExperimentConfig(dataset="embedded_digits", scenario="heterogeneity", clients=4, batch_size=8,
                         images_per_client=40, corruptions=["gaussian_noise", "contrast"], sh=0.5, th=0.5,
                         local="prior_bn", strategy="indicator_softmax", device="cpu", max_steps=6)
out = Path(tempfile.mkdtemp()) / "run"
command = [sys.executable, "-m", "ftta_core", "run", "--plugin", "../examples/my_plugin.py", "--local", "prior_bn",
           "--strategy", "indicator_softmax", "--dataset", "embedded_digits", "--scenario", "heterogeneity",
           "--clients", "4", "--batch-size", "8", "--images-per-client", "40", "--corruptions",
           "gaussian_noise,contrast", "--sh", "0.5", "--th", "0.5", "--device", "cpu", "--max-steps", "6",
           "--out", str(out)]
print("python -m ftta_core " + " ".join(command[3:-2]) + " --out RUN")
cli = subprocess.run(command, capture_output=True, text=True)
assert cli.returncode == 0, cli.stderr[-2000:]
from_file = json.loads((out / "summary.json").read_text())
here = run_experiment(small).summary
print(f"accuracy through the command line: {from_file['accuracy']:.4f}; in this kernel: "
      f"{here['accuracy']:.4f}; the same: {from_file['accuracy'] == here['accuracy']}")
