"""A grammar as a row processor (``core.processors.RowProcessor``): the row after a context
keeps the logits of the tokens the grammar allows there and sets the others to -inf.

The engine's matcher holds the grammar's state after some token sequence; this processor
keeps it at the last context it was asked about and moves it to the next one by their common
prefix (a rollback of the tokens that differ, then the new ones), so the calls of a round
(the draft model's steps, ``legal_prefix`` of the drafts, the target's K + 1 rows along the
draft's path) and of the next round after rejected drafts each cost the tokens that changed.
The state never changes a result: ``rows`` and ``legal_prefix`` are functions of their
arguments (the tests call them in random order against fresh processors).

What the grammar sees: the generated tokens (the context after the prompt), or with a
trigger, the generated tokens from the first occurrence of the trigger token on (before it
the rows are not masked). End-of-sequence tokens are not fed to the matcher: one is allowed
where the grammar accepts (the engine's mask says so), after it only end-of-sequence tokens
are (a generation that goes on past EOS, as the certificate's do). A context the grammar
rules out (never one the loop builds: a drafter's path cut by ``legal_prefix``) gets its row
unmasked; such rows are never used.

The engine may also give up on a token its own mask allowed (a grammar past its limits, such
as a pattern of a million repetitions: "lexer error: too many expressions constructed"). That
is not a ruled-out token: the grammar state is lost, and every row after it would go
unmasked, so the output would silently leave the grammar. It raises a ConstraintError naming
the request's field instead (the server's 400, or an error event once streaming).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from specdec.constraints.spec import ConstraintError

FREE, ACTIVE, ENDED, DEAD = "free", "active", "ended", "dead"


class GrammarProcessor:
    """Masks rows to the tokens ``matcher``'s grammar allows (module docstring).

    matcher:     the engine's matcher at the grammar's start (this processor owns it);
    vocab_size:  the rows' width (the target's vocabulary);
    eos:         end-of-sequence ids;
    prompt_len:  tokens of the context before the output;
    trigger:     a token id that starts the grammar (None: it starts with the output);
    field:       the request field the grammar came from (named by the engine's failures).
    """

    def __init__(
        self,
        matcher: Any,
        vocab_size: int,
        eos: Sequence[int],
        prompt_len: int,
        trigger: int | None = None,
        field: str = "response_format",
    ) -> None:
        self.matcher = matcher
        self.field = field
        self.vocab_size = int(vocab_size)
        self.eos = frozenset(int(t) for t in eos)
        self.prompt_len = int(prompt_len)
        self.trigger = trigger
        self._start = ACTIVE if trigger is None else FREE
        self._seen: list[int] = []  # the output tokens the state below is of
        self._modes: list[str] = []  # mode after each seen token
        self._fed: list[bool] = []  # whether each seen token went to the matcher
        self._words = np.zeros((self.vocab_size + 31) // 32, dtype=np.int32)  # [ceil(V/32)]
        self._eos_only = torch.zeros(self.vocab_size, dtype=torch.bool)  # [V]
        self._eos_only[[t for t in self.eos if t < self.vocab_size]] = True
        self.masks_computed = 0  # how many masks the engine computed (for cost figures)

    # -- the state: the matcher after the seen tokens ---------------------------------------
    @property
    def mode(self) -> str:
        return self._modes[-1] if self._modes else self._start

    def _push(self, tok: int, allowed: torch.Tensor | None = None) -> bool:
        """Move the state past ``tok`` (``allowed``: the mask here, when already computed);
        False when the grammar rules it out (the state is then DEAD)."""
        mode, fed = self.mode, False
        if mode == FREE:
            if tok == self.trigger:
                mode, fed = self._consume(tok, allowed)
        elif mode == ACTIVE:
            if tok in self.eos:
                ok = bool(allowed[tok]) if allowed is not None else self.matcher.is_accepting()
                mode = ENDED if ok else DEAD
            else:
                mode, fed = self._consume(tok, allowed)
        elif mode == ENDED:
            mode = ENDED if tok in self.eos else DEAD
        self._seen.append(tok)
        self._modes.append(mode)
        self._fed.append(fed)
        return mode != DEAD

    def _consume(self, tok: int, allowed: torch.Tensor | None) -> tuple[str, bool]:
        if allowed is not None:
            ok = bool(allowed[tok])
        else:
            ok = 0 <= tok < self.vocab_size and self.matcher.validate_tokens([tok]) == 1
            self._check_engine()
        if ok and self.matcher.consume_token(tok):
            return ACTIVE, True
        self._check_engine()
        return DEAD, False

    def _check_engine(self) -> None:
        """A ConstraintError when the engine gave up (module docstring), not a ruled-out
        token."""
        if self.matcher.is_error():
            said = str(self.matcher.get_error()).replace("<non-verbose/>", "")
            error = " ".join(said.split())[:300]
            raise ConstraintError(
                self.field,
                f"the grammar engine gave up after {len(self._seen)} output tokens ({error}); "
                "the grammar or schema is beyond its limits",
            )

    def _pop(self, n: int) -> None:
        """Undo the last ``n`` seen tokens."""
        if n <= 0:
            return
        fed = sum(self._fed[-n:])
        if fed:
            self.matcher.rollback(fed)
        del self._seen[-n:], self._modes[-n:], self._fed[-n:]

    def _sync(self, output: Sequence[int]) -> None:
        """Make the state that after ``output`` (the generated tokens)."""
        seen = self._seen
        n = min(len(seen), len(output))
        if seen[:n] == list(output[:n]):
            common = n
        else:
            common = next(i for i in range(n) if seen[i] != output[i])
        self._pop(len(seen) - common)
        for tok in output[common:]:
            self._push(int(tok))

    # -- masks --------------------------------------------------------------------------------
    def allowed(self) -> torch.Tensor | None:
        """The tokens allowed after the seen ones [V] bool, or None for no mask (before the
        trigger, or after a ruled-out token)."""
        mode = self.mode
        if mode in (FREE, DEAD):
            return None
        if mode == ENDED:
            return self._eos_only
        self.matcher.unsafe_compute_mask_ptr(self._words.ctypes.data, self._words.nbytes)
        self._check_engine()
        self.masks_computed += 1
        bits = np.unpackbits(self._words.view(np.uint8), bitorder="little")[: self.vocab_size]
        allowed = torch.from_numpy(bits.view(np.bool_))  # [V]
        if not bool(allowed.any()):  # the matcher failed: keep a row finite (end it)
            return self._eos_only
        return allowed

    # -- RowProcessor -------------------------------------------------------------------------
    def rows(
        self, context: Sequence[int], path: Sequence[int], logits: torch.Tensor
    ) -> torch.Tensor:
        """logits [len(path) + 1, V] -> the rows masked after context + path[:i]."""
        self._sync(context[self.prompt_len :])
        out = logits.to(torch.float32).clone()  # [n, V]
        pushed = 0
        for i in range(out.shape[0]):
            allowed = self.allowed()
            if allowed is not None:
                out[i].masked_fill_(~allowed, float("-inf"))
            if i == len(path) or self.mode == DEAD:
                break
            self._push(int(path[i]), allowed)
            pushed += 1
        self._pop(pushed)
        return out

    def legal_prefix(self, context: Sequence[int], path: Sequence[int]) -> int:
        """How many leading tokens of ``path`` the grammar allows after ``context``."""
        self._sync(context[self.prompt_len :])
        n = 0
        for tok in path:
            if not self._push(int(tok)):
                n_ok = n
                self._pop(n + 1)
                return n_ok
            n += 1
        self._pop(n)
        return n
