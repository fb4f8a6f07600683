"""Reproducible supervised training of the source models shipped under ``data/checkpoints``."""
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
from torch import nn

from .data.base import ImageArray
from .data.cache import atomic_write
from .models import build_model
from .rng import torch_generator

CHECKPOINT_DIR = Path(__file__).resolve().parent.parent / "data" / "checkpoints"


@dataclass(frozen=True)
class SourceSpec:
    """How one source model is trained: architecture, data, optimiser and augmentation budget."""

    name: str
    arch: str
    dataset: str
    epochs: int
    batch_size: int = 128
    lr: float = 0.1
    weight_decay: float = 5e-4
    flip: bool = True
    crop_padding: int = 4
    dataset_kwargs: Dict[str, object] = field(default_factory=dict)


SOURCE_MODELS: Dict[str, SourceSpec] = {
    "resnet8_cifar10": SourceSpec("resnet8_cifar10", "resnet8", "cifar10", epochs=15),
    "cnn2_digits": SourceSpec("cnn2_digits", "cnn2", "digits/mnistm", epochs=15, lr=0.05, flip=False,
                              crop_padding=2, dataset_kwargs={"size": 32}),
    "digits_cnn_embedded": SourceSpec("digits_cnn_embedded", "digits_cnn", "embedded_digits", epochs=40,
                                      batch_size=64, lr=0.05, flip=False, crop_padding=2),
    # the ResNet-8 recipe for 1 epoch on the first 10,000 training images: clean 46.6%, CIFAR-10-C sev. 5 37.6%,
    # the papers' no-adaptation regime (FedTSA Table 2: 32-35%); fedtsa/source_regime.py compares them
    "resnet8_cifar10_e1_n10000": SourceSpec("resnet8_cifar10_e1_n10000", "resnet8", "cifar10", epochs=1),
    # the same recipe for 1 epoch on all images (clean 64.3%) and on the first 4,000 (clean 37.2%): the two
    # neighbours of the model above in source_regime's comparison, runnable so their TTA-bn level can be measured
    "resnet8_cifar10_e1": SourceSpec("resnet8_cifar10_e1", "resnet8", "cifar10", epochs=1),
    "resnet8_cifar10_e1_n4000": SourceSpec("resnet8_cifar10_e1_n4000", "resnet8", "cifar10", epochs=1),
}
# models trained on the first N images of their training split only (``train-source --train-images``)
SOURCE_TRAIN_IMAGES: Dict[str, int] = {"resnet8_cifar10_e1_n10000": 10000, "resnet8_cifar10_e1_n4000": 4000}


def augment_batch(x: torch.Tensor, gen: torch.Generator, padding: int, flip: bool) -> torch.Tensor:
    """Random crop after reflect padding and optional horizontal flip, drawn per image from ``gen``."""
    b, _, h, w = x.shape
    if padding > 0:
        padded = F.pad(x, (padding,) * 4, mode="reflect")
        oy = torch.randint(0, 2 * padding + 1, (b,), generator=gen)
        ox = torch.randint(0, 2 * padding + 1, (b,), generator=gen)
        rows = (oy[:, None] + torch.arange(h)[None]).to(x.device)  # [B, H]
        cols = (ox[:, None] + torch.arange(w)[None]).to(x.device)  # [B, W]
        idx_b = torch.arange(b, device=x.device)[:, None, None]
        x = padded.permute(0, 2, 3, 1)[idx_b, rows[:, :, None], cols[:, None, :]].permute(0, 3, 1, 2)
    if flip:
        mask = (torch.rand(b, generator=gen) < 0.5).to(x.device)
        x = torch.where(mask[:, None, None, None], x.flip(3), x)
    return x.contiguous()


