"""FedAcross+'s study on the command line (``python -m ftta_core study fedacross ACTION``; ``studies.commands`` registers it)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ftta_core.study_registry import StudyAction
from studies.common import passthrough


def _pretrain_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--recipe", default="fedacross_resnet18_cifar10")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epochs", type=float, help="override the recipe's epoch budget")
    p.add_argument("--max-images", type=int, dest="max_images", help="pre-train on this many source images")
    p.add_argument("--out-dir", type=Path, dest="out_dir", help="checkpoint folder (default data/checkpoints/fedacross)")


def _pretrain(args: argparse.Namespace) -> int:
    from ftta_core.cli import this_command
    from ftta_core.fedacross.pretrain import CHECKPOINT_DIR, train_recipe

    overrides = {k: getattr(args, k) for k in ("epochs", "max_images") if getattr(args, k) is not None}
    try:
        path = train_recipe(args.recipe, args.seed, this_command(), True, args.out_dir or CHECKPOINT_DIR, **overrides)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(path.with_suffix(".json").read_text())
    print(f"wrote {path}")
    return 0


SUMMARY = "FedAcross+: the server model's pre-training and the k-shot client experiments"
ACTIONS = {
    "pretrain": StudyAction(
        "pre-train the server model (ResNet-18 + adaptation module)", _pretrain_arguments, _pretrain,
        "Pre-train a FedAcross+ server model recipe (ftta_core.fedacross.RECIPES) on its source data set and write "
        "data/checkpoints/fedacross/NAME.{pt,json}. The client-side experiments live in "
        "notebooks/50_fedacross.ipynb."),
    "a2": passthrough("studies.fedacross.study", "the A2 settling comparison on CIFAR-10-C (g, untrained A, A "
                                                 "trained as Algorithm 1)"),
}
