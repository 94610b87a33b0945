"""User-facing error types.

Every error a user can cause (bad flag, bad model file, mismatched models) is a subclass of
``SpecdecError``, which is a ``ValueError``; the CLI turns them into one-line messages and a
non-zero exit. ``assert`` is reserved for internal invariants.
"""

from __future__ import annotations


class SpecdecError(ValueError):
    """Base class of all user-facing errors."""


class ConfigError(SpecdecError):
    """An invalid option value (K < 0, temperature < 0, top_p outside (0, 1], ...)."""


class ModelLoadError(SpecdecError):
    """A model could not be found, verified or loaded (unknown name, corrupt file, ...)."""


class VocabMismatchError(SpecdecError):
    """Draft and target tokenizers disagree, so draft tokens would mean other text."""


class ContextOverflowError(SpecdecError):
    """The prompt (or prompt plus requested tokens) does not fit the context window."""


class EmptyPromptError(SpecdecError):
    """The prompt encodes to zero tokens."""


class PairBusyError(SpecdecError):
    """A ``Pair`` was asked for a second generation while one is running (another thread, or
    a stream not yet finished or cancelled): its models hold one generation's caches."""
