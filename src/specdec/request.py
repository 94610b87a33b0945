"""One generation request: built once at the edge (the command line, the server, the Python
API) by ``make_request``, checked there, and passed down whole to ``Pair.stream_request``.

    request = make_request("def fib(n):", max_new_tokens=64, temperature=0.7, stop="\\n\\n")
    completion = pair.stream_request(request).run()

A request holds what the user asked (the prompt or chat messages, the sampling settings, the
stop strings, a prediction, the limits), never what the pair decides (the K policy of an
auto pair, the drafter): ``k`` None leaves K to the pair.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from specdec.constraints.spec import Constraint, ConstraintError, grammar_constraint, json_schema
from specdec.core.logprobs import LogprobSpec, check_top
from specdec.core.processors import MAX_BIAS, check_penalties
from specdec.core.sampling import GREEDY, SamplingConfig
from specdec.core.stops import check_stops
from specdec.errors import ConfigError
from specdec.prompting import Message
from specdec.util.bounds import check_seed


@dataclass(frozen=True)
class GenerationRequest:
    """A checked request (``make_request``'s arguments, with the same meanings)."""

    prompt: str | tuple[int, ...] | None = None  # text, or token ids used as they are
    messages: tuple[Message, ...] | None = None
    system: str | None = None
    chat: bool | None = None  # None: the chat template when the target has one; False: raw
    parse_special: bool = False
    sampling: SamplingConfig = GREEDY
    stops: tuple[str, ...] = ()
    prediction: str | tuple[int, ...] | None = None
    max_new_tokens: int = 128
    k: int | None = None  # None: the pair's choice
    adaptive: bool = False
    seed: int = 0
    stop_on_eos: bool = True
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, value), ids ascending
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    constraint: Constraint | None = None  # the output's schema or grammar (constraints.spec)
    logprobs: LogprobSpec | None = None  # per generated token (core.logprobs)
    prompt_logprobs: int | None = None  # score the prompt too, with this many alternatives

    @property
    def text(self) -> str:
        """All the text given (for a size estimate before the tokenizer is loaded)."""
        prompt = self.prompt if isinstance(self.prompt, str) else ""
        return prompt or "".join(m["content"] for m in self.messages or [])

    def with_prompt_ids(self, ids: Sequence[int]) -> GenerationRequest:
        """The same request with its prompt (text, messages, system prompt) as token ids."""
        return dataclasses.replace(
            self, prompt=tuple(int(t) for t in ids), messages=None, system=None, chat=None
        )


def _is_int(x: object) -> bool:
    return isinstance(x, int | np.integer) and not isinstance(x, bool)


def _check_types(**values: object) -> None:
    """Integer arguments are integers (None where allowed: k): a float length (nan gave an
    empty text with finish "length"), a fractional top_k failed deep inside."""
    for name, x in values.items():
        if not (_is_int(x) or (name == "k" and x is None)):
            raise ConfigError(f"{name} must be an integer, got {x!r}")


def _check_reals(**values: object) -> None:
    for name, x in values.items():
        if isinstance(x, bool) or not isinstance(x, int | float | np.floating | np.integer):
            raise ConfigError(f"{name} must be a number, got {x!r}")


def _token_ids(ids: object, name: str) -> tuple[int, ...]:
    """Token ids given as a sequence of integers (bytes are no token ids: they were used as
    such, one id per byte)."""
    if isinstance(ids, bytes | bytearray | memoryview):
        raise ConfigError(f"the {name} is bytes: give text (decode it) or a list of token ids")
    if not isinstance(ids, Sequence) or not all(_is_int(t) for t in ids):
        raise ConfigError(f"the {name} must be text or a sequence of integer token ids")
    return tuple(int(t) for t in ids)


def check_limits(*, k: int | None, max_new_tokens: int, scoring: bool = False) -> None:
    """K and the length of a request (also the server's defaults for them), or ConfigError;
    a request that scores its prompt (``scoring``) may generate nothing (0)."""
    if k is not None and k < 0:
        raise ConfigError(f"k must be >= 0, got {k}")
    if max_new_tokens < (0 if scoring else 1):
        least = "0 (the prompt is scored)" if scoring else "1"
        raise ConfigError(f"max_new_tokens must be >= {least}, got {max_new_tokens}")


