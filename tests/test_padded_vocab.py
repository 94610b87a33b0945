"""Draft/target pairs whose vocabulary sizes differ by padding (Qwen2.5 0.5B -> 7B: 151,936
vs 152,064 rows, one tokenizer): accepted when every shared id has the same text, with the
draft's rows fitted to the target's vocabulary so the output keeps the target's law exactly.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import pytest
import torch

from specdec.core.loop import generate
from specdec.core.model_drafter import ModelDrafter
from specdec.core.rejection import exact_round_distribution
from specdec.core.sampling import SamplingConfig, logits_to_probs, make_generator
from specdec.core.vocab import MAX_VOCAB_PAD, check_same_vocabulary, fit_logits
from specdec.errors import VocabMismatchError
from specdec.models.loader import ModelConfig
from specdec.models.mock import MockLM, MockSpec, MockTokenizer, mock_pair
from specdec.pairs import load_pair
from test_decoding import sequence_pvalue

# >= 259 ids: the mock tokenizer maps every byte to its own id, whatever the size
BIG = 400


def test_sizes_within_the_padding_limit_with_equal_texts_are_one_vocabulary() -> None:
    for dv in (BIG - 1, BIG + MAX_VOCAB_PAD, BIG - MAX_VOCAB_PAD):
        draft, target = mock_pair("close", vocab_size=BIG, draft_vocab_size=dv)
        check_same_vocabulary(draft, target)


def test_sizes_further_apart_than_padding_are_refused() -> None:
    draft, target = mock_pair("close", vocab_size=BIG, draft_vocab_size=BIG + MAX_VOCAB_PAD + 1)
    with pytest.raises(VocabMismatchError, match=r"at most 128"):
        check_same_vocabulary(draft, target)


def test_a_pair_handed_to_the_loop_or_a_drafter_directly_is_size_checked_too() -> None:
    # no tokenizer check on this path: the drafter itself refuses sizes beyond padding
    draft, target = mock_pair("close", vocab_size=BIG, draft_vocab_size=BIG + MAX_VOCAB_PAD + 1)
    with pytest.raises(VocabMismatchError, match=r"more than 128 apart"):
        generate(target, draft, [1, 2, 3], max_new_tokens=4, k=2)
    with pytest.raises(VocabMismatchError, match=r"more than 128 apart"):
        ModelDrafter(draft, vocab_size=target.vocab_size)
    close, _ = mock_pair("close", vocab_size=BIG, draft_vocab_size=BIG + MAX_VOCAB_PAD)
    assert ModelDrafter(close, vocab_size=BIG).vocab_size == BIG  # padding: accepted


class OneIdDiffers(MockTokenizer):
    """A tokenizer whose id 271 has other text (probe texts never use it)."""

    def decode(self, ids: Sequence[int]) -> str:
        return "".join("<other>" if int(i) == 271 else f"<{int(i)}>" for i in ids)


def test_a_shared_id_with_other_text_is_named_with_both_texts() -> None:
    draft, target = mock_pair("close", vocab_size=BIG, draft_vocab_size=BIG + 64)
    draft._tokenizer = OneIdDiffers(BIG + 64)
    with pytest.raises(
        VocabMismatchError, match=r"shared id 271: draft '<other>' vs target '<271>'"
    ):
        check_same_vocabulary(draft, target)


def test_the_loaders_accept_a_padded_pair_and_refuse_a_far_one() -> None:
    target = ModelConfig(f"mock:target:{BIG}", backend="mock")
    draft, _ = load_pair(ModelConfig(f"mock:close:{BIG - 40}", backend="mock"), target)
    assert isinstance(draft, MockLM) and draft.vocab_size == BIG - 40
    with pytest.raises(VocabMismatchError):
        load_pair(ModelConfig(f"mock:close:{BIG + 200}", backend="mock"), target)


def test_fit_logits_pads_with_minus_inf_and_cuts() -> None:
    x = torch.tensor([[1.0, 2.0, 3.0]])
    assert torch.equal(fit_logits(x, 3), x)
    assert torch.equal(fit_logits(x, 2), x[:, :2])
    padded = fit_logits(x, 5)
    assert padded.shape == (1, 5) and torch.isinf(padded[0, 3:]).all()
    q = logits_to_probs(padded[0], SamplingConfig(1.0))
    assert q[3:].sum().item() == 0.0 and abs(q.sum().item() - 1) < 1e-6


@pytest.mark.parametrize("draft_vocab", [13, 19, 24])
@pytest.mark.parametrize("closeness", ["identical", "close", "far"])
def test_greedy_speculative_equals_plain_target(draft_vocab: int, closeness: str) -> None:
    draft, target = mock_pair(closeness, vocab_size=19, draft_vocab_size=draft_vocab)
    for prompt in ([0, 5, 7], [3, 4, 5, 3, 4, 5], [9]):
        plain = generate(target, None, prompt, max_new_tokens=30, k=0, stop_on_eos=False)
        for k in (1, 3, 6):
            spec = generate(target, draft, prompt, max_new_tokens=30, k=k, stop_on_eos=False)
            assert spec.tokens == plain.tokens, (prompt, k)


def test_draft_rows_have_the_target_width_and_no_mass_on_missing_ids() -> None:
    for dv in (6, 10):
        draft, target = mock_pair("close", vocab_size=8, draft_vocab_size=dv, sharpness=1.0)
        d = ModelDrafter(draft, vocab_size=target.vocab_size)
        out = d.propose([0, 4], 4, SamplingConfig(1.0), make_generator(1))
        assert out.probs is not None and out.probs.shape == (4, 8)
        assert all(t < min(dv, 8) for t in out.tokens)
        if dv < 8:
            assert out.probs[:, dv:].sum().item() == 0.0


def test_a_context_with_an_id_the_draft_lacks_gets_no_drafts() -> None:
    """The target may emit one of its padding ids; the draft model cannot take it, so the
    drafter proposes nothing from then on (plain decoding), and never feeds it to the model."""
    draft, _ = mock_pair("close", vocab_size=8, draft_vocab_size=6)
    d = ModelDrafter(draft, vocab_size=8)
    d.prefill([0, 4, 7, 3])  # id 7 is beyond the draft's 6
    assert draft.cached_tokens == [0, 4]
    out = d.propose([0, 4, 7, 3], 3, SamplingConfig(1.0), make_generator(0))
    assert out.tokens == [] and out.probs is None


@pytest.mark.parametrize("draft_vocab", [6, 10])
def test_one_round_emits_exactly_the_target_distribution(draft_vocab: int) -> None:
    """Exact enumeration of a round with the drafter's fitted q rows: the first token's law
    is the target's row, whatever the draft's vocabulary."""
    draft, target = mock_pair("close", vocab_size=8, draft_vocab_size=draft_vocab)
    cfg = SamplingConfig(1.0)
    ctx = [0, 4]
    q = logits_to_probs(fit_logits(draft.logits_for_context(ctx), 8), cfg)  # [8]
    p = logits_to_probs(target.logits_for_context(ctx), cfg)  # [8]
    p_next = logits_to_probs(target.logits_for_context([4, 5]), cfg)  # any second row
    dist = exact_round_distribution(torch.stack([p, p_next]), q.unsqueeze(0))
    first: dict[int, float] = defaultdict(float)
    for seq, prob in dist.items():
        first[seq[0]] += prob
    for t in range(8):
        assert abs(first[t] - float(p[t])) < 1e-6


@pytest.mark.slow
@pytest.mark.parametrize("draft_vocab", [4, 6])
def test_sampled_sequences_of_a_padded_pair_follow_the_target(draft_vocab: int) -> None:
    draft, target = mock_pair(
        "close", vocab_size=5, draft_vocab_size=draft_vocab, order=2, sharpness=1.0
    )
    assert sequence_pvalue(target, draft, 3, SamplingConfig(1.0), 6000, seed0=20_000) > 1e-3


def test_mock_draw_vocab_shares_the_first_ids() -> None:
    a = MockLM(MockSpec(vocab_size=6, draw_vocab=9))
    b = MockLM(MockSpec(vocab_size=9, draw_vocab=9))
    assert torch.equal(a.logits_for_context([1, 2]), b.logits_for_context([1, 2])[:6])


def test_the_profile_probe_takes_a_padded_pair() -> None:
    """The profile's teacher-forced probe: identical logits on the shared ids agree
    everywhere until the target's continuation holds an id the draft lacks; from there on
    decoding drafts nothing, so the probe counts misses (and does not crash)."""
    from specdec.profiler.measure import model_draft_probe

    draft, target = mock_pair("identical", vocab_size=8, draft_vocab_size=6)
    cont = [int(target.logits_for_context([0, 4]).argmax())]
    while len(cont) < 6:
        cont.append(int(target.logits_for_context([4, *cont][-2:]).argmax()))
    probe = model_draft_probe(draft, [0, 4], cont, 4, vocab_size=8)
    assert probe.run is not None and len(probe.run) == len(cont)
    bad = [3, 4, 7, 5, 6]  # 7 is beyond the draft's 6 ids
    probe = model_draft_probe(draft, [0, 4], bad, 4, vocab_size=8)
    assert probe.run is not None and probe.run[2:] == (0, 0, 0)
