"""From a validated request to a generation on the worker thread, and back to response bodies.

``text_prompt`` / ``chat_prompt`` tokenise (the app runs them in a helper thread: tokenisers
only read their vocabulary, so this is safe beside a running generation; a chat template is
rendered in a worker process with its own time and memory limits, outside the tokenizer's
lock, so a slow template holds up no other request) and ``plan`` checks
that the prompt fits and fills in defaults, so that every user error is a 400 before anything
is queued;
``work`` is what runs on the worker thread (``Pair.stream_request`` round by round, checking for
cancellation between rounds); ``usage`` and ``timings`` give the statistics fields.
"""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from specdec.api import Pair
from specdec.completion import Completion
from specdec.core.logprobs import TokenLogprob
from specdec.core.loop import validate_request
from specdec.core.result import GenerationResult
from specdec.errors import SpecdecError
from specdec.pairs import pair_context_limit
from specdec.prompting import check_text, encode_text
from specdec.request import GenerationRequest, choice_seed, make_request
from specdec.serve.engine import Job
from specdec.serve.errors import FieldError
from specdec.serve.logprobs import (
    TokenTexts,
    WireToken,
    prompt_logprobs_shape,
    scored,
    scored_prompt,
    trim_to_text,
)
from specdec.serve.schemas import ChatRequest, CompletionRequest, GenerationFields
from specdec.util.jsonable import finite


@dataclass(frozen=True)
class ServeSettings:
    """What the server was started with (the defaults a request may override)."""

    model_name: str
    k: int | None = None  # None: the pair's own choice (``Pair.default_k``)
    adaptive: bool = False
    default_max_tokens: int = 512
    parse_special: bool = False  # special-token text in prompts, messages, predictions: text
    logprobs_mode: str = "raw_logprobs"  # vLLM's name; a request's logprobs_mode overrides it


def chat_prompt(
    pair: Pair,
    req: ChatRequest,
    lock: AbstractContextManager[Any],
    parse_special: bool = False,
) -> list[int]:
    """The messages through the target's chat template (system + multi-turn). Message text is
    text (special-token text in it is not parsed) unless ``parse_special``; the template is
    rendered without holding ``lock``, only the tokenizer's calls hold it."""
    from specdec.templates import chat_segments, encode_segments, supports_chat

    tok = pair.target.tokenizer
    apply = getattr(tok, "apply_chat", None)
    if apply is None:
        raise FieldError("messages", "this model has no chat template: use /v1/completions")
    messages = [
        {"role": "system" if m.role == "developer" else m.role, "content": m.text()}
        for m in req.messages
    ]
    try:
        for i, m in enumerate(messages):
            check_text(m["content"], f"messages[{i}] content")
        if supports_chat(tok):
            segments = chat_segments(tok, messages, parse_special=parse_special)
            with lock:
                return encode_segments(tok, segments)
        with lock:
            ids: list[int] = (
                apply(messages, parse_special=True) if parse_special else apply(messages)
            )
    except SpecdecError as e:
        raise FieldError("messages", str(e)) from e
    except Exception as e:  # a template that refuses the messages (e.g. no system role)
        raise FieldError("messages", f"the chat template rejected the messages: {e}") from e
    return ids


def text_prompt(
    pair: Pair,
    req: CompletionRequest,
    lock: AbstractContextManager[Any],
    parse_special: bool = False,
    one: str | list[int] | None = None,
) -> list[int]:
    """The prompt's token ids (text through the tokenizer, special-token text in it kept as
    text unless ``parse_special``, as in messages; or ids checked to be in range).
    ``prompt``: one of the request's prompts (default: its first)."""
    prompt = req.prompts()[0] if one is None else one
    if isinstance(prompt, str):
        try:
            check_text(prompt, "the prompt")
        except SpecdecError as e:
            raise FieldError("prompt", str(e)) from e
        with lock:
            return encode_text(
                pair.target, prompt, add_special_tokens=True, parse_special=parse_special
            )
    vocab = pair.target.vocab_size
    bad = next((t for t in prompt if not 0 <= int(t) < vocab), None)
    if bad is not None:
        raise FieldError("prompt", f"token id {bad} is outside the vocabulary (0..{vocab - 1})")
    return [int(t) for t in prompt]


