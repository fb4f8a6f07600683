"""Small layers shared by the model definitions."""
from __future__ import annotations

import torch
from torch import nn


class MaxPool2d(nn.MaxPool2d):
    """``nn.MaxPool2d`` with the same result, computed in channels-last layout on the CPU.

    PyTorch's CPU max-pool kernel for contiguous NCHW tensors is about 10x slower than its channels-last kernel
    (25 ms vs 2.3 ms for ResNet-8's stem on 200 images, 2 threads; ``benchmarks/README.md``). A maximum is exact, so
    converting there and back changes no value; on other devices this is the plain layer.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type != "cpu" or x.dim() != 4:
            return super().forward(x)
        out = super().forward(x.contiguous(memory_format=torch.channels_last))
        return out.contiguous()
