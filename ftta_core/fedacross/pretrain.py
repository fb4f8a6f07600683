"""Server pre-training on the source domain (eq. 2) and the committed FedAcross+ checkpoint with its card."""
from __future__ import annotations

import json
import math
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Dict, Optional

import numpy as np
import torch
import torch.nn.functional as F

from ..data.base import ImageArray
from ..rng import derive_seed, torch_generator
from ..training import CHECKPOINT_DIR as _CHECKPOINTS
from .augment import AugmentSpec, transform
from .model import FedAcrossNet, ModelSpec

# a sub-folder, so that `python -m ftta_core cards` (which reads the source-model cards) is not confused by ours
CHECKPOINT_DIR = _CHECKPOINTS / "fedacross"


@dataclass(frozen=True)
class PretrainSpec:
    """Optimiser and budget of the server pre-training.

    Paper: SGD momentum 0.9 (Nesterov in the code), weight decay 1e-3, lr 0.01 decayed by a schedule, backbone lr
    x0.1, CE with label smoothing 0.1, batch 128, 300 epochs from ImageNet weights. Here the budget is CPU-sized
    (``epochs``, optionally on ``max_images`` of the source set) and the schedule is linear warm-up + cosine.
    """

    epochs: float = 1.0
    batch_size: int = 128
    lr: float = 0.01
    backbone_lr_mult: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 1e-3
    label_smoothing: float = 0.1
    warmup_fraction: float = 0.05
    max_images: Optional[int] = None
    augment: AugmentSpec = field(default_factory=AugmentSpec)

    def __post_init__(self) -> None:
        for name in ("epochs", "lr", "batch_size"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        for name in ("backbone_lr_mult", "weight_decay", "momentum"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be non-negative, got {getattr(self, name)}")
        if not 0 <= self.label_smoothing < 1:
            raise ValueError(f"label_smoothing must be in [0, 1), got {self.label_smoothing}")
        if not 0 <= self.warmup_fraction < 1:
            raise ValueError(f"warmup_fraction must be in [0, 1), got {self.warmup_fraction}")


def _schedule(total: int, warmup: int) -> Callable[[int], float]:
    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))
    return factor


def pretrain_server(model: FedAcrossNet, data: ImageArray, spec: PretrainSpec, seed: int = 0,
                    progress: bool = False, log: Optional[Callable[[int, float], None]] = None) -> FedAcrossNet:
    """Train f, A and g on ``data`` with T (flip, random resized crop, colour jitter) and eq. (2); returns the model."""
    gen = torch_generator(seed, "fedacross", "pretrain")
    n = len(data) if spec.max_images is None else min(len(data), spec.max_images)
    pool = torch.randperm(len(data), generator=gen)[:n].numpy()
    steps_per_epoch = math.ceil(n / spec.batch_size)
    total = max(1, int(round(spec.epochs * steps_per_epoch)))
    backbone = list(model.backbone.parameters())
    head = list(model.adapter.parameters()) + list(model.classifier.parameters())
    opt = torch.optim.SGD([{"params": backbone, "lr": spec.lr * spec.backbone_lr_mult}, {"params": head, "lr": spec.lr}],
                          momentum=spec.momentum, nesterov=spec.momentum > 0, weight_decay=spec.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _schedule(total, int(spec.warmup_fraction * total)))
    x_all, y_all = data.tensors(pool)
    steps = range(total)
    if progress:
        from tqdm.auto import tqdm
        steps = tqdm(steps, desc="server pre-training")
    model.train()
    perm = torch.randperm(n, generator=gen)
    for step in steps:
        s = step % steps_per_epoch
        if s == 0 and step > 0:
            perm = torch.randperm(n, generator=gen)
        idx = perm[s * spec.batch_size:(s + 1) * spec.batch_size]
        x = transform(x_all[idx], spec.augment, gen)
        loss = F.cross_entropy(model(x), y_all[idx], label_smoothing=spec.label_smoothing)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        if log is not None:
            log(step, float(loss.detach()))
    return model.eval()


@torch.no_grad()
def classifier_accuracy(model: FedAcrossNet, data: ImageArray, batch_size: int = 500) -> float:
    """Top-1 accuracy (%) of g(A(f(x))) in eval mode."""
    model.eval()
    correct = 0
    for start in range(0, len(data), batch_size):
        x, y = data.tensors(np.arange(start, min(start + batch_size, len(data))))
        correct += int((model(x).argmax(1) == y).sum())
    return 100.0 * correct / max(1, len(data))


