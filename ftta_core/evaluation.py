"""No-adaptation evaluation of a model on corrupted test sets."""
from __future__ import annotations

from typing import Dict, Optional, Sequence

from torch import nn

from .data.base import ImageArray
from .stream import CorruptedDomains
from .training import evaluate


def corrupted_accuracy(model: nn.Module, test: ImageArray, severity: int = 5, seed: int = 0,
                       corruptions: Optional[Sequence[str]] = None, device: str = "cpu") -> Dict[str, float]:
    """Accuracy (%) of ``model`` (eval mode, source BN statistics) on ``test`` under each corruption."""
    from .corruptions import CORRUPTIONS
    from .data.root import cache_dir

    names = list(corruptions or CORRUPTIONS)
    domains = CorruptedDomains(test, names, severity, seed=seed, cache_dir=cache_dir() / "corrupted")
    out = {}
    for d, name in enumerate(names):
        shifted = ImageArray(f"{test.name}-{name}", domains.domain_images(d), test.labels, test.class_names)
        out[name] = round(100 * evaluate(model, shifted, device=device), 2)
    return out


def source_metrics(model: nn.Module, test: ImageArray, severity: int = 5, device: str = "cpu") -> Dict[str, object]:
    """Clean accuracy, accuracy under every corruption at ``severity`` and their mean (the model card numbers)."""
    per_corruption = corrupted_accuracy(model, test, severity=severity, device=device)
    return {"clean_test_accuracy": round(100 * evaluate(model, test, device=device), 2),
            f"corrupted_accuracy_severity{severity}": per_corruption,
            f"corrupted_mean_accuracy_severity{severity}": round(sum(per_corruption.values()) / len(per_corruption), 2)}
