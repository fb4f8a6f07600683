"""Oracle of the per-client convolution (unit ``client_conv``): in float64, on every convolution shape of the ResNet-8
and of the digits CNN, forward and backward (gradients of the inputs and of the stacked weights), every kernel of
``ClientConv2d`` and its default (``client_conv.auto_kernel``, per shape) equal

* the frozen previous implementation (``tests/frozen/client_conv_v1.py``, verbatim from commit c9857d8), and
* the per-client loop (one ``F.conv2d`` per client on its images: what the loop bank computes),

to float64 rounding."""
from __future__ import annotations

import copy

from typing import Dict, List, Optional, Tuple

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from frozen import client_conv_v1 as frozen
from ftta_core.engine.client_conv import CPU_UNFOLD_SHAPES, auto_kernel
from ftta_core.engine.layers import PER_CLIENT_CONV, ClientConv2d
from ftta_core.models import build_model

pytestmark = pytest.mark.usefixtures("one_thread")

N, B = 3, 2  # clients, images per client
RTOL, ATOL = 1e-9, 1e-11


def conv_shapes(model: nn.Module, image: Tuple[int, ...]) -> List[Tuple[str, nn.Conv2d, Tuple[int, ...]]]:
    """(name, convolution, input shape [C, H, W]) of every Conv2d of ``model`` on one ``image``-shaped input."""
    shapes = []
    hooks = [m.register_forward_hook(lambda m, i, o, name=name: shapes.append((name, m, tuple(i[0].shape[1:]))))
             for name, m in model.named_modules() if isinstance(m, nn.Conv2d)]
    with torch.no_grad():
        model.eval()(torch.rand(1, *image))
    for h in hooks:
        h.remove()
    return shapes


def all_shapes(digits: nn.Module) -> List[Tuple[str, nn.Conv2d, Tuple[int, ...]]]:
    """Every convolution of the ResNet-8 (32x32) and the digits CNN (16x16), one with a bias, one dilated."""
    resnet = [(f"resnet8.{n}", c, s) for n, c, s in conv_shapes(build_model("resnet8"), (3, 32, 32))]
    cnn = [(f"digits.{n}", c, s) for n, c, s in conv_shapes(digits, (digits_channels(digits), 16, 16))]
    return resnet + cnn + [("biased", nn.Conv2d(4, 6, 3, 2, 1, bias=True), (4, 7, 7)),
                           ("dilated", nn.Conv2d(4, 6, 3, 1, 2, dilation=2, bias=False), (4, 7, 7))]


def digits_channels(model: nn.Module) -> int:
    return next(m for m in model.modules() if isinstance(m, nn.Conv2d)).in_channels


def per_client_loop(x: torch.Tensor, w: torch.Tensor, bias: Optional[torch.Tensor], conv: nn.Conv2d) -> torch.Tensor:
    """The specification: one convolution per client on its B images."""
    xs = x.view(N, B, *x.shape[1:])
    return torch.cat([F.conv2d(xs[i], w[i], None if bias is None else bias[i], conv.stride, conv.padding,
                               conv.dilation, conv.groups) for i in range(N)])


def forward_backward(layer_or_fn, x: torch.Tensor, w: torch.Tensor, bias: Optional[torch.Tensor],
                     upstream: torch.Tensor) -> Dict[str, torch.Tensor]:
    """Output and gradients (inputs, weights, bias) of a per-client convolution."""
    x, w = x.detach().clone().requires_grad_(True), w.detach().clone().requires_grad_(True)
    b = None if bias is None else bias.detach().clone().requires_grad_(True)
    out = layer_or_fn(x, w, b)
    wrt = [x, w] + ([] if b is None else [b])
    grads = torch.autograd.grad(out, wrt, upstream)
    result = {"out": out.detach(), "grad_x": grads[0], "grad_w": grads[1]}
    if b is not None:
        result["grad_b"] = grads[2]
    return result


def as_layer(cls, conv: nn.Conv2d, kernel: Optional[str]):
    """Run a (new or frozen) ClientConv2d with the given stacked weights and bias."""

    def run(x, w, b):
        layer = cls(conv, N, per_client=True).double()
        layer.kernel = kernel
        del layer.weight
        layer.weight = w
        if b is not None:
            del layer.bias
            layer.bias = b
        return layer(x)

    return run


def assert_close(got: Dict[str, torch.Tensor], want: Dict[str, torch.Tensor], what: str) -> None:
    assert got.keys() == want.keys(), what
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=RTOL, atol=ATOL, msg=lambda m: f"{what} {k}: {m}")


@pytest.fixture(scope="module")
def shapes(digits_model):
    return all_shapes(copy.deepcopy(digits_model))  # the fixture is shared by the session: never cast it


def test_every_kernel_equals_the_frozen_implementation_and_the_per_client_loop(shapes):
    gen = torch.Generator().manual_seed(0)
    for name, conv, shape in shapes:
        conv = conv.double()
        x = torch.randn(N * B, *shape, generator=gen, dtype=torch.float64)
        w = torch.randn(N, *conv.weight.shape, generator=gen, dtype=torch.float64)
        bias = None if conv.bias is None else torch.randn(N, conv.out_channels, generator=gen, dtype=torch.float64)
        out_shape = F.conv2d(x[:1], w[0], None, conv.stride, conv.padding, conv.dilation, conv.groups).shape[1:]
        upstream = torch.randn(N * B, *out_shape, generator=gen, dtype=torch.float64)
        loop = forward_backward(lambda x, w, b: per_client_loop(x, w, b, conv), x, w, bias, upstream)
        before = forward_backward(as_layer(frozen.ClientConv2d, conv, None), x, w, bias, upstream)
        assert_close(before, loop, f"{name}: frozen vs loop")  # the frozen copy is the one the old runs used
        for kernel in (None, *PER_CLIENT_CONV):
            now = forward_backward(as_layer(ClientConv2d, conv, kernel), x, w, bias, upstream)
            assert_close(now, before, f"{name} kernel {kernel}: new vs frozen")
            assert_close(now, loop, f"{name} kernel {kernel}: new vs loop")


def test_the_default_picks_unfold_on_resnet8_layer3_and_the_strided_shortcuts(shapes):
    """The shapes the CPU table names are ResNet-8's, so the default path above ran 'unfold' there."""
    picked = {}
    for name, conv, shape in shapes:
        x = torch.zeros(N * B, *shape)
        w = torch.zeros(N, *conv.weight.shape)
        picked[name] = auto_kernel(w, conv.stride, conv.padding, conv.dilation, conv.groups, x)
    unfold = {n for n, k in picked.items() if k == "unfold"}
    assert unfold == {"resnet8.layer3.conv1", "resnet8.layer3.conv2", "resnet8.layer2.shortcut.0",
                      "resnet8.layer3.shortcut.0"}
    assert len(CPU_UNFOLD_SHAPES) == len(unfold)
