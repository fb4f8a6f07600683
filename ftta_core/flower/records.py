"""Tensors <-> Flower records (``ArrayRecord``: one named array per tensor, serialised as bytes)."""
from __future__ import annotations

from typing import Dict

import torch
from flwr.app import ArrayRecord


def to_record(tensors: Dict[str, torch.Tensor]) -> ArrayRecord:
    """An ArrayRecord of detached CPU copies of ``tensors``."""
    return ArrayRecord({k: v.detach().cpu().contiguous().clone() for k, v in tensors.items()})


def from_record(record: ArrayRecord) -> Dict[str, torch.Tensor]:
    """The tensors of an ArrayRecord (CPU)."""
    return dict(record.to_torch_state_dict())


def record_bytes(record: ArrayRecord) -> int:
    """Payload bytes of an ArrayRecord."""
    return sum(len(a.data) for a in record.values())
