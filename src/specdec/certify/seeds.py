"""Stable seed derivation: every random stream of a certificate comes from one ``SeedPlan``,
made once from --seed, which hands out streams by label; so a unit (a case, a sequence) can
be recomputed alone, in any order, when a run resumes."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import torch

from specdec.core.sampling import make_generator


def derive_seed(base: int, *labels: object) -> int:
    """A 63-bit seed determined by ``base`` and the labels (independent streams per label)."""
    text = "\x1f".join([str(int(base)), *(str(x) for x in labels)])
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


@dataclass(frozen=True)
class SeedPlan:
    """The random streams of one run, each named by its labels (``derive_seed(base,
    *labels)``): as an int for an API that takes a seed, as a torch or a numpy generator, or
    as the plan of one unit (``child``), whose streams are labelled below the unit's."""

    base: int

    def seed(self, *labels: object) -> int:
        return derive_seed(self.base, *labels)

    def child(self, *labels: object) -> SeedPlan:
        return SeedPlan(self.seed(*labels))

    def generator(self, *labels: object) -> torch.Generator:
        """A CPU torch generator of its own."""
        seed = self.seed(*labels)
        return make_generator(seed)

    def rng(self, *labels: object) -> np.random.Generator:
        """A numpy generator of its own."""
        seed = self.seed(*labels)
        return np.random.default_rng(seed)
