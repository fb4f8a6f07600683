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
# # 01 · Data, corruptions and shift scenarios
#
# What a client sees in the papers' experiments: a real test set (CIFAR-10 here), corrupted on the fly with the 15
# CIFAR-10-C corruptions at severity 1-5 (Hendrycks' constants, `ftta_core.corruptions`), arranged into streams by a
# **scenario**: a `clients x slots` map of domain ids. Two numbers describe a scenario (FedTSA, Sec. 5.1.3):
# temporal heterogeneity **TH** = slot length / stream length and spatial heterogeneity **SH** = clusters / clients.
# Label skew across clients (pFedBBN) is a Dirichlet draw of each client's class proportions.
#
# Our CIFAR-10 pixels are JPEG-compressed copies of the originals (`data/DATASETS.md`), so corrupted images and
# accuracies differ slightly from the released CIFAR-10-C.

# %% tags=["parameters"]
# smoke=True (or FTTA_SMOKE=1) uses the embedded digits instead of CIFAR-10
smoke = False
seed = 0
dataset = "cifar10"

# %%
import matplotlib.pyplot as plt
import numpy as np
import seaborn as sns

from ftta_core import plots, style
from ftta_core.corruptions import CORRUPTIONS, corrupt_uint8
from ftta_core.data import load_dataset
from ftta_core.notebooks import smoke_mode
from ftta_core.scenarios import dirichlet_client_pools, fedtsa_scenario, heterogeneity_scenario

style.use()
smoke = smoke_mode(smoke)
if smoke:
    dataset = "embedded_digits"
test = load_dataset(dataset, "test")
print(f"{test.name}: {len(test)} images {test.images.shape[1:]} , {test.num_classes} classes")

# %% [markdown]
# ## The 15 corruptions at severity 5
# Every corruption is a batched torch kernel; the random fields of image *i* are drawn from a generator derived from
# its own seed, so the same (image, corruption, severity, seed) always gives the same pixels.

# %%
idx = np.arange(6)
cell = style.MAX_WIDTH / (len(CORRUPTIONS) + 1)  # inches per image: the grid fits the workbook's figure width
fig, axes = plt.subplots(len(idx), len(CORRUPTIONS) + 1, figsize=(style.MAX_WIDTH, (cell + 0.05) * len(idx) + 0.5),
                         layout="constrained")
for c, name in enumerate(["clean"] + list(CORRUPTIONS)):
    imgs = test.images[idx] if name == "clean" else corrupt_uint8(test.images[idx], name, 5, seed)
    for r in range(len(idx)):
        axes[r, c].imshow(imgs[r])
        axes[r, c].axis("off")
    axes[0, c].set_title(name.replace("_", "\n"), fontsize=7)

# %% [markdown]
# ## Scenarios
# Left: the FedTSA NIID protocol (20 clients in 4 areas, each walking the 15 corruptions cyclically from its own
# start; SH = 0.2). Right: any (SH, TH) from the definitions; one colour per corruption in both maps (key on the
# right). Below: Dirichlet label skew per client.

# %%
names = list(CORRUPTIONS)
niid = fedtsa_scenario(names, niid=True)
other = heterogeneity_scenario(20, names, sh=0.5, th=0.02, n_steps=750, batch_size=10)
alpha = 0.1
pools = dirichlet_client_pools(test.labels, 10, 200, alpha, seed)
counts = np.stack([np.bincount(test.labels[p], minlength=test.num_classes) for p in pools])

fig, axes = style.panels(3, ncols=2, panel=(4.4, 3.4))
plots.scenario_map(axes[0], niid.domain_map, n_domains=len(names), xlabel=f"slot ({niid.slot_steps} steps)",
                   title=f"FedTSA NIID: SH={niid.spatial_heterogeneity():.2f}, TH={niid.temporal_heterogeneity:.3f}")
plots.scenario_map(axes[1], other.domain_map, n_domains=len(names), xlabel=f"slot ({other.slot_steps} steps)",
                   title=f"SH={other.spatial_heterogeneity():.2f}, TH={other.temporal_heterogeneity:.3f}")
style.category_key(axes[1], [n.replace("_", " ") for n in names], cmap="tab20", title="corruption", fontsize=8)
sns.heatmap(counts, ax=axes[2], cmap="Blues", annot=False, cbar_kws={"label": "images"})
axes[2].set(title=f"Dirichlet(alpha={alpha}) label skew, 10 clients x 200 images", xlabel="class", ylabel="client")

# %% [markdown]
# ## Reading the pictures
# In the NIID map the four areas see different corruptions at every moment, so a client's best partners are the
# other clients of its area, and they change only by area, not over time; in the IID protocol all clients share one
# order, and averaging everyone is as good as it gets. Raising SH multiplies the simultaneous domains; shorter slots
# (smaller TH here, following the formula) make the shift change faster than a client can adapt. Small Dirichlet
# alpha gives clients a few dominant classes, which biases batch statistics — the problem pFedBBN addresses.
