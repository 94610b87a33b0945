"""Drafters propose K tokens per round: a small model, or n-gram prompt lookup."""

from specdec.drafters.base import Draft, Drafter
from specdec.drafters.model import ModelDrafter
from specdec.drafters.ngram import NgramDrafter

__all__ = ["Draft", "Drafter", "ModelDrafter", "NgramDrafter"]
