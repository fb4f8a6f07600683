"""The kernels of a per-client convolution (N clients' weights [N, C_out, C_in, k, k] on inputs [N*B, C_in, H, W]).

* ``grouped``: one grouped convolution over all clients (clients as groups; the inputs and outputs transposed to
  [B, N*C, H, W] and back);
* ``split``: one convolution per client on its B images (what the loop bank computes), concatenated;
* ``unfold``: im2col (``columns``; a 1x1 convolution as a strided slice) and one batched matmul per client, whose
  backward is two batched matmuls (and the windows' backward for the input's gradient).

All three compute the same convolution (to float rounding; ``tests/test_oracle_client_conv.py``). Which is fastest
depends on the layer's shape: when the weights outweigh the activations (small maps, many channels) the grouped
convolution's weight reorders and its weight gradient dominate and ``unfold`` wins. ``auto_kernel`` picks per
layer from ``CPU_UNFOLD_SHAPES``, measured on a CPU by ``benchmarks/tent_speed_target.py`` (a fixed table, so a
run's arithmetic does not depend on timings).
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn.functional as F

Pair = Tuple[int, int]

# (C_in, C_out, kernel, stride, input height) of the per-client convolutions where 'unfold' ran faster than
# 'grouped' on a CPU (forward + backward, 20 clients x 10 images; benchmarks/results/tent_speed_target_cpu.md):
# ResNet-8's layer3 and its two strided 1x1 shortcuts. Every other shape runs 'grouped'.
CPU_UNFOLD_SHAPES = frozenset({
    (128, 256, 3, 2, 4),  # layer3.conv1
    (256, 256, 3, 1, 2),  # layer3.conv2
    (64, 128, 1, 2, 8),  # layer2.shortcut.0
    (128, 256, 1, 2, 4),  # layer3.shortcut.0
})


def shape_key(weight: torch.Tensor, stride: Pair, x: torch.Tensor) -> Tuple[int, int, int, int, int]:
    """The key of ``CPU_UNFOLD_SHAPES``: (C_in, C_out, kernel height, stride, input height) of a per-client
    convolution with stacked ``weight`` [N, C_out, C_in, kh, kw] on ``x``."""
    return (weight.shape[2], weight.shape[1], weight.shape[3], stride[0], x.shape[-2])


def auto_kernel(weight: torch.Tensor, stride: Pair, padding: Pair, dilation: Pair, groups: int,
                x: torch.Tensor) -> str:
    """The kernel a per-client convolution runs when none is set: 'unfold' for the CPU shapes of
    ``CPU_UNFOLD_SHAPES`` (square kernels and strides, no dilation, no channel groups), else 'grouped'."""
    plain = groups == 1 and dilation == (1, 1) and stride[0] == stride[1] and weight.shape[3] == weight.shape[4]
    if x.device.type == "cpu" and plain and isinstance(padding, tuple) \
            and shape_key(weight, stride, x) in CPU_UNFOLD_SHAPES:
        return "unfold"
    return "grouped"


def grouped_conv(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], stride, padding, dilation,
                 groups: int) -> torch.Tensor:
    """The clients as the groups of one convolution."""
    n, out_channels = weight.shape[:2]
    nb, c, h, w = x.shape
    b = nb // n
    xg = x.view(n, b, c, h, w).transpose(0, 1).reshape(b, n * c, h, w)
    wg = weight.reshape(n * out_channels, *weight.shape[2:])
    out = F.conv2d(xg, wg, None if bias is None else bias.reshape(-1), stride, padding, dilation, groups * n)
    return out.view(b, n, out_channels, *out.shape[2:]).transpose(0, 1).reshape(nb, out_channels, *out.shape[2:])


def split_conv(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], stride, padding, dilation,
               groups: int) -> torch.Tensor:
    """One convolution per client on its ``B`` images, concatenated."""
    n = weight.shape[0]
    xs = x.view(n, x.shape[0] // n, *x.shape[1:])
    biases = [None] * n if bias is None else bias
    return torch.cat([F.conv2d(xs[i], weight[i], biases[i], stride, padding, dilation, groups) for i in range(n)])


def columns(x: torch.Tensor, n: int, kernel: Pair, stride: Pair, padding: Pair, dilation: Pair
            ) -> torch.Tensor:
    """im2col of ``x`` [N*B, C, H, W] as each client's rows [N, B*Ho*Wo, C*kh*kw] (columns ordered as the weights'
    (C, kh, kw)): windows as a strided view (``Tensor.unfold``) and one copy. Not ``F.unfold``: with two threads on a
    loaded CPU its kernel took ~1 s per call at times (ResNet-8's layer3, 200 images) against ~5 ms here."""
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = kernel, stride, padding, dilation
    if (kh, kw) == (1, 1) and (ph, pw) == (0, 0):  # a 1x1 convolution: a strided slice
        windows = x[:, :, ::sh, ::sw].permute(0, 2, 3, 1)  # [N*B, Ho, Wo, C]
    else:
        padded = F.pad(x, (pw, pw, ph, ph)) if ph or pw else x
        windows = padded.unfold(2, dh * (kh - 1) + 1, sh).unfold(3, dw * (kw - 1) + 1, sw)
        if (dh, dw) != (1, 1):
            windows = windows[..., ::dh, ::dw]
        windows = windows.permute(0, 2, 3, 1, 4, 5)  # [N*B, Ho, Wo, C, kh, kw]
    return windows.reshape(n, -1, x.shape[1] * kh * kw)


def unfold_conv(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], stride: Pair, padding: Pair,
                dilation: Pair, groups: int) -> torch.Tensor:
    """im2col (``columns``) and one batched matmul per client: [N, C_out, C*kh*kw] @ [N, C*kh*kw, B*L] (``groups``
    must be 1; ``padding`` a pair of ints)."""
    if groups != 1:
        raise ValueError("the 'unfold' per-client convolution needs groups == 1")
    n, co, c, kh, kw = weight.shape
    nb, _, h, w = x.shape
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    ho, wo = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1, (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    cols = columns(x, n, (kh, kw), stride, padding, dilation)
    # weights on the left: the weights' gradient comes out of the backward's matmul in their own layout (no copy
    # of the large per-client weights; only the small activations are transposed)
    out = torch.bmm(weight.reshape(n, co, -1), cols.transpose(1, 2))  # [N, C_out, B*L]
    if bias is not None:
        out = out + bias[:, :, None]
    return out.view(n, co, nb // n, ho * wo).transpose(1, 2).reshape(nb, co, ho, wo)


KERNELS = {"grouped": grouped_conv, "split": split_conv, "unfold": unfold_conv}
