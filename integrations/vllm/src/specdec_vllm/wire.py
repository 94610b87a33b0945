"""OpenAI's ``prediction`` field on the wire: checked and read as text, carried to the engine
as token ids, and counted in ``usage`` as OpenAI does. Plain Python, no vLLM: the endpoint
plugin (``endpoint.py``) calls it, and the tests run it without vLLM.

A prediction is ``{"type": "content", "content": TEXT}``, TEXT a string or a list of
``{"type": "text", "text": ...}`` parts (joined), as in OpenAI's API and ``specdec serve``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from specdec.errors import ConfigError
from specdec.prompting import check_text

# The key of SamplingParams.extra_args (a request's ``vllm_xargs``) that carries the
# prediction's token ids from the API server to the proposer. Reserved: a client that sets it
# itself is refused (the endpoint checks and tokenizes the prediction).
XARG = "specdec_prediction"
# OpenAI's usage fields, in usage.completion_tokens_details
ACCEPTED = "accepted_prediction_tokens"
REJECTED = "rejected_prediction_tokens"


class PredictionError(ValueError):
    """A request's prediction (or a field that cannot go with one) is wrong: a 400 naming
    ``param``."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


def prediction_text(value: object) -> str:
    """The text of a request's ``prediction`` value; PredictionError when it is not OpenAI's
    shape or its text is not UTF-8 (a lone surrogate, the form JSON's \\udXXX escapes give
    bytes that are not UTF-8)."""
    if not isinstance(value, Mapping):
        raise PredictionError(
            "prediction",
            'prediction must be an object {"type": "content", "content": ...}, got '
            + type(value).__name__,
        )
    extra = sorted(str(k) for k in value if k not in ("type", "content"))
    if extra:
        raise PredictionError(f"prediction.{extra[0]}", f"prediction has no field {extra[0]!r}")
    kind = value.get("type")
    if kind != "content":
        raise PredictionError("prediction.type", f"prediction.type must be 'content', got {kind!r}")
    content = value.get("content")
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        parts = []
        for i, part in enumerate(content):
            if not (
                isinstance(part, Mapping)
                and part.get("type") == "text"
                and isinstance(part.get("text"), str)
            ):
                raise PredictionError(
                    f"prediction.content.{i}",
                    f'prediction.content[{i}] must be a text part {{"type": "text", "text": ...}}',
                )
            parts.append(part["text"])
        text = "".join(parts)
    else:
        raise PredictionError(
            "prediction.content",
            "prediction.content must be a string or a list of text parts, got "
            + type(content).__name__,
        )
    try:
        check_text(text, "prediction.content")
    except ConfigError as e:
        raise PredictionError("prediction.content", str(e)) from e
    return text


def check_length(n_tokens: int, window: int) -> None:
    """A prediction longer than the model's window (max_model_len) can never be drafted
    whole: a 400, as for a prompt that does not fit."""
    if n_tokens > window:
        raise PredictionError(
            "prediction",
            f"the prediction is {n_tokens} tokens, longer than the model's window "
            f"({window} tokens)",
        )


def check_request(fields: Mapping[str, Any]) -> None:
    """Fields that cannot go with a prediction (OpenAI refuses them too): several choices or
    prompts (the counts are per sequence, and vLLM reports them only for one) and beam
    search; and the reserved extra argument, which only the endpoint sets."""
    n = fields.get("n")
    if n is not None and n != 1:
        raise PredictionError("n", f"n must be 1 with a prediction, got {n!r}")
    prompt = fields.get("prompt")  # /v1/completions: a list of texts or of token lists
    if isinstance(prompt, list) and len(prompt) > 1 and not isinstance(prompt[0], int):
        raise PredictionError(
            "prompt", f"a prediction goes with one prompt, got a list of {len(prompt)}"
        )
    if fields.get("use_beam_search"):
        raise PredictionError("use_beam_search", "beam search cannot be used with a prediction")
    xargs = fields.get("vllm_xargs")
    if isinstance(xargs, Mapping) and XARG in xargs:
        raise PredictionError(
            f"vllm_xargs.{XARG}", f"vllm_xargs.{XARG} is set by the server: send prediction"
        )


def counts(metrics: Mapping[str, Any] | None) -> tuple[int, int]:
    """(accepted, rejected) prediction tokens from vLLM's per-request speculative metrics
    (``metrics.speculative_decoding`` of a response): with a prediction, every draft of the
    request comes from it (``drafting.PredictionDrafts``), so its drafted and accepted draft
    tokens are the prediction's. (0, 0) where the block is absent (nothing was verified)."""
    spec = (metrics or {}).get("speculative_decoding") if isinstance(metrics, Mapping) else None
    if not isinstance(spec, Mapping):
        return 0, 0
    drafted = int(spec.get("num_draft_tokens") or 0)
    accepted = int(spec.get("num_accepted_draft_tokens") or 0)
    return accepted, max(0, drafted - accepted)


def add_usage(body: dict[str, Any], predicted: bool) -> bool:
    """Write OpenAI's two counts into ``body["usage"]["completion_tokens_details"]`` (0 and 0
    without a prediction, as OpenAI reports); False when the body has no usage."""
    usage = body.get("usage")
    if not isinstance(usage, dict):
        return False
    a, r = counts(body.get("metrics")) if predicted else (0, 0)
    details = usage.get("completion_tokens_details")
    if not isinstance(details, dict):
        details = {}
    details[ACCEPTED] = a
    details[REJECTED] = r
    usage["completion_tokens_details"] = details
    return True


def rewrite_sse(item: str | bytes, predicted: bool) -> str | bytes:
    """One item of a streamed reply (``data: {...}\\n\\n`` lines): the final usage chunk (no
    choices, a usage object) gets the counts; everything else passes unchanged."""
    text = item.decode() if isinstance(item, bytes) else item
    if '"usage"' not in text:
        return item
    out = []
    changed = False
    for line in text.split("\n"):
        if line.startswith("data: ") and line != "data: [DONE]":
            try:
                chunk = json.loads(line[len("data: ") :])
            except ValueError:
                out.append(line)
                continue
            if isinstance(chunk, dict) and not chunk.get("choices") and add_usage(chunk, predicted):
                line = "data: " + json.dumps(chunk, ensure_ascii=False, separators=(",", ":"))
                changed = True
        out.append(line)
    if not changed:
        return item
    joined = "\n".join(out)
    return joined.encode() if isinstance(item, bytes) else joined


def token_ids(value: object, vocab: int, window: int) -> list[int] | None:
    """The prediction a request carries to the proposer (extra_args[XARG]) as token ids, or
    None when it carries none or something else (a request made without the endpoint, e.g.
    offline ``SamplingParams(extra_args=...)``, with a malformed value: not drafted)."""
    if not isinstance(value, Sequence) or isinstance(value, str | bytes):
        return None
    if len(value) > window:
        return None
    out = []
    for t in value:
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab:
            return None
        out.append(t)
    return out
