"""RDumb (``rdumb``): Tent whose clients go back to the source model every ``reset_every`` steps."""
from __future__ import annotations

from ..engine.bank import ClientBank
from .anchored_tent import AnchoredTent


class RDumb(AnchoredTent):
    """Tent with periodic resets (Press et al., NeurIPS'23, "RDumb: A simple approach that questions our progress in
    continual test-time adaptation"; the paper resets every T = 1000 steps).

    Rule: the step counter t counts ``adapt`` calls from 0 (one per batch; FedAvg+FT's fine-tuning ``adapt`` counts
    as one too). At the start of ``adapt`` with ``t > 0`` and ``t % reset_every == 0`` every client is reset to the
    source -- its trained parameters to the source's (``source``, snapshotted at the first ``adapt``, never the mixed
    model), its optimiser state forgotten (Adam moments and step count, momentum buffers: ``bank.reset_optimizer``),
    and with ``bn='running'`` its running BN statistics back to the source model's -- and then adapts on the batch as
    a fresh Tent client would. Between resets it is Tent. The paper's RDumb resets ETA (EATA without the Fisher
    term); here the method reset is Tent, with all of Tent's options.
    """

    name = "rdumb"

    def __init__(self, reset_every: int = 1000, params: str = "all", optimizer: str = "sgd", lr: float = 1e-4,
                 momentum: float = 0.0, weight_decay: float = 0.0, steps: int = 1, bn: str = "batch",
                 bn_momentum: float = 0.1, seed: int = 0) -> None:
        super().__init__(params=params, optimizer=optimizer, lr=lr, momentum=momentum, weight_decay=weight_decay,
                         steps=steps, bn=bn, bn_momentum=bn_momentum, seed=seed)
        if isinstance(reset_every, bool) or int(reset_every) != reset_every or reset_every < 1:
            raise ValueError(f"reset_every must be an integer >= 1, got {reset_every}")
        self.reset_every = int(reset_every)

    def reset(self, bank: ClientBank) -> None:
        """Every client back to the source: trained parameters, optimiser state and (bn='running') running stats."""
        bank.set_params(self.source)
        bank.reset_optimizer()
        if self.running is not None:
            self.running.state.clear()  # re-created from the source model's BN buffers on the next forward

    def before_adapt(self, bank: ClientBank) -> None:
        if self.step > 0 and self.step % self.reset_every == 0:
            self.reset(bank)
