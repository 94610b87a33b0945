"""Do a draft and a target speak the same token ids? And how a draft row is fitted to the
target's vocabulary when the two sizes differ only by padding.

Model families often pad the output layer to a multiple of 64 or 128 rows, differently per
size: Qwen2.5 0.5B/1.5B/3B have 151,936 logit rows and 7B/14B/32B/72B 152,064, with one
tokenizer (151,665 real tokens). llama.cpp accepts such a pair when the sizes differ by at
most 128 and the token texts match; so does specdec, after checking every id both
vocabularies have (not only some probe texts):

- draft smaller than the target (the Qwen case): a draft row q [V_d] is padded with zeros to
  [V_t], so the accept/reject walk sees the draft's exact distribution on the target's ids.
  The target may still emit an id >= V_d (a padding id): the draft model cannot take it, and
  the drafter then proposes nothing for the rest of that generation (plain decoding).
- draft larger than the target: the draft's logits are cut to the target's V_t ids before
  sampling, so the draft never proposes an id the target lacks, and q is the distribution
  the drafts were really sampled from.

Either way the output keeps the target's distribution exactly (the walk is lossless for any
q that is the draft's true sampling distribution).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from specdec.core.model import CausalLM, Tokenizer
from specdec.errors import VocabMismatchError

# The largest difference of vocabulary sizes accepted as padding (llama.cpp's
# SPEC_VOCAB_MAX_SIZE_DIFFERENCE).
MAX_VOCAB_PAD = 128

# Text whose token ids must agree between draft and target (ASCII, code, accents, CJK, emoji).
PROBE_TEXTS: tuple[str, ...] = (
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "Größe, déjà vu, naïve café; 東京は日本の首都です。 🙂🚀",
    "   leading spaces\ttabs\n\nnewlines 12345 3.14159 -0.5e10",
)


def fit_logits(logits: torch.Tensor, size: int) -> torch.Tensor:
    """Draft logits [..., V_d] on a target vocabulary of ``size`` ids: cut when V_d > size
    (the extra ids can never be drafted), padded with -inf when V_d < size (probability 0
    after any sampling transform). Unchanged when the sizes agree."""
    v = logits.shape[-1]
    if v == size:
        return logits
    if v > size:
        return logits[..., :size]
    pad = logits.new_full((*logits.shape[:-1], size - v), float("-inf"))
    return torch.cat([logits, pad], dim=-1)


def token_texts(tok: Tokenizer, n: int) -> list[str | bytes | None]:
    """The raw text of ids 0..n-1 (None where the tokenizer has no such token): the
    tokenizer's own ``token_texts`` when it has one (the vocabulary's strings, comparable
    across backends), else each id decoded on its own."""
    own: Callable[[int], Sequence[str | bytes | None]] | None = getattr(tok, "token_texts", None)
    if own is not None:
        return list(own(n))
    return [tok.decode([i]) for i in range(n)]


def check_padded_vocabulary(draft: CausalLM, target: CausalLM) -> None:
    """For vocabularies of different sizes: raise VocabMismatchError unless the sizes differ
    by at most MAX_VOCAB_PAD and every id both have has the same text (the first differing
    id is named with both texts)."""
    vd, vt = draft.vocab_size, target.vocab_size
    if abs(vd - vt) > MAX_VOCAB_PAD:
        raise VocabMismatchError(
            f"draft vocabulary has {vd} tokens, target has {vt}: sizes may differ by at most "
            f"{MAX_VOCAB_PAD} (padding); the draft and target must share one tokenizer"
        )
    shared = min(vd, vt)
    a = token_texts(draft.tokenizer, shared)
    b = token_texts(target.tokenizer, shared)
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        # an id only one tokenizer knows (None) is an output-layer padding row of that model
        if x is not None and y is not None and x != y:
            raise VocabMismatchError(
                f"draft vocabulary ({vd}) and target vocabulary ({vt}) differ at shared id {i}: "
                f"draft {x!r} vs target {y!r}; the draft and target must share one tokenizer"
            )


def check_same_vocabulary(draft: CausalLM, target: CausalLM) -> None:
    """Raise VocabMismatchError unless draft and target speak the same token ids.

    Sizes that differ by padding (at most MAX_VOCAB_PAD) are accepted when every shared id has
    the same text; then, as always, identical ids for a set of probe texts and a shared EOS
    id. The error names the first differing token.
    """
    if draft.vocab_size != target.vocab_size:
        check_padded_vocabulary(draft, target)
    specials = tuple(target.tokenizer.decode([e]) for e in sorted(target.eos_token_ids))
    for text in (*PROBE_TEXTS, *specials, "".join(specials) + " end"):
        a = draft.tokenizer.encode(text, add_special_tokens=False)
        b = target.tokenizer.encode(text, add_special_tokens=False)
        if a != b:
            i = next((j for j, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
            if i is None:
                i = min(len(a), len(b))
            da = repr(draft.tokenizer.decode(a[i : i + 1])) if i < len(a) else "<end>"
            tb = repr(target.tokenizer.decode(b[i : i + 1])) if i < len(b) else "<end>"
            raise VocabMismatchError(
                f"draft and target tokenizers differ at token {i} of {text[:30]!r}...: "
                f"draft id {a[i] if i < len(a) else None} ({da}) vs "
                f"target id {b[i] if i < len(b) else None} ({tb})"
            )
    if not (draft.eos_token_ids & target.eos_token_ids):
        raise VocabMismatchError(
            f"draft EOS ids {sorted(draft.eos_token_ids)} share nothing with target EOS ids "
            f"{sorted(target.eos_token_ids)}"
        )


def check_vocab_sizes(draft_size: int, target_size: int) -> None:
    """The size rule alone (for pairs handed to the loop directly, without a tokenizer
    check): equal, or differing by at most MAX_VOCAB_PAD."""
    if abs(draft_size - target_size) > MAX_VOCAB_PAD:
        raise VocabMismatchError(
            f"draft vocabulary has {draft_size} tokens, target has {target_size} "
            f"(more than {MAX_VOCAB_PAD} apart: not padding of one tokenizer)"
        )
