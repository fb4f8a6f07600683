"""The common in-memory form of an image dataset: uint8 NHWC pixels + int64 labels."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List

import numpy as np
import torch


@dataclass(frozen=True)
class ImageArray:
    """A labelled image set held as ``images`` uint8 [N, H, W, C] and ``labels`` int64 [N]."""

    name: str
    images: np.ndarray
    labels: np.ndarray
    class_names: List[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.images.dtype != np.uint8 or self.images.ndim != 4:
            raise ValueError(f"{self.name}: images must be uint8 [N,H,W,C], got {self.images.dtype} {self.images.shape}")
        if self.labels.shape != (self.images.shape[0],):
            raise ValueError(f"{self.name}: labels shape {self.labels.shape} does not match {self.images.shape[0]} images")

    def __len__(self) -> int:
        return int(self.images.shape[0])

    @property
    def num_classes(self) -> int:
        """Number of classes (from ``class_names`` when given, else from the labels)."""
        return len(self.class_names) if self.class_names else int(self.labels.max()) + 1

    def subset(self, indices: np.ndarray, name: str | None = None) -> "ImageArray":
        """The images at ``indices`` (a new ImageArray)."""
        idx = np.asarray(indices, dtype=np.int64)
        return ImageArray(name or self.name, self.images[idx], self.labels[idx], list(self.class_names))

    def tensors(self, indices: np.ndarray | None = None, device: str | torch.device = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
        """Float images in [0, 1] as [N, C, H, W] and int64 labels, on ``device``."""
        imgs = self.images if indices is None else self.images[np.asarray(indices)]
        labs = self.labels if indices is None else self.labels[np.asarray(indices)]
        x = torch.from_numpy(np.ascontiguousarray(imgs)).to(device).permute(0, 3, 1, 2).float().div_(255.0)
        return x.contiguous(), torch.from_numpy(np.asarray(labs, dtype=np.int64)).to(device)
