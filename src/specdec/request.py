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
from collections.abc import Sequence
from dataclasses import dataclass

from specdec.core.sampling import GREEDY, SamplingConfig
from specdec.core.stops import check_stops
from specdec.errors import ConfigError
from specdec.prompting import Message


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


def check_limits(*, k: int | None, max_new_tokens: int) -> None:
    """K and the length of a request (also the server's defaults for them), or ConfigError."""
    if k is not None and k < 0:
        raise ConfigError(f"k must be >= 0, got {k}")
    if max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens must be >= 1, got {max_new_tokens}")


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
) -> GenerationRequest:
    """The checked request (the arguments are ``Pair.stream``'s), or a ``ConfigError`` naming
    the bad argument. The prompt's text is encoded by the pair (it needs the tokenizer)."""
    check_limits(k=k, max_new_tokens=max_new_tokens)
    sampling = SamplingConfig(temperature, top_k, top_p)
    stops = tuple(check_stops(stop))
    ids_or_text: str | tuple[int, ...] | None = None
    if prompt is None or isinstance(prompt, str):
        if raw and chat:
            raise ConfigError("raw=True and chat=True contradict each other")
        ids_or_text = prompt
    elif messages is not None or system is not None:
        raise ConfigError("token ids are used as they are: no messages or system prompt")
    else:
        ids_or_text = tuple(int(t) for t in prompt)
    expected: str | tuple[int, ...] | None = None
    if prediction is None or isinstance(prediction, str):
        expected = prediction
    else:
        expected = tuple(int(t) for t in prediction)
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
    )