def make_request(
    prompt: str | Sequence[int] | None = None,
    *,
    messages: Sequence[Message] | None = None,
    system: str | None = None,
    raw: bool = False,
    max_new_tokens: int = 128,
    k: int | None = None,
    adaptive: bool = False,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int = 0,
    chat: bool | None = None,
    stop_on_eos: bool = True,
    stop: str | Sequence[str] | None = None,
    prediction: str | Sequence[int] | None = None,
    parse_special: bool = False,
    logit_bias: Mapping[int, float] | None = None,
    presence_penalty: float = 0.0,
    frequency_penalty: float = 0.0,
    repetition_penalty: float = 1.0,
    json_schema: object = None,
    grammar: str | None = None,
    regex: str | None = None,
    constraint: Constraint | None = None,
    logprobs: int | None = None,
    logprobs_mode: str = "raw",
    prompt_logprobs: int | None = None,
) -> GenerationRequest:
    """The checked request, or a ``ConfigError`` naming the bad argument (``Pair.stream``
    takes these arguments; the prompt's text is encoded by the pair, which has the tokenizer).

    prompt:         text, or token ids (used as they are); with a chat template the
                    text is the last user turn (chat by default).
    messages:       earlier chat turns, a list of {"role", "content"} (roles system,
                    user, assistant, tool); needs a model with a chat template.
    system:         a system prompt (needs a model with a chat template).
    raw:            the text as it is, without the chat template.
    max_new_tokens: the most tokens to generate (>= 1).
    k:              drafts per round (0 = plain decoding; the maximum with adaptive);
                    None: the pair decides (``Pair.default_k``: the profile's policy
                    for a pair it chose, drafts sized below 64 for planned drafts and
                    predictions, else 6).
    adaptive:       choose K each round from the measured acceptance and costs.
    temperature:    0 = greedy (the target's own argmax output); > 0 samples.
    top_k, top_p:   truncation (0 and 1 disable), applied to draft and target alike.
    seed:           fixes the sampled output (same seed, same output).
    chat:           None (default): the chat template when the target has one, raw
                    text otherwise; True: require the template; False: same as raw.
    stop_on_eos:    stop at the end-of-sequence token.
    stop:           stop strings (one or several): the text ends right before the first
                    occurrence of any of them, even across tokens and rounds.
    prediction:     the output you expect, or most of it (OpenAI's Predicted Outputs: the
                    code being edited, a document being revised), as text or token ids.
                    It is drafted from where the output stands in it (re-synchronised
                    after the model inserts, deletes or changes text; the pair's own
                    drafter drafts elsewhere), so the output is exactly what it would be
                    without it: only the speed changes. ``result.prediction_tokens()``
                    (and ``stats``) count accepted / rejected prediction tokens. K caps
                    each draft (default 64; the drafts are sized by the target's measured
                    verify cost below it); k=0 ignores the prediction.
    parse_special:  read special-token text (such as ``<|im_end|>``) inside the text
                    given (the prompt, the messages, the prediction) as special tokens;
                    by default all of it is text, so a message cannot end its turn or
                    open another, and a raw prompt or a prediction cannot forge one.
    logit_bias:     {token id: value in [-100, 100]} added to the logits of those tokens
                    (OpenAI's ``logit_bias``), in the target's rows and the draft's alike.
    presence_penalty, frequency_penalty: in [-2, 2] (OpenAI's; 0 disables), subtracted
                    from the logits of tokens the output already holds, once (presence) or
                    per occurrence (frequency), as vLLM applies them.
    repetition_penalty: in (0, 2] (1 disables): the logits of tokens in the prompt or the
                    output divided by it when positive, multiplied when not (vLLM's and
                    transformers' rule). Every processor applies to the draft's rows as to
                    the target's, along the draft's path, so the output keeps the
                    distribution of plain decoding with the same settings.
    json_schema:    the output is one JSON value this JSON Schema accepts: a dict, its JSON
                    text, or a class with ``model_json_schema()`` (a Pydantic model).
    grammar:        the output follows this grammar: Lark (as llguidance takes it, with
                    ``%json {...}`` for embedded schemas) or GBNF (llama.cpp's format, told
                    apart by its ``::=``).
    regex:          the whole output matches this regular expression.
    constraint:     a ``specdec.constraints.Constraint`` (any of the above, or any JSON
                    object: ``Constraint("json_object")``). At most one of these four; the
                    mask applies to the target's rows and the draft's alike, so the output
                    has the distribution of plain decoding under the same constraint
                    (docs/structured-outputs.md). Needs the ``structured`` extra.
    logprobs:       return the log-probability of each generated token and this many most
                    probable alternatives (0..20; None: none), read from the rows the
                    target's passes computed (no extra pass): ``result.logprobs``.
    logprobs_mode:  "raw" (default, vLLM's default): the model's distribution before the
                    request changes it; "processed": the distribution each token was drawn
                    from (after the logit bias, penalties, temperature, top-k, top-p;
                    greedy rows are one-hot). ``specdec.core.logprobs`` says more.
    prompt_logprobs: score the prompt's tokens too (raw), with this many alternatives each
                    (0..20): ``result.prompt_logprobs`` (None for the first token). The prompt
                    is then prefilled from an empty cache, 64 rows a pass; max_new_tokens
                    may be 0.
    """
    _check_types(max_new_tokens=max_new_tokens, k=k, top_k=top_k, seed=seed)
    _check_reals(
        temperature=temperature,
        top_p=top_p,
        presence_penalty=presence_penalty,
        frequency_penalty=frequency_penalty,
        repetition_penalty=repetition_penalty,
    )
    check_limits(k=k, max_new_tokens=max_new_tokens, scoring=prompt_logprobs is not None)
    check_seed(seed, "seed")
    spec = None if logprobs is None else LogprobSpec(logprobs, logprobs_mode)
    if prompt_logprobs is not None:
        check_top(prompt_logprobs, "prompt_logprobs")
    sampling = SamplingConfig(temperature, top_k, top_p)
    check_penalties(presence_penalty, frequency_penalty, repetition_penalty)
    stops = tuple(check_stops(stop))
    constrained = one_constraint(json_schema, grammar, regex, constraint)
    ids_or_text: str | tuple[int, ...] | None = None
    if prompt is None or isinstance(prompt, str):
        if raw and chat:
            raise ConfigError("raw=True and chat=True contradict each other")
        if raw and (messages is not None or system is not None):
            raise ConfigError("a raw prompt takes no system prompt or messages: drop --raw")
        ids_or_text = prompt
    elif messages is not None or system is not None:
        raise ConfigError("token ids are used as they are: no messages or system prompt")
    else:
        ids_or_text = _token_ids(prompt, "prompt")
    expected: str | tuple[int, ...] | None = None
    if prediction is None or isinstance(prediction, str):
        expected = prediction
    else:
        expected = _token_ids(prediction, "prediction")
    return GenerationRequest(
        prompt=ids_or_text,
        messages=None if messages is None else tuple(messages),
        system=system,
        chat=False if raw else chat,
        parse_special=parse_special,
        sampling=sampling,
        stops=stops,
        prediction=expected,
        max_new_tokens=max_new_tokens,
        k=k,
        adaptive=adaptive,
        seed=seed,
        stop_on_eos=stop_on_eos,
        logit_bias=check_logit_bias(logit_bias),
        presence_penalty=float(presence_penalty),
        frequency_penalty=float(frequency_penalty),
        repetition_penalty=float(repetition_penalty),
        constraint=constrained,
        logprobs=spec,
        prompt_logprobs=prompt_logprobs,
    )


