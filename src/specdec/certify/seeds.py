"""Stable seed derivation: every random stream of a certificate comes from --seed and a label,
so a unit (a case, a sequence) can be recomputed alone, in any order, when a run resumes."""

from __future__ import annotations

import hashlib


def derive_seed(base: int, *labels: object) -> int:
    """A 63-bit seed determined by ``base`` and the labels (independent streams per label)."""
    text = "\x1f".join([str(int(base)), *(str(x) for x in labels)])
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1