def prediction_ids(
    pair: Pair,
    req: GenerationFields,
    lock: AbstractContextManager[Any],
    parse_special: bool = False,
) -> list[int]:
    """The request's prediction as token ids (its text is text, special-token text included,
    unless ``parse_special``); [] without one. Text that is not UTF-8 is a 400."""
    if req.prediction is None:
        return []
    text = req.prediction.text()
    try:
        check_text(text, "the prediction")
    except SpecdecError as e:
        raise FieldError("prediction", str(e)) from e
    with lock:
        return encode_text(pair.target, text, add_special_tokens=False, parse_special=parse_special)


def plan(
    pair: Pair,
    req: GenerationFields,
    prompt_ids: list[int],
    settings: ServeSettings,
    prediction: list[int] | None = None,
) -> GenerationRequest:
    """Check that the prompt fits and fill in the defaults: the request the worker generates
    (the prompt and the prediction as token ids); FieldError on a bad request."""
    req.check()
    param = "messages" if isinstance(req, ChatRequest) else "prompt"
    n_ctx = pair_context_limit(pair.draft, pair.target)
    wanted = req.wanted_tokens() if isinstance(req, ChatRequest) else req.max_tokens
    try:
        validate_request(prompt_ids, 1, n_ctx)
    except SpecdecError as e:
        raise FieldError(param, str(e)) from e
    room = n_ctx - len(prompt_ids)  # more than fits is cut at the window ("length")
    new_tokens = min(settings.default_max_tokens if wanted is None else wanted, room)
    bias = logit_bias(req, pair.target.vocab_size)
    top = req.top_logprobs_wanted()
    echo = isinstance(req, CompletionRequest) and req.echo
    # the prompt is scored for echo with logprobs, vLLM's prompt_logprobs, and max_tokens 0
    scored = [t for t in (top if echo else None, req.prompt_logprobs) if t is not None]
    if new_tokens == 0 and not scored:
        scored = [0]
    k = req.k_override()
    # a server without a drafter (--draft none, -k 0) decodes every request plainly: a
    # prediction is checked and counted (0 accepted, 0 rejected), never drafted
    drafted = prediction if req.prediction is not None and pair.draft is not None else None
    # a prediction sizes its own drafts (the pair caps them at PLANNED_K) unless the
    # request names K
    k_default = None if k is None and drafted is not None else settings.k
    mode = settings.logprobs_mode if req.logprobs_mode is None else req.logprobs_mode
    return make_request(
        prompt_ids,
        max_new_tokens=new_tokens,
        k=k_default if k is None else k,
        adaptive=settings.adaptive,
        temperature=req.temperature,
        top_k=req.top_k,
        top_p=req.top_p,
        seed=req.seed if req.seed is not None else secrets.randbits(63),
        stop=tuple(req.stop or ()),
        prediction=drafted,
        logit_bias=bias,
        presence_penalty=req.presence_penalty,
        frequency_penalty=req.frequency_penalty,
        repetition_penalty=req.repetition_penalty,
        logprobs=top,
        logprobs_mode=mode.removesuffix("_logprobs"),
        prompt_logprobs=max(scored) if scored else None,
    )


def logit_bias(req: GenerationFields, vocab: int) -> dict[int, float] | None:
    """The request's ``logit_bias`` with int keys, every id in the vocabulary (FieldError
    naming logit_bias otherwise)."""
    if not req.logit_bias:
        return None
    out = {int(k): float(v) for k, v in req.logit_bias.items()}
    bad = next((t for t in out if not 0 <= t < vocab), None)
    if bad is not None:
        raise FieldError("logit_bias", f"token id {bad} is outside the vocabulary (0..{vocab - 1})")
    return out