def one_constraint(
    schema: object, grammar: str | None, regex: str | None, constraint: Constraint | None
) -> Constraint | None:
    """The one constraint among ``make_request``'s four arguments (None without one), or a
    ConstraintError naming the argument that is wrong."""
    given = [
        name
        for name, value in (
            ("json_schema", schema),
            ("grammar", grammar),
            ("regex", regex),
            ("constraint", constraint),
        )
        if value is not None
    ]
    if len(given) > 1:
        raise ConstraintError(given[1], f"give one constraint, not {' and '.join(given)}")
    if constraint is not None:
        if not isinstance(constraint, Constraint):
            raise ConstraintError("constraint", "not a specdec.constraints.Constraint")
        return constraint
    if schema is not None:
        make_schema = getattr(schema, "model_json_schema", None)
        return json_schema(make_schema() if callable(make_schema) else schema, "json_schema")
    if grammar is not None:
        return grammar_constraint(grammar, "grammar")
    if regex is not None:
        return Constraint("regex", regex, "regex")
    return None


def choice_seed(seed: int, choice: int) -> int:
    """The seed of choice ``choice`` of a request with ``seed`` (its ``n`` choices are
    generated one after another, each from its own stream): the seed itself for choice 0,
    else a stable hash of (seed, choice) below 2^63."""
    if choice == 0:
        return seed
    digest = hashlib.blake2b(f"{seed}:{choice}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def check_logit_bias(bias: Mapping[int, float] | None) -> tuple[tuple[int, float], ...]:
    """``{token id: value}`` as sorted (id, value) pairs, or a ConfigError naming the bad
    entry (ids must be ints >= 0, values finite in [-100, 100]; the vocabulary's upper bound
    is checked where the model is known)."""
    if bias is None:
        return ()
    if not isinstance(bias, Mapping):
        raise ConfigError(f"logit_bias must map token ids to values, got {type(bias).__name__}")
    out: dict[int, float] = {}
    for tok, value in bias.items():
        if isinstance(tok, bool) or not isinstance(tok, int) or tok < 0:
            raise ConfigError(f"logit_bias: {tok!r} is not a token id")
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"logit_bias: the value for token {tok} is not a number")
        if not -MAX_BIAS <= float(value) <= MAX_BIAS:  # NaN fails too
            raise ConfigError(f"logit_bias: the value for token {tok} is outside [-100, 100]")
        out[tok] = float(value)
    return tuple(sorted(out.items()))
