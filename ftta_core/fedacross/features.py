"""A FedAcross+ client's data and frozen-backbone features, and how its k support items are picked from its stream
(``support_indices``: balanced, random or volume sampling, Algorithm 1's stream sampling)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence

import numpy as np
import torch

from ..data.base import ImageArray
from ..rng import numpy_generator, torch_generator
from .augment import AugmentSpec
from .client import augmented_features, backbone_features, embed_features
from .model import FedAcrossNet
from .sampling import SELECTIONS, balanced_select, random_select, vessal_select, vessal_select_per_class


@dataclass
class ClientData:
    """One client's target domain: a labelled-on-demand stream and a hold-back test set (images uint8 NHWC)."""

    name: str
    stream: ImageArray
    test: ImageArray


@dataclass
class ClientFeatures:
    """Backbone features f(x) of a client's stream and test images (f is frozen, so computed once); the stream
    images themselves ([n, 3, H, W] in [0, 1]) when kept, for Algorithm 1's per-batch augmentation."""

    name: str
    stream: torch.Tensor
    stream_labels: torch.Tensor
    test: torch.Tensor
    test_labels: torch.Tensor
    stream_images: Optional[torch.Tensor] = None


def cifar10c_clients(corruptions: Sequence[str], n_stream: int, n_test: int, severity: int = 5, seed: int = 0,
                     data_root: Optional[str] = None) -> List[ClientData]:
    """One client per corruption: disjoint random stream and test images of the CIFAR-10 test set, corrupted."""
    from ftta_core.data import load_dataset
    from ftta_core.data.root import cache_dir
    from ftta_core.stream import CorruptedDomains

    base = load_dataset("cifar10", "test", root=data_root)
    if n_stream + n_test > len(base):
        raise ValueError(f"n_stream + n_test must be <= {len(base)}, got {n_stream + n_test}")
    domains = CorruptedDomains(base, list(corruptions), severity, seed=0, cache_dir=cache_dir() / "corrupted")
    out = []
    for i, name in enumerate(corruptions):
        order = numpy_generator(seed, "fedacross", "client-pool", i).permutation(len(base))
        images = domains.domain_images(i)
        parts = [order[:n_stream], order[n_stream:n_stream + n_test]]
        arrays = [ImageArray(f"{name}/{part}", images[idx], base.labels[idx], list(base.class_names))
                  for part, idx in zip(("stream", "test"), parts)]
        out.append(ClientData(name, *arrays))
    return out


def domain_split(data: ImageArray, n_test: int, seed: int, *keys: object) -> ClientData:
    """A domain as a client: a random stratified-free split into ``n_test`` test images and the stream (the rest)."""
    order = numpy_generator(seed, "fedacross", "domain-split", *[str(k) for k in keys]).permutation(len(data))
    return ClientData(data.name, data.subset(order[n_test:], f"{data.name}/stream"),
                      data.subset(order[:n_test], f"{data.name}/test"))


def client_features(model: FedAcrossNet, client: ClientData, keep_images: bool = False) -> ClientFeatures:
    """f(x) of the client's stream and test images (and the stream images if ``keep_images``)."""
    xs, ys = client.stream.tensors()
    xt, yt = client.test.tensors()
    return ClientFeatures(client.name, backbone_features(model, xs), ys, backbone_features(model, xt), yt,
                          xs if keep_images else None)


VIEWS = ("clean", "augmented")


def support_indices(selection: str, model: FedAcrossNet, feats: ClientFeatures, k: int, seed: int,
                    *keys: object, view: str = "clean", per_class: bool = False,
                    augment: AugmentSpec = AugmentSpec()) -> np.ndarray:
    """Stream positions to label for a k-shot budget of k * L labels ('balanced' is the paper's static k-shot set).

    VeSSAL options: ``view='augmented'`` embeds tau(T(x)) (eq. 6's x-tilde: one draw of T per stream item, from
    its own generator; needs ``feats.stream_images``), 'clean' tau(x) (the default); ``per_class=True`` fills k per
    class (``sampling.vessal_select_per_class``; it reads the labels of the items it labels)."""
    if view not in VIEWS:
        raise ValueError(f"view must be one of {VIEWS}, got {view!r}")
    if (view != "clean" or per_class) and selection != "vessal":
        raise ValueError(f"view and per_class are VeSSAL options; selection {selection!r} takes neither")
    num_classes = model.spec.num_classes
    gen = numpy_generator(seed, "fedacross", "select", selection, k, *[str(x) for x in keys])
    if selection == "balanced":
        return balanced_select(feats.stream_labels.numpy(), k, num_classes, gen)
    if selection == "random":
        return random_select(len(feats.stream_labels), k * num_classes, gen)
    if selection == "vessal":
        stream = feats.stream
        if view == "augmented":
            if feats.stream_images is None:
                raise ValueError("view='augmented' needs the stream images: client_features(..., keep_images=True)")
            stream = augmented_features(model, feats.stream_images, augment,
                                        torch_generator(seed, "fedacross", "select-view", k, *[str(x) for x in keys]))
        emb = embed_features(model, stream)
        if per_class:
            return vessal_select_per_class(emb, feats.stream_labels.numpy(), k, num_classes, gen)
        return vessal_select(emb, k * num_classes, gen)
    raise ValueError(f"selection must be one of {SELECTIONS}, got {selection!r}")
