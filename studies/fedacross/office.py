"""Office-Caltech-10: pre-train the server on one domain, adapt clients on the others (the shape of Table 2)."""
from __future__ import annotations

import copy
from typing import Dict, Sequence

import numpy as np
import pandas as pd
import torch

from ftta_core.fedacross.client import ClientSpec, backbone_features
from ftta_core.fedacross.features import ClientFeatures
from ftta_core.fedacross.model import FedAcrossNet
from ftta_core.fedacross.pretrain import PretrainSpec, pretrain_server
from ftta_core.fedacross.sampling import balanced_select
from ftta_core.rng import numpy_generator
from studies.fedacross.study import evaluate_client

SHORT = {"amazon": "A", "webcam": "W", "dslr": "D", "caltech10": "C"}


def office_server(initial: FedAcrossNet, source: str, spec: PretrainSpec, size: int = 32, seed: int = 0
                  ) -> FedAcrossNet:
    """Pre-train on Office-Caltech-10 domain ``source``: backbone from ``initial`` (our CIFAR-10 ResNet-18 stands in
    for the paper's ImageNet weights), fresh A and g (10 classes), then eq. (2) with ``spec``."""
    from ftta_core.data import load_dataset

    data = load_dataset(f"office_caltech10/{source}", "all", size=size)
    model = copy.deepcopy(initial)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(numpy_generator(seed, "fedacross", "office-head", source).integers(2**62))
        fresh = FedAcrossNet(model.spec)
    model.adapter = fresh.adapter
    model.classifier = fresh.classifier
    return pretrain_server(model, data, spec, seed)


def office_rows(server: FedAcrossNet, source: str, targets: Sequence[str], ks: Sequence[int], spec: ClientSpec,
                size: int = 32, seed: int = 0) -> pd.DataFrame:
    """Per target domain and k: accuracy on the target images outside the k-shot support set (NaN if some class
    has fewer than k + 1 images); k = 0 is the server classifier g on the whole domain."""
    from ftta_core.data import load_dataset

    rows = []
    for target in targets:
        data = load_dataset(f"office_caltech10/{target}", "all", size=size)
        x, y = data.tensors()
        feats = backbone_features(server, x)
        counts = np.bincount(data.labels, minlength=server.spec.num_classes)
        for k in ks:
            pair = f"{SHORT[source]}->{SHORT[target]}"
            if k > 0 and counts.min() <= k:
                rows.append({"pair": pair, "k": k, "accuracy": float("nan"), "test_images": 0})
                continue
            gen = numpy_generator(seed, "fedacross", "office-support", source, target, k)
            idx = balanced_select(data.labels, k, server.spec.num_classes, gen) if k else np.zeros(0, np.int64)
            rest = np.setdiff1d(np.arange(len(data)), idx)
            client = ClientFeatures(target, feats, y, feats[rest], y[rest])
            acc, _ = evaluate_client(server, client, idx, spec, seed, None, source, target, k)
            rows.append({"pair": pair, "k": k, "accuracy": acc, "test_images": len(rest)})
    return pd.DataFrame(rows)


def office_table(initial: FedAcrossNet, pairs: Dict[str, Sequence[str]], ks: Sequence[int], pretrain: PretrainSpec,
                 client: ClientSpec, size: int = 32, seed: int = 0) -> pd.DataFrame:
    """All (source -> target, k) rows for ``pairs`` = {source: [targets]}."""
    frames = [office_rows(office_server(initial, s, pretrain, size, seed), s, ts, ks, client, size, seed)
              for s, ts in pairs.items()]
    return pd.concat(frames, ignore_index=True)


def beside_paper(ours: pd.DataFrame, paper: pd.DataFrame, method: str = "FedAcross(+)") -> pd.DataFrame:
    """Ours (Office-Caltech-10, 10 classes) beside the paper's Office-31 numbers, for our pairs and k and the
    average over our pairs ('Avg': ours over the pairs run here, the paper's over its six pairs)."""
    avg = ours.groupby("k")["accuracy"].agg(lambda a: a.mean(skipna=False)).reset_index().assign(pair="Avg")
    o = pd.concat([ours, avg]).set_index(["pair", "k"])["accuracy"].rename("ours Office-Caltech-10 (%)")
    p = paper[paper.method == method].copy()
    p["k"] = p["k"].astype(int)
    p = p.set_index(["pair", "k"])["accuracy"].rename("paper Office-31 (%)")
    return pd.concat([o, p], axis=1).loc[o.index].sort_index()