def plan_choices(
    pair: Pair,
    req: GenerationFields,
    prompts: list[list[int]],
    settings: ServeSettings,
    prediction: list[int] | None = None,
) -> list[GenerationRequest]:
    """The generations of a request: for each prompt (a completions request may carry
    several), ``n`` choices, choice j with its own seed stream (``choice_seed``: choice 0 has
    the request's seed, so it is what n = 1 gives), in the order of OpenAI's choice index."""
    out = []
    for ids in prompts:
        first = plan(pair, req, ids, settings, prediction)
        out += [dataclasses.replace(first, seed=choice_seed(first.seed, j)) for j in range(req.n)]
    return out


@dataclass(frozen=True)
class Wire:
    """What a request asks beyond the text (the same for each of its choices)."""

    echo: bool = False  # the prompt's text (and its scores) before the completion's
    token_ids: bool = False  # vLLM's return_tokens_as_token_ids
    prompt_logprobs: int | None = None  # vLLM's prompt_logprobs (alternatives per token)


@dataclass(frozen=True)
class Piece:
    """Streamed text of choice ``index``, with its tokens' log-probabilities when asked."""

    index: int
    text: str
    logprobs: list[WireToken] | None = None


@dataclass(frozen=True)
class ChoiceResult:
    """One finished choice: its text (the prompt's first with echo), its completion, the
    scored tokens of that text (when log-probabilities were asked for) and vLLM's
    ``prompt_logprobs`` (when asked for)."""

    index: int
    text: str
    completion: Completion
    logprobs: list[WireToken] | None
    prompt_logprobs: list[dict[str, dict[str, Any]] | None] | None


def work(
    pair: Pair,
    requests: list[GenerationRequest],
    *,
    stream_text: bool,
    on_result: Callable[[GenerationResult, float], None],
    wire: Wire = Wire(),
) -> Callable[[Job], list[ChoiceResult] | None]:
    """The job for the worker thread: generate each choice in turn (emitting ``Piece``s, and
    each finished choice, when ``stream_text``); returns the choices, or None when the
    request was cancelled."""

    def run(job: Job) -> list[ChoiceResult] | None:
        texts = TokenTexts(pair.target.tokenizer, wire.token_ids)
        done = []
        for index, request in enumerate(requests):
            choice = _choice(pair, job, index, request, texts, wire, stream_text, on_result)
            if choice is None:
                return None
            if stream_text:
                job.emit(choice)
            done.append(choice)
        return done

    return run


def _choice(
    pair: Pair,
    job: Job,
    index: int,
    request: GenerationRequest,
    texts: TokenTexts,
    wire: Wire,
    stream_text: bool,
    on_result: Callable[[GenerationResult, float], None],
) -> ChoiceResult | None:
    """One choice on the worker thread (``work``); None when cancelled."""
    stream = pair.stream_request(request)
    ids = list(request.prompt) if isinstance(request.prompt, tuple) else []
    hidden = pair.target.eos_token_ids if request.stop_on_eos else frozenset()
    want = request.logprobs is not None
    prompt_text = pair.target.tokenizer.decode(ids) if wire.echo else ""
    head: list[WireToken] | None = None  # the echoed prompt's scored tokens
    echoed = False
    tokens: list[WireToken] = []
    shown = at = 0  # characters of the completion's text shown, and of its tokens' texts

    def echo_head() -> None:
        nonlocal head, echoed
        echoed = True
        entries = stream.generation.prompt_logprobs
        if want and entries is not None:
            assert request.logprobs is not None
            head = scored_prompt(ids, _cut(entries, request.logprobs.top), texts)
        if stream_text:
            job.emit(Piece(index, prompt_text, head))

    for delta in stream.deltas():
        if wire.echo and not echoed:
            echo_head()
        new: list[WireToken] = []
        rnd = delta.round
        if want and rnd is not None and rnd.logprobs is not None:
            kept = [e for e, t in zip(rnd.logprobs, rnd.tokens, strict=True) if t not in hidden]
            new = scored(kept, texts)
        shown += len(delta.text)
        ended = stream.generation.result
        if ended is not None and ended.finish_reason == "stop":  # a stop string cut the text
            new = trim_to_text(new, shown, at)
        at += sum(t.chars for t in new)
        tokens += new
        if stream_text and (delta.text or new):
            job.emit(Piece(index, delta.text, new if want else None))
        if job.cancelled.is_set():  # between rounds: the models are free after this
            on_result(stream.cancel(), job.queue_seconds)
            return None
    completion = stream.completion
    assert completion is not None
    if wire.echo and not echoed:  # no round ran (max_tokens 0)
        echo_head()
    on_result(completion.result, job.queue_seconds)
    if completion.finish_reason == "stop":
        tokens = trim_to_text(tokens, len(completion.text))
    vllm_rows = None
    if wire.prompt_logprobs is not None and completion.result.prompt_logprobs is not None:
        entries = _cut(completion.result.prompt_logprobs, wire.prompt_logprobs)
        vllm_rows = prompt_logprobs_shape(ids, entries, texts)
    scored_text = None
    if want:
        scored_text = (head or []) + tokens if wire.echo else tokens
    return ChoiceResult(index, prompt_text + completion.text, completion, scored_text, vllm_rows)


