"""RoTTA (Yuan et al., CVPR 2023): RobustBN, a category-balanced memory (CSTU) and a teacher-student on the memory.

Constants and control flow follow ``classification/methods/rotta.py`` of mariodoebler/test-time-adaptation
(``../shared/reference/tta-methods-and-cifar-c.md`` section 2):

- **RobustBN** (alpha = 0.05): in train mode a layer normalises with and stores
  ``s <- (1 - alpha) s + alpha * batch(s)`` (mean and biased variance; gradients flow through the batch part);
  in eval mode it uses the stored ``s`` (initialised from the source). Student and teacher keep their own ``s``.
- **CSTU memory** (capacity 64, per-class capacity 64 / K): every test sample enters with the teacher's pseudo-label
  ``y`` and entropy ``H``; score ``lambda_t * sigmoid(age / 64) + lambda_u * H / ln K`` (a new sample has age 0).
  If class ``y`` is below its capacity and the memory is not full, it is added; if the memory is full, the item
  with the highest score among the majority classes is replaced when that score exceeds the new sample's; if class
  ``y`` is at capacity, the same within class ``y``. Ties go to the last item (classes in order, oldest first).
  All items age by one per offered sample.
- Every 64 samples: the teacher (RobustBN train mode) sees the memory, the student sees a strong (CoTTA)
  augmentation of it; loss ``sum_m w(a_m) CE(p_teacher_m, p_student_m) / M`` with ``w(a) = exp(-a) / (1 + exp(-a))``,
  ``a = age / 64``; one Adam step (lr 1e-3) on the student's BN affine parameters; teacher EMA
  ``theta_T <- (1 - nu) theta_T + nu theta_S`` with nu = 0.001. The output is the teacher's prediction, made before
  the updates of the current batch.

Clients keep their own memory (a client's samples arrive in the same order in both backends, so updates happen at
the same samples everywhere); memories of different occupancy are padded to one batch and masked out of the
statistics and the loss, so both backends agree. Shared with the server: the student's BN affine parameters, the
teacher's (``teacher.<name>``) and, with ``mix_statistics``, both RobustBN statistics (``rbn.<role>.<layer>``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import torch

from ..engine.bank import ClientBank, ForwardOutput, LossFn
from ..validation import check_choice
from .augment import STRENGTHS, augment
from .base import combine, regularizer_on
from .basic import entropy
from .normalised import NormalisedMethod, StatefulNormaliser, class_moments

ROLES = ("student", "teacher")


class RobustBN(StatefulNormaliser):
    """RoTTA's RobustBN for all clients: EMA statistics per role (student/teacher), layer and client."""

    def __init__(self, alpha: float = 0.05) -> None:
        super().__init__()
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f"alpha must be in [0, 1], got {alpha}")
        self.alpha = alpha
        self.role, self.train = "teacher", False
        self.weights: Optional[torch.Tensor] = None  # [N, B]: 0 leaves a (padding) sample out of the statistics

    def configure(self, role: str, train: bool, weights: Optional[torch.Tensor] = None) -> None:
        """Whose statistics the next forwards use, whether they update them, and the samples' weights."""
        check_choice("role", role, ROLES)
        self.role, self.train, self.weights = role, train, weights

    def __call__(self, layer: str, x: torch.Tensor, clients: slice, source_mean: torch.Tensor,
                 source_var: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        stats = self.get(f"{self.role}.{layer}", lambda: self.source_init(source_mean, source_var))
        old = stats[clients].clone()
        if not self.train:
            return old[:, 0], old[:, 1]
        zeros = torch.zeros(x.shape[:2], dtype=torch.long, device=x.device)
        weights = None if self.weights is None else self.weights[clients]
        b_mean, b_var, _ = class_moments(x, zeros, 1, weights)
        mean = (1 - self.alpha) * old[:, 0] + self.alpha * b_mean[:, 0]
        var = (1 - self.alpha) * old[:, 1] + self.alpha * b_var[:, 0]
        stats[clients] = torch.stack([mean, var], 1).detach()
        return mean, var


@dataclass
class MemoryItem:
    """One stored sample: its image, the teacher's entropy when it arrived, and when it arrived."""

    image: torch.Tensor
    uncertainty: float
    born: int


class CategoryBalancedMemory:
    """RoTTA's CSTU memory of one client (category-balanced, timeliness and uncertainty scored)."""

    def __init__(self, capacity: int, n_classes: int, lambda_t: float = 1.0, lambda_u: float = 1.0) -> None:
        self.capacity, self.n_classes, self.lambda_t, self.lambda_u = capacity, n_classes, lambda_t, lambda_u
        self.per_class = capacity / n_classes
        self.classes: List[List[MemoryItem]] = [[] for _ in range(n_classes)]
        self.clock = 0  # samples offered so far; an item's age is clock - born

    def class_counts(self) -> List[int]:
        """Stored items per class."""
        return [len(c) for c in self.classes]

    def occupancy(self) -> int:
        """Stored items."""
        return sum(self.class_counts())

    def score(self, age: int, uncertainty: float) -> float:
        """``lambda_t * sigmoid(age / capacity) + lambda_u * uncertainty / ln K`` (higher = replaced first)."""
        return (self.lambda_t / (1 + math.exp(-age / self.capacity))
                + self.lambda_u * uncertainty / math.log(self.n_classes))

    def add(self, image: torch.Tensor, label: int, uncertainty: float) -> bool:
        """Offer a sample with pseudo-label ``label``; return whether it was stored. Every item ages by one."""
        stored = self._make_room(label, self.score(0, uncertainty))
        if stored:
            self.classes[label].append(MemoryItem(image, float(uncertainty), self.clock))
        self.clock += 1
        return stored

    def _make_room(self, label: int, new_score: float) -> bool:
        if len(self.classes[label]) < self.per_class:
            if self.occupancy() < self.capacity:
                return True
            counts = self.class_counts()
            return self._evict([k for k, c in enumerate(counts) if c == max(counts)], new_score)
        return self._evict([label], new_score)

    def _evict(self, classes: List[int], new_score: float) -> bool:
        best: Optional[Tuple[float, int, int]] = None
        for k in classes:
            for idx, item in enumerate(self.classes[k]):
                s = self.score(self.clock - item.born, item.uncertainty)
                if best is None or s >= best[0]:
                    best = (s, k, idx)
        if best is None:
            return True
        if best[0] > new_score:
            self.classes[best[1]].pop(best[2])
            return True
        return False

    def contents(self) -> Tuple[List[torch.Tensor], List[float]]:
        """Stored images (classes in order, oldest first) and their ages / capacity."""
        items = [item for c in self.classes for item in c]
        return [i.image for i in items], [(self.clock - i.born) / self.capacity for i in items]

    def state_dict(self) -> dict:
        """Tensors holding the memory (for resuming)."""
        items = [(k, item) for k, c in enumerate(self.classes) for item in c]
        return {"clock": self.clock,
                "labels": torch.tensor([k for k, _ in items], dtype=torch.long),
                "born": torch.tensor([i.born for _, i in items], dtype=torch.long),
                "uncertainty": torch.tensor([i.uncertainty for _, i in items], dtype=torch.float64),
                "images": torch.stack([i.image for _, i in items]) if items else None}

    def load_state_dict(self, state: dict) -> None:
        """Restore ``state_dict``."""
        self.clock = int(state["clock"])
        self.classes = [[] for _ in range(self.n_classes)]
        for j, k in enumerate(state["labels"].tolist()):
            self.classes[k].append(MemoryItem(state["images"][j].clone(), float(state["uncertainty"][j]),
                                              int(state["born"][j])))


def timeliness(ages: torch.Tensor) -> torch.Tensor:
    """RoTTA's instance weight ``exp(-a) / (1 + exp(-a))`` of normalised ages ``a``."""
    return torch.exp(-ages) / (1 + torch.exp(-ages))


class RoTTA(NormalisedMethod):
    """RoTTA: RobustBN + CSTU memory + timeliness-weighted teacher-student on the memory (see the module doc)."""

    name = "rotta"
    stats_prefix = "rbn."

    def __init__(self, memory_size: int = 64, update_frequency: int = 64, alpha: float = 0.05, nu: float = 0.001,
                 lambda_t: float = 1.0, lambda_u: float = 1.0, optimizer: str = "adam", lr: float = 1e-3,
                 momentum: float = 0.0, weight_decay: float = 0.0, augmentation: str = "cotta",
                 mix_statistics: bool = True, seed: int = 0) -> None:
        if memory_size < 1 or update_frequency < 1:
            raise ValueError(f"memory_size and update_frequency must be >= 1, got {memory_size}, {update_frequency}")
        if not 0.0 <= nu <= 1.0:
            raise ValueError(f"nu must be in [0, 1], got {nu}")
        check_choice("augmentation", augmentation, tuple(STRENGTHS))
        super().__init__(RobustBN(alpha), optimizer, lr, momentum, weight_decay, mix_statistics, seed)
        self.memory_size, self.update_frequency, self.nu = memory_size, update_frequency, nu
        self.lambda_t, self.lambda_u, self.augmentation = lambda_t, lambda_u, augmentation
        self.memories: List[CategoryBalancedMemory] = []
        self.teacher: Dict[str, torch.Tensor] = {}
        self.seen = 0      # samples offered to each client's memory
        self.updates = 0   # memory updates so far
        self._target: Optional[Tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = None

    def loss(self, out: ForwardOutput, params: Dict[str, torch.Tensor], x: torch.Tensor, clients: slice) -> torch.Tensor:
        """Timeliness-weighted soft cross-entropy of the student to the teacher on the memory (masked mean)."""
        if self._target is None:
            raise RuntimeError("RoTTA.loss is only defined during a memory update")
        probs, weights, counts = (t[clients] for t in self._target)
        ce = -(probs * out.logits.log_softmax(-1)).sum(-1)
        return (ce * weights).sum(1) / counts.clamp_min(1)

    def adapt(self, bank: ClientBank, x: torch.Tensor, regularizer: Optional[LossFn] = None) -> ForwardOutput:
        norm = self.install(bank)
        if not self.teacher:
            self.teacher = bank.get_params()
        norm.configure("teacher", False)
        with torch.no_grad():
            out = bank.forward(x, "custom", params=self.teacher)
        if not self.memories:
            self.memories = [CategoryBalancedMemory(self.memory_size, out.logits.shape[-1], self.lambda_t,
                                                    self.lambda_u) for _ in range(bank.n_clients)]
        labels = out.logits.argmax(-1).tolist()
        uncertainty = entropy(out.logits).tolist()
        for i in range(x.shape[1]):
            for c, memory in enumerate(self.memories):
                memory.add(x[c, i].detach().clone(), labels[c][i], uncertainty[c][i])
            self.seen += 1
            if self.seen % self.update_frequency == 0:
                self._update(bank, x, regularizer)
        norm.configure("teacher", False)
        self.step += 1
        return out

    def _memory_batch(self, like: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Every client's memory padded to one batch [N, M, C, H, W], the normalised ages and the mask [N, M]."""
        contents = [m.contents() for m in self.memories]
        width = max(len(images) for images, _ in contents)
        data = like.new_zeros((len(contents), width, *like.shape[2:]))
        ages = torch.zeros(len(contents), width, device=like.device)
        mask = torch.zeros(len(contents), width, device=like.device)
        for c, (images, age) in enumerate(contents):
            if images:
                data[c, :len(images)] = torch.stack(images)
                ages[c, :len(age)] = torch.tensor(age, device=like.device)
                mask[c, :len(images)] = 1.0
        return data, ages, mask

    def _update(self, bank: ClientBank, x: torch.Tensor, regularizer: Optional[LossFn]) -> None:
        """One teacher-student step on the memory, then the teacher EMA."""
        norm = self.normaliser
        data, ages, mask = self._memory_batch(x)
        strong = augment(data, self.generator("augment", self.updates), self.augmentation)
        norm.configure("teacher", True, mask)
        with torch.no_grad():
            probs = bank.forward(data, "custom", params=self.teacher).logits.softmax(-1)
        self._target = (probs, mask * timeliness(ages), mask.sum(1))
        norm.configure("student", True, mask)
        try:
            bank.adapt(strong, combine(self.loss, regularizer_on(regularizer, strong)), "custom")
        finally:
            self._target = None
            norm.configure("teacher", False)
        student = bank.get_params()
        self.teacher = {k: (1 - self.nu) * v + self.nu * student[k] for k, v in self.teacher.items()}
        self.updates += 1

    @torch.no_grad()
    def predict(self, bank: ClientBank, x: torch.Tensor) -> ForwardOutput:
        """The teacher's prediction (its parameters and RobustBN statistics, eval mode)."""
        self.install(bank).configure("teacher", False)
        return bank.forward(x, "custom", params=self.teacher or None)

    def bn_statistics(self, bank: ClientBank) -> Dict[str, torch.Tensor]:
        """The teacher's RobustBN statistics per layer [N, 2, C] (what pFedBBN compares)."""
        prefix = "teacher."
        return {k[len(prefix):]: v.clone() for k, v in self.normaliser.state.items() if k.startswith(prefix)}

    def extra_state(self) -> Dict[str, torch.Tensor]:
        return {f"teacher.{k}": v.clone() for k, v in self.teacher.items()}

    def load_extra_state(self, state: Dict[str, torch.Tensor]) -> None:
        teacher = {k[len("teacher."):]: v.clone() for k, v in state.items() if k.startswith("teacher.")}
        if teacher:
            self.teacher = teacher

    def state_dict(self) -> dict:
        return {**super().state_dict(), "seen": self.seen, "updates": self.updates,
                "teacher": {k: v.clone() for k, v in self.teacher.items()},
                "n_classes": self.memories[0].n_classes if self.memories else 0,
                "memories": [m.state_dict() for m in self.memories]}

    def load_state_dict(self, state: dict) -> None:
        if not state:
            return
        super().load_state_dict(state)
        self.seen, self.updates = int(state["seen"]), int(state["updates"])
        self.teacher = {k: v.clone() for k, v in state["teacher"].items()}
        self.memories = []
        for saved in state["memories"]:
            memory = CategoryBalancedMemory(self.memory_size, int(state["n_classes"]), self.lambda_t, self.lambda_u)
            memory.load_state_dict(saved)
            self.memories.append(memory)
