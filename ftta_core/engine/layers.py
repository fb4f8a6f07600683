"""Client-batched layers: N clients' copies of a layer evaluated in one call on inputs ``[N*B, ...]``.

A layer is either *shared* (one weight for all clients: one big conv over all N*B images) or *per-client*
(weights with a leading client dimension: grouped convolution / batched matmul). BatchNorm always normalises
per client; its statistics come from the current batch, from given per-client statistics, from the source, or
(mode ``custom``) from a *normaliser*: an object the local method installs with ``ClientBank.set_normaliser`` that
returns the (mean, variance) each BN layer uses, given the layer name and the activations of the clients
(RobustBN's EMA statistics, class-balanced BN, ...). See ``Normaliser``.
"""
from __future__ import annotations

from typing import Optional, Protocol, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from .client_conv import KERNELS, auto_kernel

BN_MODES = ("source", "batch", "given", "custom")


def is_bn_stats(name: str, tensor: torch.Tensor) -> bool:
    """True for a TTA-bn statistics entry: [N, 2, C] (mean, biased var; ``ClientBatchNorm2d``) keyed by its module, not a '.weight'/'.bias'."""
    return tensor.dim() == 3 and tensor.shape[1] == 2 and name.rsplit(".", 1)[-1] not in ("weight", "bias")


class Normaliser(Protocol):
    """What a BN layer in mode ``custom`` asks for its statistics (the extension point for RobustBN, BBN, ...).

    ``x`` holds the layer's input for the clients ``clients`` as ``[n, B, C, HW]`` (all N clients with
    ``slice(None)`` in the vectorized bank; ``slice(i, i + 1)`` and n = 1 in the loop bank, one client at a time);
    ``source_mean``/``source_var`` [C] are the layer's source running statistics. Return (mean, biased variance),
    each ``[n, C]``; they may carry gradients (they are used as they are). A normaliser with per-client state keeps
    it with a leading client dimension and reads/writes ``state[clients]``, so both backends give the same result.
    """

    def __call__(self, layer: str, x: torch.Tensor, clients: slice, source_mean: torch.Tensor,
                 source_var: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]: ...


def custom_statistics(bn: nn.Module, xv: torch.Tensor, clients: slice) -> Tuple[torch.Tensor, torch.Tensor]:
    """(mean, var) [n, C] from the normaliser installed in ``bn`` (a ClientBatchNorm2d or StatBatchNorm2d)."""
    if bn.normaliser is None:
        raise RuntimeError("BN mode 'custom' needs a normaliser: call ClientBank.set_normaliser first")
    mean, var = bn.normaliser(bn.layer, xv, clients, bn.running_mean, bn.running_var)
    shape = (xv.shape[0], xv.shape[2])
    if tuple(mean.shape) != shape or tuple(var.shape) != shape:
        raise ValueError(f"normaliser returned statistics of shapes {tuple(mean.shape)}, {tuple(var.shape)} for layer "
                         f"{bn.layer!r}; expected {shape}")
    return mean, var


def expand_clients(x: torch.Tensor, n: int) -> torch.Tensor:
    """Inputs ``x`` [B, ...] shared by ``n`` clients as the per-client rows [n*B, ...] (client-major)."""
    return x.unsqueeze(0).expand(n, *x.shape).reshape(n * x.shape[0], *x.shape[1:])


def shared_input(layer: nn.Module, x: torch.Tensor) -> bool:
    """Whether ``x`` holds ``layer.shared_rows`` inputs common to all clients (``VectorizedBank.forward_shared``)
    rather than each client's rows: the layers before the first client-dependent one ran once for all clients."""
    return layer.shared_rows is not None and layer.n_clients > 1 and x.shape[0] == layer.shared_rows


def _stack(t: Optional[torch.Tensor], n: int, per_client: bool) -> Optional[nn.Parameter]:
    if t is None:
        return None
    data = t.detach().clone()
    if per_client:
        data = data.unsqueeze(0).repeat(n, *([1] * t.dim()))
    return nn.Parameter(data)


# how per-client convolution weights are applied (``engine.client_conv``): "grouped" (one grouped convolution over
# all clients), "split" (one convolution per client on its slice, concatenated) or "unfold" (im2col + one batched
# matmul per client). None (the default): per layer, ``client_conv.auto_kernel``: 'unfold' for the CPU shapes where
# it measured faster (ResNet-8's layer3 and strided 1x1 shortcuts), 'grouped' otherwise; all agree to float rounding
# (tests/test_oracle_client_conv.py).
PER_CLIENT_CONV = tuple(KERNELS)


class ClientConv2d(nn.Module):
    """Conv2d for N clients: shared weight -> one conv over N*B images; per-client weight -> one of the kernels of
    ``engine.client_conv`` (``kernel``: 'grouped', 'split' or 'unfold'; None: ``client_conv.auto_kernel``)."""

    def __init__(self, conv: nn.Conv2d, n_clients: int, per_client: bool) -> None:
        super().__init__()
        self.n_clients, self.per_client = n_clients, per_client
        self.stride, self.padding, self.dilation, self.groups = conv.stride, conv.padding, conv.dilation, conv.groups
        self.out_channels = conv.out_channels
        self.weight = _stack(conv.weight, n_clients, per_client)
        self.bias = _stack(conv.bias, n_clients, per_client)
        self.kernel: Optional[str] = None
        self.shared_rows: Optional[int] = None  # set during VectorizedBank.forward_shared

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.per_client:
            return F.conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)
        if shared_input(self, x):
            x = expand_clients(x, self.n_clients)
        args = (self.stride, self.padding, self.dilation, self.groups)
        kernel = self.kernel or auto_kernel(self.weight, *args, x)
        return KERNELS[kernel](x, self.weight, self.bias, *args)