def _cut(entries: list[TokenLogprob | None], top: int) -> list[TokenLogprob | None]:
    """The entries with ``top`` alternatives at most (the prompt is scored with the most any
    field of the request asked for)."""
    return [None if e is None else dataclasses.replace(e, top=e.top[:top]) for e in entries]


def openai_finish_reason(reason: str) -> str:
    return "length" if reason in ("length", "context") else "stop"


def merged(results: list[GenerationResult]) -> GenerationResult:
    """Several choices' results as one for the statistics: their rounds, tokens and times
    together (the prompt of the first: ``prompt_tokens`` counts each prompt once)."""
    if len(results) == 1:
        return results[0]
    first = results[0]
    return dataclasses.replace(
        first,
        tokens=[t for r in results for t in r.tokens],
        rounds=[x for r in results for x in r.rounds],
        t_prefill=sum(r.t_prefill for r in results),
        t_total=sum(r.t_total for r in results),
    )


def usage(result: GenerationResult, prompt_tokens: int | None = None) -> dict[str, Any]:
    """OpenAI's usage plus the speculative statistics (docs/metrics.md); ``prompt_tokens``
    overrides the result's prompt length (a request with several prompts)."""
    n_prompt = len(result.prompt_ids) if prompt_tokens is None else prompt_tokens
    n_out = len(result.tokens)
    return {
        "prompt_tokens": n_prompt,
        "completion_tokens": n_out,
        "total_tokens": n_prompt + n_out,
        "completion_tokens_details": dict(
            zip(
                ("accepted_prediction_tokens", "rejected_prediction_tokens"),
                result.prediction_tokens(),
                strict=True,
            )
        ),
        "drafted_tokens": result.drafted_tokens,
        "accepted_tokens": result.accepted_tokens,
        "verification_rounds": result.n_rounds,
        "draft_acceptance_rate": finite(result.draft_acceptance_rate),
        "mean_acceptance_length": finite(result.mean_acceptance_length),
        "accepted_length_histogram": result.accepted_length_histogram(),
        "acceptance_by_position": [finite(a) for a in result.acceptance_by_position()],
        "tokens_per_second": finite(result.tokens_per_second),
        "time_split": {k: finite(v) for k, v in result.time_split().items()},
    }


def timings(result: GenerationResult) -> dict[str, Any]:
    """llama-server's ``timings`` names."""
    predicted_s = result.t_total - result.t_prefill
    return {
        "prompt_n": len(result.prompt_ids),
        "prompt_ms": 1000 * result.t_prefill,
        "predicted_n": len(result.tokens),
        "predicted_ms": 1000 * predicted_s,
        "predicted_per_second": finite(result.tokens_per_second),
        "draft_n": result.drafted_tokens,
        "draft_n_accepted": result.accepted_tokens,
    }
