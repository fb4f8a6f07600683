# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
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

from ftta_core.corruptions import CORRUPTIONS, corrupt_uint8
from ftta_core.data import load_dataset
from ftta_core.notebooks import smoke_mode
from ftta_core.scenarios import dirichlet_client_pools, fedtsa_scenario, heterogeneity_scenario

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
fig, axes = plt.subplots(len(idx), len(CORRUPTIONS) + 1, figsize=(1.1 * (len(CORRUPTIONS) + 1), 1.15 * len(idx)))
for c, name in enumerate(["clean"] + list(CORRUPTIONS)):
    imgs = test.images[idx] if name == "clean" else corrupt_uint8(test.images[idx], name, 5, seed)
    for r in range(len(idx)):
        axes[r, c].imshow(imgs[r])
        axes[r, c].axis("off")
    axes[0, c].set_title(name.replace("_", "\n"), fontsize=7)
fig.tight_layout()

# %% [markdown]
# ## Scenarios
# Left: the FedTSA NIID protocol (20 clients in 4 areas, each walking the 15 corruptions cyclically from its own
# start; SH = 0.2). Middle: any (SH, TH) from the definitions. Right: Dirichlet label skew per client.

# %%
names = list(CORRUPTIONS)
niid = fedtsa_scenario(names, niid=True)
other = heterogeneity_scenario(20, names, sh=0.5, th=0.02, n_steps=750, batch_size=10)
alpha = 0.1
pools = dirichlet_client_pools(test.labels, 10, 200, alpha, seed)
counts = np.stack([np.bincount(test.labels[p], minlength=test.num_classes) for p in pools])

fig, axes = plt.subplots(1, 3, figsize=(15, 4))
sns.heatmap(niid.domain_map, ax=axes[0], cmap="tab20", cbar=False)
axes[0].set(title=f"FedTSA NIID: SH={niid.spatial_heterogeneity():.2f}, TH={niid.temporal_heterogeneity:.3f}",
            xlabel="slot (50 steps)", ylabel="client")
sns.heatmap(other.domain_map, ax=axes[1], cmap="tab20", cbar=False)
axes[1].set(title=f"SH={other.spatial_heterogeneity():.2f}, TH={other.temporal_heterogeneity:.3f}",
            xlabel=f"slot ({other.slot_steps} steps)", ylabel="client")
sns.heatmap(counts, ax=axes[2], cmap="Blues", annot=False)
axes[2].set(title=f"Dirichlet(alpha={alpha}) label skew, 10 clients x 200 images", xlabel="class", ylabel="client")
fig.tight_layout()

# %% [markdown]
# ## Reading the pictures
# In the NIID map the four areas see different corruptions at every moment, so a client's best partners are the
# other clients of its area, and they change only by area, not over time; in the IID protocol all clients share one
# order, and averaging everyone is as good as it gets. Raising SH multiplies the simultaneous domains; shorter slots
# (smaller TH here, following the formula) make the shift change faster than a client can adapt. Small Dirichlet
# alpha gives clients a few dominant classes, which biases batch statistics — the problem pFedBBN addresses.
