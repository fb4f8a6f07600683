"""pFedSD (Jin et al. 2022): FedAvg plus self-distillation from the client's previous personalised model."""
from __future__ import annotations

from typing import Optional

import torch

from ..engine.bank import ClientBank, ForwardOutput, LossFn
from .base import ClientHooks, InputRegularizer, RemembersStates
from .basic import FedAvg
from ..validation import check_choice

TEACHERS = ("local", "received")


def distillation_loss(student: torch.Tensor, teacher: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Per-client ``T^2 mean_b KL(softmax(teacher/T) || softmax(student/T))`` [n] from logits [n, B, K]."""
    t = teacher / temperature
    kl = (t.softmax(-1) * (t.log_softmax(-1) - (student / temperature).log_softmax(-1))).sum(-1)
    return temperature ** 2 * kl.mean(-1)


class PFedSD(ClientHooks, RemembersStates, FedAvg):
    """FedAvg + ``lam * distillation_loss(student, teacher)``, the teacher run on the current batch.

    teacher 'local' (default): the client's previous personalised model = its locally adapted, pre-mix model of
    the last step (pFedSD paper; Fling's ``local_model_pre``). 'received': the model received at the last mix,
    which the client starts from, so the KL and its gradient vanish at the first local iteration.
    """

    name = "pfedsd"

    def __init__(self, lam: float = 1.0, temperature: float = 1.0, teacher: str = "local") -> None:
        if lam < 0:
            raise ValueError(f"lam must be >= 0, got {lam}")
        if not temperature > 0:
            raise ValueError(f"temperature must be positive, got {temperature}")
        check_choice("teacher", teacher, TEACHERS)
        self.lam, self.temperature, self.teacher = lam, temperature, teacher
        self.keep = (teacher,)

    def regularizer(self, bank: ClientBank, x: torch.Tensor) -> Optional[LossFn]:
        teacher = self.memory.params(bank, self.teacher)
        if teacher is None or self.lam == 0:
            return None
        lam, temperature = self.lam, self.temperature

        def targets(inputs: torch.Tensor) -> torch.Tensor:
            return bank.forward(inputs, "batch", params=teacher).logits

        def loss(out: ForwardOutput, teacher_logits: torch.Tensor, clients: slice) -> torch.Tensor:
            return lam * distillation_loss(out.logits, teacher_logits[clients], temperature)

        return InputRegularizer(targets, loss, x)
