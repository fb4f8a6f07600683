"""FedCTTA with the reference clients' probe normalisation (``probe_bn="eval"``) under TTA-bn vs FedAvg, FedTSA Table 1
protocol, NIID, seed 0, all 750 steps: how far W is from uniform at each step and where the two runs part.

Under TTA-bn with eval probes every client normalises the shared probes with the previous aggregation's statistics
(the source statistics before the first): identical statistics give identical probe outputs, a uniform W, identical
mixtures again, so FedCTTA starts as FedAvg. Writes ``probe_eval_symmetry_niid_seed0.csv`` beside this file (per
step: max |W - 1/N| of both runs and their correct predictions after mixing). Run from the repository root:

    .venv/bin/python figures/fedctta/probe_eval_symmetry.py      # two protocol runs, ~15-25 min each on one core
"""
import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from ftta_core.experiment import run_experiment
from studies.fedtsa.table1 import table1_config

torch.set_num_threads(1)
base = dataclasses.replace(table1_config("cifar10", "niid", "bn"), seed=0)
runs = {"fedctta_eval": dataclasses.replace(base, strategy="fedctta", strategy_params={"probe_bn": "eval"}),
        "fedavg": dataclasses.replace(base, strategy="fedavg")}
table = {}
for name, cfg in runs.items():
    res = run_experiment(cfg)
    w = res.collaboration
    table["step"] = np.arange(len(w))
    table[f"{name}_max_abs_w_minus_uniform"] = np.abs(w - 1.0 / w.shape[1]).max(axis=(1, 2))
    table[f"{name}_correct"] = res.steps.groupby("step")["correct_mixed"].sum().to_numpy()
    print(name, "accuracy", res.summary["accuracy"])
pd.DataFrame(table).to_csv(Path(__file__).with_name("probe_eval_symmetry_niid_seed0.csv"), index=False,
                           float_format="%.6g")