class ClientLinear(nn.Module):
    """Linear for N clients: shared weight -> one matmul; per-client weight -> batched matmul."""

    def __init__(self, linear: nn.Linear, n_clients: int, per_client: bool) -> None:
        super().__init__()
        self.n_clients, self.per_client = n_clients, per_client
        self.weight = _stack(linear.weight, n_clients, per_client)
        self.bias = _stack(linear.bias, n_clients, per_client)
        self.shared_rows: Optional[int] = None  # set during VectorizedBank.forward_shared

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.per_client:
            return F.linear(x, self.weight, self.bias)
        if shared_input(self, x):
            x = expand_clients(x, self.n_clients)
        n = self.n_clients
        xv = x.view(n, x.shape[0] // n, x.shape[1])
        out = torch.bmm(xv, self.weight.transpose(1, 2))
        if self.bias is not None:
            out = out + self.bias[:, None, :]
        return out.reshape(x.shape[0], -1)


class ClientBatchNorm2d(nn.Module):
    """BatchNorm2d normalising each client's slice with its own statistics (``mode``: source, batch, given, custom)."""

    def __init__(self, bn: nn.BatchNorm2d, n_clients: int, per_client: bool) -> None:
        super().__init__()
        self.n_clients, self.per_client, self.eps = n_clients, per_client, bn.eps
        self.weight = _stack(bn.weight, n_clients, per_client)
        self.bias = _stack(bn.bias, n_clients, per_client)
        self.register_buffer("running_mean", bn.running_mean.detach().clone())
        self.register_buffer("running_var", bn.running_var.detach().clone())
        self.mode = "source"
        self.given: Optional[torch.Tensor] = None  # [N, 2, C]: mean and (biased) variance
        self.last: Optional[torch.Tensor] = None  # [N, 2, C] recorded in batch and custom modes
        self.layer = ""  # the layer's name in the model (set by the bank; passed to the normaliser)
        self.normaliser: Optional[Normaliser] = None
        self.shared_rows: Optional[int] = None  # set during VectorizedBank.forward_shared

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = self.n_clients
        shared = shared_input(self, x)
        if shared and self.mode == "custom":  # a normaliser may keep per-client state: give it each client's rows
            x, shared = expand_clients(x, n), False
        nb, c = x.shape[:2]
        # a shared input (forward_shared) is one client's rows [1, B, C, HW]: what does not depend on the client
        # (batch or source statistics, a shared affine) is computed once and broadcasts against what does; the
        # output stays shared [B, ...] when nothing did, else [n*B, ...]
        rows = 1 if shared else n
        xv = x.view(rows, nb // rows, c, -1)
        if self.mode == "batch":
            # two passes (mean, then mean squared deviation): 3-5x faster on the CPU than var_mean over the
            # non-adjacent dims (1, 3), and as accurate (both ~1e-7 from a float64 reference)
            mean = xv.mean(dim=(1, 3))
            var = (xv - mean[:, None, :, None]).square().mean(dim=(1, 3))
            self.last = torch.stack([mean, var], 1).detach().expand(n, 2, c).contiguous()
        elif self.mode == "given":
            if self.given is None:
                raise RuntimeError("BN mode 'given' needs statistics: call set_bn_stats first")
            mean, var = self.given[:, 0], self.given[:, 1]
        elif self.mode == "custom":
            mean, var = custom_statistics(self, xv, slice(None))
            self.last = torch.stack([mean, var], 1).detach()
        else:
            mean = self.running_mean.expand(rows, c)
            var = self.running_var.expand(rows, c)
        weight = self.weight if self.per_client else self.weight.expand(rows, c)
        bias = self.bias if self.per_client else self.bias.expand(rows, c)
        scale = weight * torch.rsqrt(var + self.eps)
        shift = bias - mean * scale
        return (xv * scale[:, None, :, None] + shift[:, None, :, None]).view(-1, *x.shape[1:])


class StatBatchNorm2d(nn.BatchNorm2d):
    """A plain per-model BatchNorm2d with the same four modes (the loop backend's specification)."""

    def __init__(self, bn: nn.BatchNorm2d) -> None:
        super().__init__(bn.num_features, bn.eps, bn.momentum, bn.affine, bn.track_running_stats,
                         device=bn.running_mean.device, dtype=bn.running_mean.dtype)
        self.load_state_dict(bn.state_dict())
        self.mode = "source"
        self.given: Optional[torch.Tensor] = None  # [2, C]
        self.last: Optional[torch.Tensor] = None
        self.layer, self.client = "", 0  # name in the model and client index (set by the bank)
        self.normaliser: Optional[Normaliser] = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.mode == "batch":
            var, mean = torch.var_mean(x, dim=(0, 2, 3), unbiased=False)
            self.last = torch.stack([mean, var]).detach()
            return F.batch_norm(x, None, None, self.weight, self.bias, True, 0.0, self.eps)
        if self.mode == "given":
            if self.given is None:
                raise RuntimeError("BN mode 'given' needs statistics: call set_bn_stats first")
            return F.batch_norm(x, self.given[0], self.given[1], self.weight, self.bias, False, 0.0, self.eps)
        if self.mode == "custom":
            mean, var = custom_statistics(self, x.reshape(1, x.shape[0], x.shape[1], -1),
                                          slice(self.client, self.client + 1))
            self.last = torch.stack([mean[0], var[0]]).detach()
            # the same arithmetic as ClientBatchNorm2d (x * scale + shift), so both backends agree exactly
            scale = self.weight * torch.rsqrt(var[0] + self.eps)
            shift = self.bias - mean[0] * scale
            return x * scale[None, :, None, None] + shift[None, :, None, None]
        return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0, self.eps)