@torch.no_grad()
def evaluate(model: nn.Module, data: ImageArray, batch_size: int = 500, device: str = "cpu",
             transform: Optional[Callable[[torch.Tensor, int], torch.Tensor]] = None) -> float:
    """Top-1 accuracy of ``model`` in eval mode on ``data`` (optionally transforming each batch)."""
    model.eval()
    correct = 0
    for start in range(0, len(data), batch_size):
        idx = np.arange(start, min(start + batch_size, len(data)))
        x, y = data.tensors(idx, device)
        if transform is not None:
            x = transform(x, start)
        correct += int((model(x).argmax(1) == y).sum())
    return correct / len(data)


def train_model(spec: SourceSpec, train: ImageArray, seed: int = 0, device: str = "cpu",
                epochs: Optional[int] = None, progress: bool = True) -> nn.Module:
    """Train ``spec.arch`` on ``train`` with SGD+Nesterov and a one-cycle schedule.

    Bit-for-bit reproducible given ``seed``, the device and the number of CPU threads (float reductions are summed
    in a thread-count-dependent order; the card records the thread count).
    """
    torch.manual_seed(seed)  # parameter initialisation of nn.Module uses the default generator
    model = build_model(spec.arch, num_classes=train.num_classes).to(device)
    n_epochs = epochs if epochs is not None else spec.epochs
    steps_per_epoch = math.ceil(len(train) / spec.batch_size)
    opt = torch.optim.SGD(model.parameters(), lr=spec.lr, momentum=0.9, nesterov=True, weight_decay=spec.weight_decay)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=spec.lr, total_steps=n_epochs * steps_per_epoch,
                                                pct_start=0.15)
    gen = torch_generator(seed, "train-source", spec.name)
    x_all, y_all = train.tensors(device=device)
    iterator = range(n_epochs)
    if progress:
        from tqdm.auto import tqdm
        iterator = tqdm(iterator, desc=f"train {spec.name}")
    for _ in iterator:
        model.train()
        perm = torch.randperm(len(train), generator=gen).to(device)
        total, seen = 0.0, 0
        for s in range(steps_per_epoch):
            idx = perm[s * spec.batch_size:(s + 1) * spec.batch_size]
            x = augment_batch(x_all[idx], gen, spec.crop_padding, spec.flip)
            loss = F.cross_entropy(model(x), y_all[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            total += float(loss.detach()) * len(idx)
            seen += len(idx)
        if progress:
            iterator.set_postfix(loss=f"{total / seen:.3f}")
    return model.eval()


def save_checkpoint(model: nn.Module, spec: SourceSpec, card: dict, directory: Path = CHECKPOINT_DIR) -> Path:
    """Write ``<name>.pt`` (state dict), then ``<name>.json`` (the model card) into ``directory``, each atomically
    (``data.cache.atomic_write``: a temporary file renamed over it): a crash leaves each file whole, old or new;
    between the two renames, the new weights beside the old card, which the card's command re-makes."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{spec.name}.pt"
    former = directory / f"{spec.name}.json"
    if "reference" not in card and former.is_file():  # a retrained model keeps the published number it is compared to
        reference = json.loads(former.read_text()).get("reference")
        card = {**card, **({"reference": reference} if reference else {})}
    blob = {"arch": spec.arch, "num_classes": model.fc.out_features, "state_dict": model.state_dict()}
    atomic_write(path, lambda fh: torch.save(blob, fh))
    atomic_write(directory / f"{spec.name}.json", lambda fh: fh.write((json.dumps(card, indent=2) + "\n").encode()))
    return path


def load_source_model(name: str, directory: Path = CHECKPOINT_DIR, device: str = "cpu") -> nn.Module:
    """Load the committed source model ``name`` (see ``SOURCE_MODELS``) in eval mode."""
    path = directory / f"{name}.pt"
    if not path.exists():
        raise FileNotFoundError(f"source checkpoint {path} is missing; train it with "
                                f"`python -m ftta_core train-source --model {name}`")
    blob = torch.load(path, map_location=device, weights_only=True)
    model = build_model(blob["arch"], num_classes=blob["num_classes"])
    model.load_state_dict(blob["state_dict"])
    return model.to(device).eval()


def source_card(spec: SourceSpec, seed: int, command: str, wall_s: float, metrics: dict) -> dict:
    """The model card stored beside a checkpoint."""
    return {"name": spec.name, "spec": asdict(spec), "seed": seed, "command": command,
            "train_wall_s": round(wall_s, 1), "torch": torch.__version__, "machine": platform.machine(),
            "threads": torch.get_num_threads(),
            "trained_at": time.strftime("%Y-%m-%d"), **metrics}


def render_cards(directory: Path = CHECKPOINT_DIR) -> str:
    """A markdown overview of every model card in ``directory`` (numbers read from the JSON cards; a card's
    ``reference``, a published number its model is compared with, is printed beside its own)."""
    lines = ["# Source models", "", "Checkpoints (`NAME.pt`, state dict) and their cards (`NAME.json`). Regenerate this "
             "page with `python -m ftta_core cards`; retrain a model with the command in its card.", ""]
    for path in sorted(directory.glob("*.json")):
        card = json.loads(path.read_text())
        spec = card["spec"]
        lines += [f"## {card['name']}", "",
                  f"- architecture `{spec['arch']}`, trained on `{spec['dataset']}` ({_train_images(card)}) for "
                  f"{card['epochs']} epoch{'s' if card['epochs'] != 1 else ''}, batch {spec['batch_size']}, "
                  f"SGD+Nesterov lr {spec['lr']} one-cycle, weight decay "
                  f"{spec['weight_decay']}, crop padding {spec['crop_padding']}, flip {spec['flip']}; seed {card['seed']}",
                  f"- command: `{card['command']}` ({card['train_wall_s']} s on {card['device']}, torch {card['torch']})",
                  f"- clean test accuracy: **{card['clean_test_accuracy']:.2f}%**"]
        corrupted = card.get("corrupted_accuracy_severity5")
        if corrupted:
            lines.append(f"- no-adaptation accuracy under the 15 corruptions at severity 5: mean "
                         f"**{card['corrupted_mean_accuracy_severity5']:.2f}%**")
            reference = card.get("reference")  # a published number to compare with, kept in the card (data)
            if reference:
                value = reference["corrupted_mean_accuracy_severity5"]
                lines.append(f"- {reference['source']}: {value:.2f}% (difference "
                             f"{card['corrupted_mean_accuracy_severity5'] - value:+.2f})")
            lines += ["", "| " + " | ".join(corrupted) + " |", "|" + "---|" * len(corrupted),
                      "| " + " | ".join(f"{v:.1f}" for v in corrupted.values()) + " |"]
        lines.append("")
    return "\n".join(lines)


def _train_images(card: dict) -> str:
    """Which training images a card's model saw: the whole train split, or its first N (``--train-images``)."""
    n = card.get("train_images")
    return "train split" if n is None or card.get("command", "").find("--train-images") < 0 else \
        f"first {n:,} images of the train split"


def source_model_line(name: str, directory: Path = CHECKPOINT_DIR) -> str:
    """One sentence naming source model ``name`` and what its card says (recipe, clean and corrupted accuracy), for a
    notebook to state which source model its tables used."""
    path = directory / f"{name}.json"
    if not path.exists():
        return f"Source model: `{name}` (no card: train it with `python -m ftta_core train-source --model {name}`)."
    card = json.loads(path.read_text())
    spec = card["spec"]
    images = f" on {card['train_images']:,} training images" if "train_images" in card else ""
    corrupted = card.get("corrupted_mean_accuracy_severity5")
    robust = f", {corrupted:.2f}% on the 15 corruptions at severity 5" if corrupted is not None else ""
    epochs = f"{card['epochs']} epoch" + ("s" if card["epochs"] != 1 else "")
    return (f"Source model: `{name}` ({spec['arch']}, {epochs} on {spec['dataset']}{images}; clean "
            f"{card['clean_test_accuracy']:.2f}%{robust}; card `data/checkpoints/{name}.json`).")
