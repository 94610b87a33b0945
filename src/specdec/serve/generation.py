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

import secrets
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from specdec.api import Pair
from specdec.completion import Completion
from specdec.constraints.spec import Constraint
from specdec.core.loop import validate_request
from specdec.core.result import GenerationResult
from specdec.errors import SpecdecError
from specdec.pairs import pair_context_limit
from specdec.prompting import check_text, encode_text
from specdec.request import GenerationRequest, make_request
from specdec.serve.engine import Job
from specdec.serve.errors import FieldError
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


def chat_prompt(
    pair: Pair,
    req: ChatRequest,
    lock: AbstractContextManager[Any],
    parse_special: bool = False,
) -> list[int]:
    """The messages through the target's chat template (system + multi-turn). Message text is
    text (special-token text in it is not parsed) unless ``parse_special``; the template is
    rendered without holding ``lock``, only the tokenizer's calls hold it."""
    from specdec.serve.tools import message_for_template, template_tools
    from specdec.templates import chat_segments, encode_segments, supports_chat

    tok = pair.target.tokenizer
    apply = getattr(tok, "apply_chat", None)
    if apply is None:
        raise FieldError("messages", "this model has no chat template: use /v1/completions")
    messages = [message_for_template(m) for m in req.messages]
    tools = template_tools(req)
    if (tools or any(m.tool_calls or m.role == "tool" for m in req.messages)) and not (
        supports_chat(tok)
    ):
        raise FieldError("tools", "tool use needs the model's own chat template")
    try:
        for i, m in enumerate(messages):
            check_text(m["content"], f"messages[{i}] content")
        if supports_chat(tok):
            extra = {"tools": tools} if tools else None
            segments = chat_segments(tok, messages, parse_special=parse_special, extra=extra)
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
) -> list[int]:
    """The prompt's token ids (text through the tokenizer, special-token text in it kept as
    text unless ``parse_special``, as in messages; or ids checked to be in range)."""
    prompt = req.prompt
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
    constraint: Constraint | None = None,
) -> GenerationRequest:
    """Check that the prompt fits and fill in the defaults: the request the worker generates
    (the prompt and the prediction as token ids; ``constraint`` the tools' when they make
    one, else the response format's); FieldError on a bad request."""
    req.check()
    param = "messages" if isinstance(req, ChatRequest) else "prompt"
    n_ctx = pair_context_limit(pair.draft, pair.target)
    wanted = req.wanted_tokens() if isinstance(req, ChatRequest) else req.max_tokens
    try:
        validate_request(prompt_ids, 1, n_ctx)
    except SpecdecError as e:
        raise FieldError(param, str(e)) from e
    room = n_ctx - len(prompt_ids)  # more than fits is cut at the window ("length")
    k = req.k_override()
    # a server without a drafter (--draft none, -k 0) decodes every request plainly: a
    # prediction is checked and counted (0 accepted, 0 rejected), never drafted
    drafted = prediction if req.prediction is not None and pair.draft is not None else None
    # a prediction sizes its own drafts (the pair caps them at PLANNED_K) unless the
    # request names K
    k_default = None if k is None and drafted is not None else settings.k
    return make_request(
        prompt_ids,
        max_new_tokens=min(wanted or settings.default_max_tokens, room),
        k=k_default if k is None else k,
        adaptive=settings.adaptive,
        temperature=req.temperature,
        top_k=req.top_k,
        top_p=req.top_p,
        seed=req.seed if req.seed is not None else secrets.randbits(63),
        stop=tuple(req.stop or ()),
        prediction=drafted,
        constraint=constraint if constraint is not None else req.constraint(),
    )


def chat_constraint(pair: Pair, req: ChatRequest) -> Constraint | None:
    """A chat request's output constraint: its tools' (``serve.tools``) or its response
    format's; a FieldError naming the field that is wrong."""
    from specdec.constraints.spec import ConstraintError
    from specdec.serve.tools import request_constraint

    template = getattr(pair.target.tokenizer, "chat_template", None)
    try:
        return request_constraint(req, template if isinstance(template, str) else None)
    except ConstraintError as e:
        raise FieldError(e.field, str(e)) from e


def check_constraint(pair: Pair, request: GenerationRequest) -> None:
    """The request's constraint tried against the target's vocabulary (in a worker process
    with a deadline and a memory limit: ``constraints.check``), so that a bad schema or
    grammar is a 400 naming its field before anything is queued; blocking (a helper thread)."""
    c = request.constraint
    if c is None:
        return
    try:
        pair.grammars.check(c)
    except SpecdecError as e:  # ConstraintError names its field; a backend without bytes too
        raise FieldError(getattr(e, "field", c.field), str(e)) from e


def work(
    pair: Pair,
    request: GenerationRequest,
    *,
    stream_text: bool,
    on_result: Callable[[GenerationResult, float], None],
) -> Callable[[Job], Completion | None]:
    """The job for the worker thread: generate, emitting text pieces when ``stream_text``;
    returns the Completion, or None when the request was cancelled."""

    def run(job: Job) -> Completion | None:
        stream = pair.stream_request(request)
        for delta in stream.deltas():
            if stream_text and delta.text:
                job.emit(delta.text)
            if job.cancelled.is_set():  # between rounds: the models are free after this
                on_result(stream.cancel(), job.queue_seconds)
                return None
        assert stream.completion is not None
        on_result(stream.completion.result, job.queue_seconds)
        return stream.completion

    return run


def openai_finish_reason(reason: str) -> str:
    return "length" if reason in ("length", "context") else "stop"


def usage(result: GenerationResult) -> dict[str, Any]:
    """OpenAI's usage plus the speculative statistics (docs/metrics.md)."""
    n_prompt, n_out = len(result.prompt_ids), len(result.tokens)
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
