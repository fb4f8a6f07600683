"""A plugin: a local method and a strategy of your own, registered under names every ftta process can use.

    python -m ftta_core run --plugin examples/my_plugin.py --local prior_bn --strategy indicator_softmax \
        --dataset embedded_digits --smoke --out runs/my_plugin

``notebooks/60_your_method.ipynb`` loads this file, checks both methods on the two client banks, runs them and puts
them on the leaderboard beside the papers' methods.
"""
import torch

from ftta_core import register_local, register_strategy
from ftta_core.strategies import Strategy
from ftta_core.tta.base import LocalMethod


@register_local("prior_bn")
class PriorBN(LocalMethod):
    """BN adaptation with a source prior (Schneider et al., 2020): each BN layer normalises with a mixture of the
    source statistics (weight ``prior``) and the test batch's (weight: its size); clients share the mixture."""

    shares = "bn_stats"

    def __init__(self, prior: float = 16.0):
        self.prior = prior

    @torch.no_grad()
    def adapt(self, bank, x, regularizer=None):
        bank.set_normaliser(self.statistics)  # BN mode 'custom' asks self.statistics for (mean, var)
        return bank.forward(x, "custom")

    def statistics(self, layer, x, clients, source_mean, source_var):
        w = x.shape[1] / (x.shape[1] + self.prior)  # x: [clients, batch, channels, pixels]
        mean = x.mean(dim=(1, 3))
        var = (x - mean[:, None, :, None]).square().mean(dim=(1, 3))
        return w * mean + (1 - w) * source_mean, w * var + (1 - w) * source_var


@register_strategy("indicator_softmax")
class IndicatorSoftmax(Strategy):
    """W = row-softmax of the negative (mean-scaled) distances between the clients' indicators (FedTSA's upload:
    the frozen source model's mean features of the batch)."""

    needs = ("indicator",)

    def __init__(self, temperature: float = 0.3):
        self.temperature = temperature

    def collaboration(self, inputs):
        d = torch.cdist(inputs.uploads["indicator"].double(), inputs.uploads["indicator"].double())
        return torch.softmax(-d / (self.temperature * d.mean().clamp_min(1e-12)), dim=1).float()