def build_model(spec: ModelSpec, seed: int = 0) -> FedAcrossNet:
    """A randomly initialised model; the initialisation is drawn under a seed derived from ``seed``."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(seed, "fedacross", "init"))
        return FedAcrossNet(spec)


def save_fedacross(model: FedAcrossNet, name: str, card: Dict[str, object], directory: Path = CHECKPOINT_DIR,
                   half: bool = True) -> Path:
    """Write ``NAME.pt`` (state dict; float tensors stored as float16 when ``half``) and ``NAME.json`` (the card)."""
    directory.mkdir(parents=True, exist_ok=True)
    state = {k: (v.half() if half and v.is_floating_point() else v) for k, v in model.state_dict().items()}
    path = directory / f"{name}.pt"
    torch.save({"kind": "fedacross", "spec": model.spec.to_dict(), "state_dict": state}, path)
    (directory / f"{name}.json").write_text(json.dumps(card, indent=2) + "\n")
    return path


def load_fedacross(name: str, directory: Path = CHECKPOINT_DIR) -> FedAcrossNet:
    """Load a FedAcross+ checkpoint (eval mode, float32)."""
    path = directory / f"{name}.pt"
    if not path.exists():
        raise FileNotFoundError(f"FedAcross+ checkpoint {path} is missing; make it with "
                                f"`python -m ftta_core study fedacross pretrain --name {name}`")
    blob = torch.load(path, map_location="cpu", weights_only=True)
    model = FedAcrossNet(ModelSpec(**blob["spec"]))
    model.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in blob["state_dict"].items()})
    return model.eval()


def untrained_fedacross(name: str, seed: int = 0, directory: Path = CHECKPOINT_DIR) -> FedAcrossNet:
    """Checkpoint ``name``'s architecture (read from its committed card) with a seeded random initialisation.

    The weights file (about 23 MB in float16) is not committed; smoke runs use this instead, full runs need
    ``python -m ftta_core study fedacross pretrain``.
    """
    path = directory / f"{name}.json"
    if not path.exists():
        raise FileNotFoundError(f"no FedAcross+ card {path}")
    card = json.loads(path.read_text())
    with torch.random.fork_rng():
        torch.manual_seed(derive_seed(seed, "fedacross-untrained", name))
        model = FedAcrossNet(ModelSpec(**card["model"]))
    return model.eval()


def pretrain_card(name: str, model_spec: ModelSpec, spec: PretrainSpec, dataset: str, seed: int, command: str,
                  wall_s: float, metrics: Dict[str, object]) -> Dict[str, object]:
    """The model card stored beside a FedAcross+ checkpoint."""
    return {"name": name, "kind": "fedacross", "model": model_spec.to_dict(), "pretrain": asdict(spec),
            "dataset": dataset, "seed": seed, "command": command, "train_wall_s": round(wall_s, 1),
            "torch": torch.__version__, "machine": platform.machine(), "threads": torch.get_num_threads(),
            "device": "cpu", "backbone_init": "random (no ImageNet weights on these machines)",
            "stored_as": "float16 state dict (metrics measured on the stored weights)",
            "trained_at": time.strftime("%Y-%m-%d"), **metrics}


@dataclass(frozen=True)
class SourceRecipe:
    """One committed server model: architecture, source data set and pre-training spec."""

    name: str
    dataset: str
    model: ModelSpec
    pretrain: PretrainSpec


# CPU budget (2 shared cores, one thread): one epoch of CIFAR-10 at 32x32 with the cheap ImageNet stem takes ~10 min.
# From random init the paper's lr 0.01 with backbone x0.1 (meant for fine-tuning ImageNet weights) barely moves the
# backbone in one epoch, so this recipe uses lr 0.05 for every part (stated deviation); the rest is the paper's.
RECIPES: Dict[str, SourceRecipe] = {
    "fedacross_resnet18_cifar10": SourceRecipe(
        "fedacross_resnet18_cifar10", "cifar10", ModelSpec("resnet18", "imagenet", 10),
        PretrainSpec(epochs=1.0, lr=0.05, backbone_lr_mult=1.0)),
}


def train_recipe(name: str, seed: int = 0, command: str = "", progress: bool = True,
                 directory: Path = CHECKPOINT_DIR, **overrides: object) -> Path:
    """Pre-train recipe ``name`` (``overrides`` replace PretrainSpec fields), evaluate the stored weights, save."""
    import dataclasses

    from ..data import load_dataset

    if name not in RECIPES:
        raise ValueError(f"unknown recipe {name!r}; valid: {sorted(RECIPES)}")
    recipe = RECIPES[name]
    spec = dataclasses.replace(recipe.pretrain, **overrides)
    train, test = load_dataset(recipe.dataset, "train"), load_dataset(recipe.dataset, "test")
    model = build_model(recipe.model, seed)
    t0 = time.perf_counter()
    pretrain_server(model, train, spec, seed, progress)
    wall = time.perf_counter() - t0
    path = save_fedacross(model, name, {}, directory)
    stored = load_fedacross(name, directory)
    metrics = {"clean_test_accuracy": classifier_accuracy(stored, test), "train_images": spec.max_images or len(train)}
    card = pretrain_card(name, recipe.model, spec, recipe.dataset, seed, command, wall, metrics)
    (directory / f"{name}.json").write_text(json.dumps(card, indent=2) + "\n")
    return path
