"""Drafters beyond the draft model (``specdec.core.model_drafter``): n-gram prompt lookup,
suffix matching, planned suffix drafts, hybrid (suffix, then the model), predictions. Each
is a ``specdec.core.drafter.Drafter``."""

from specdec.drafters.ngram import NgramDrafter

__all__ = ["NgramDrafter"]
