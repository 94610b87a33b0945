"""Request and response shapes of the OpenAI-compatible endpoints (pydantic models).

Bounds live on the fields so that a bad value is reported with the field's name (HTTP 400);
they are the CLI's rules (K >= 0, temperature >= 0, 0 < top_p <= 1, top_k >= 0, seeds below
2^63), OpenAI's (top_logprobs 0..20, logit_bias values in [-100, 100], presence and frequency
penalties in [-2, 2]) and vLLM's (repetition_penalty, prompt_logprobs,
return_tokens_as_token_ids, logprobs_mode). Fields other servers accept and specdec does not
implement are rejected when they ask for something (``best_of: 2``), and ignored when they
carry their neutral value; unknown fields are ignored, as OpenAI's own server does for forward
compatibility.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from specdec.constraints.spec import Constraint, ConstraintError, json_schema
from specdec.serve.engine_fields import engine_constraints
from specdec.serve.errors import FieldError
from specdec.util.bounds import SEED_LIMIT  # as the CLI

MAX_STOPS = 4  # OpenAI's limit
MAX_CHOICES = 16  # choices per request: n times the prompts of a completions request
MAX_TOP = 20  # OpenAI's bound on top_logprobs (vLLM's default --max-logprobs)

StopField = Annotated[
    str | list[str] | None,
    Field(default=None, description="up to 4 stop strings; the text ends right before one"),
]


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: str


class Speculative(BaseModel):
    """Per-request speculation (llama-server's ``speculative.n_max``): n_max = drafts per round,
    0 = plain decoding with the same target."""

    model_config = ConfigDict(extra="forbid")
    n_max: int | None = Field(default=None, ge=0, le=64)


class PredictionContent(BaseModel):
    """OpenAI's Predicted Outputs: the output expected, or most of it (``drafters.prediction``).
    Content is text or a list of text parts."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["content"]
    content: str | list[TextPart]

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class JsonSchemaFormat(BaseModel):
    """OpenAI's ``response_format.json_schema``: the schema the output follows. ``strict``
    is taken either way: the schema is always enforced (by the mask, never by a retry)."""

    model_config = ConfigDict(extra="ignore")
    name: str = "response"
    description: str | None = None
    schema_: dict[str, Any] | bool | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    """OpenAI's ``response_format``: text (no constraint), any JSON object, or a schema."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    def constraint(self) -> Constraint | None:
        """The constraint this format asks for (None for text), or a FieldError naming it."""
        try:
            if self.type == "json_object":
                return Constraint("json_object", "", "response_format")
            if self.type == "json_schema":
                if self.json_schema is None or self.json_schema.schema_ is None:
                    raise FieldError(
                        "response_format", "a json_schema response format needs json_schema.schema"
                    )
                return json_schema(self.json_schema.schema_, "response_format")
        except ConstraintError as e:
            raise FieldError(e.field, str(e)) from e
        return None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


# Neutral values of OpenAI fields specdec does not implement: anything else is a 400.
UNSUPPORTED: Mapping[str, tuple[Any, ...]] = MappingProxyType(
    {
        "best_of": (None, 1),
        "suffix": (None, ""),
        # llama-server's name: it penalises the last 64 tokens only; specdec's is vLLM's
        # repetition_penalty over the prompt and the output
        "repeat_penalty": (None, 1, 1.0),
        "tools": (None, []),  # /v1/completions (chat takes tools)
        "functions": (None, []),
        "audio": (None,),
    }
)
# What OpenAI documents as unsupported together with ``prediction`` beyond UNSUPPORTED (which
# is refused anyway): the field and its neutral values.
NOT_WITH_PREDICTION: Mapping[str, tuple[Any, ...]] = MappingProxyType(
    {
        "max_completion_tokens": (None,),
        "n": (1,),
        "logprobs": (None, False),
        "top_logprobs": (None,),
        "logit_bias": (None, {}),
        "presence_penalty": (0.0,),
        "frequency_penalty": (0.0,),
    }
)


class GenerationFields(BaseModel):
    """Fields common to /v1/completions and /v1/chat/completions."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, allow_inf_nan=False)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0, description="extension: 0 disables")
    seed: int | None = Field(default=None, ge=0, lt=SEED_LIMIT)
    stop: StopField
    n: int = Field(default=1, ge=1, le=MAX_CHOICES, description="choices, one after another")
    stream: bool = False
    stream_options: StreamOptions | None = None
    speculative: Speculative | None = None
    speculative_n_max: int | None = Field(default=None, alias="speculative.n_max", ge=0, le=64)
    prediction: PredictionContent | None = None
    response_format: ResponseFormat | None = None
    logit_bias: dict[str, float] | None = None
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0, allow_inf_nan=False)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0, allow_inf_nan=False)
    repetition_penalty: float = Field(default=1.0, gt=0.0, le=2.0, allow_inf_nan=False)
    # vLLM's extensions: the prompt's tokens scored, token ids as token texts, which
    # distribution log-probabilities are of (specdec.core.logprobs)
    prompt_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP)
    return_tokens_as_token_ids: bool = False
    logprobs_mode: Literal["raw_logprobs", "processed_logprobs"] | None = None

    @field_validator(
        "temperature",
        "top_p",
        "top_k",
        "n",
        "stream",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "return_tokens_as_token_ids",
        mode="before",
    )
    @classmethod
    def _null_is_the_default(cls, v: Any, info: ValidationInfo) -> Any:
        """Clients that send every field send null for "unset"."""
        return cls.model_fields[str(info.field_name)].default if v is None else v

    @field_validator("stop")
    @classmethod
    def _stops(cls, v: str | list[str] | None) -> list[str]:
        items = [] if v is None else [v] if isinstance(v, str) else v
        if len(items) > MAX_STOPS:
            raise ValueError(f"at most {MAX_STOPS} stop strings are allowed, got {len(items)}")
        if any(not s for s in items):
            raise ValueError("a stop string is empty")
        return items

    @field_validator("logit_bias")
    @classmethod
    def _bias(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        """Token ids as keys (decimal strings, as JSON writes them), values in [-100, 100];
        the vocabulary's bound is checked where the model is known."""
        for key, value in (v or {}).items():
            if not key.isdigit() or len(key) > 9:
                raise ValueError(f"{key[:20]!r} is not a token id")
            if not -100.0 <= value <= 100.0:  # NaN fails too
                raise ValueError(f"the value for token {key} is outside [-100, 100]")
        return v

    def top_logprobs_wanted(self) -> int | None:
        """Alternatives per generated token when log-probabilities are asked for, else None."""
        return None

    def check(self) -> None:
        """Raise ``FieldError`` for a field that asks for something specdec does not do."""
        for name, value in (self.model_extra or {}).items():
            neutral = UNSUPPORTED.get(name)
            if neutral is not None and value not in neutral:
                raise FieldError(name, f"{name} is not supported by specdec serve")
        if self.prediction is not None:
            for name, neutral in NOT_WITH_PREDICTION.items():
                if getattr(self, name, None) not in neutral:
                    how = " (use max_tokens)" if name == "max_completion_tokens" else ""
                    raise FieldError(name, f"{name} cannot be used with prediction{how}")

    def wanted_tokens(self) -> int | None:
        return self.max_tokens

    def constraint(self) -> Constraint | None:
        """The output's constraint (None: free text): from ``response_format``, or from one of
        the fields other engines name it by (``serve.engine_fields``); two are a FieldError."""
        given = [] if self.response_format is None else [self.response_format.constraint()]
        found = [c for c in given if c is not None] + engine_constraints(self.model_extra or {})
        if len(found) > 1:
            raise FieldError(
                found[1].field,
                f"give one constraint of the output: {found[0].field} and {found[1].field} both "
                "constrain it",
            )
        return found[0] if found else None

    def k_override(self) -> int | None:
        """The request's drafts per round, if it names one."""
        if self.speculative is not None and self.speculative.n_max is not None:
            return self.speculative.n_max
        return self.speculative_n_max


class CompletionRequest(GenerationFields):
    """OpenAI's ``prompt``: a text, token ids, or a list of either (one choice each)."""

    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = Field(default=None, ge=0)  # 0: with echo, the prompt scored only
    logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP)
    echo: bool = False

    @field_validator("echo", mode="before")
    @classmethod
    def _echo_null(cls, v: Any) -> Any:
        return False if v is None else v

    @field_validator("prompt")
    @classmethod
    def _prompts(
        cls, v: str | list[int] | list[str] | list[list[int]]
    ) -> str | list[int] | list[str] | list[list[int]]:
        items: list[Any] = v if isinstance(v, list) and v and isinstance(v[0], str | list) else [v]
        if len(items) > MAX_CHOICES:
            raise ValueError(f"at most {MAX_CHOICES} prompts per request, got {len(items)}")
        for one in items:
            if not one or (isinstance(one, str) and not one.strip()):
                raise ValueError("the prompt is empty")
        return v

    def prompts(self) -> list[str | list[int]]:
        """The prompts, one per choice group (a text or token ids each)."""
        v = self.prompt
        if isinstance(v, list) and v and isinstance(v[0], str | list):
            return list(v)
        return [v]  # type: ignore[list-item]

    def top_logprobs_wanted(self) -> int | None:
        return self.logprobs

    def check(self) -> None:
        super().check()
        if self.max_tokens == 0 and not self.echo:
            raise FieldError("max_tokens", "max_tokens 0 is only for echo (the prompt scored)")
        if len(self.prompts()) * self.n > MAX_CHOICES:
            raise FieldError(
                "n", f"n times the prompts is more than {MAX_CHOICES} choices per request"
            )


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str = Field(max_length=256)
    arguments: str = "{}"  # JSON text, as OpenAI sends it


class MessageToolCall(BaseModel):
    """A call in an earlier assistant message."""

    model_config = ConfigDict(extra="ignore")
    id: str = ""
    type: Literal["function"] = "function"
    function: FunctionCall


class FunctionDef(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str = Field(pattern=r"^[A-Za-z0-9_.\-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None  # the parameters are always enforced (a grammar)


class ToolDef(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str


class NamedToolChoice(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["function"]
    function: NamedFunction


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    tool_calls: list[MessageToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


MAX_TOOLS = 128


class ChatRequest(GenerationFields):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = Field(default=None, ge=1)
    tools: list[ToolDef] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP)
    echo: Any = None  # a completions field: refused here (check)

    @field_validator("logprobs", mode="before")
    @classmethod
    def _logprobs_null(cls, v: Any) -> Any:
        return False if v is None else v

    def top_logprobs_wanted(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def check(self) -> None:
        super().check()
        if not any(m.text().strip() or m.tool_calls for m in self.messages):
            raise FieldError("messages", "no message has any content")
        if self.echo not in (None, False):
            raise FieldError("echo", "echo is a /v1/completions field (the prompt's text)")
        if self.top_logprobs and not self.logprobs:
            raise FieldError("top_logprobs", "top_logprobs needs logprobs: true")
        if self.n > MAX_CHOICES:
            raise FieldError("n", f"at most {MAX_CHOICES} choices per request")
        if self.tools and self.prediction is not None:
            raise FieldError("tools", "tools cannot be used with prediction")
        names = [t.function.name for t in self.tools or []]
        if len(set(names)) != len(names):
            raise FieldError("tools", "two tools have the same name")
        choice = self.choice()
        if choice not in ("none", "auto", "required") and choice not in names:
            raise FieldError("tool_choice", f"tool_choice names {choice!r}, not one of the tools")
        if choice == "required" and not names:
            raise FieldError("tool_choice", "tool_choice 'required' needs tools")
        if names and choice != "none" and self.logprobs:
            # the tool-call text is held back and returned as tool_calls, not as content:
            # per-token log-probabilities of the message would not match what is returned
            raise FieldError(
                "logprobs", "logprobs cannot be used with tools (unless tool_choice is none)"
            )

    def choice(self) -> str:
        """``none``, ``auto``, ``required`` or the name of the function to call (OpenAI's
        default: ``auto`` with tools, ``none`` without)."""
        c = self.tool_choice
        if c is None:
            return "auto" if self.tools else "none"
        return c if isinstance(c, str) else c.function.name

    def wanted_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class ResponsesRequest(BaseModel):
    """OpenAI's Responses API (``POST /v1/responses``). Only the envelope's types are checked
    here; ``serve.responses`` reads the input items, tools, tool choice and text format into
    the chat request they stand for, each error naming its place (``input[2].call_id``), and
    the chat request checks the values (temperature, top_p, seed, ... by the chat rules)."""

    model_config = ConfigDict(extra="allow")
    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = None
    top_p: float | None = None
    stream: bool | None = None
    tools: list[dict[str, Any]] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_choice: str | dict[str, Any] | None = None
    text: dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    previous_response_id: str | None = None
    store: bool | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    include: list[str] | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP)


# -- responses ---------------------------------------------------------------------------------


class CompletionTokensDetails(BaseModel):
    """OpenAI's predicted-output counters, filled with the drafts: accepted / rejected."""

    accepted_prediction_tokens: int
    rejected_prediction_tokens: int


class Usage(BaseModel):
    """OpenAI's usage plus specdec's speculative statistics (docs/metrics.md)."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    completion_tokens_details: CompletionTokensDetails
    drafted_tokens: int
    accepted_tokens: int
    verification_rounds: int
    draft_acceptance_rate: float | None
    mean_acceptance_length: float | None
    accepted_length_histogram: list[int]
    acceptance_by_position: list[float | None]
    tokens_per_second: float | None
    time_split: dict[str, float | None]


class Timings(BaseModel):
    """llama-server's ``timings`` names, for tools that read those."""

    prompt_n: int
    prompt_ms: float
    predicted_n: int
    predicted_ms: float
    predicted_per_second: float | None
    draft_n: int
    draft_n_accepted: int


class CompletionLogprobs(BaseModel):
    """OpenAI's completions ``logprobs``: per token its text, log-probability (null for the
    first token of an echoed prompt), the top alternatives (text -> logprob) and where its
    text starts in the choice's text."""

    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None
    # vLLM's: per prompt token {"<id>": {"logprob", "rank", "decoded_token"}}, null first
    prompt_logprobs: list[dict[str, dict[str, Any]] | None] | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None


class ChatTokenLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    """OpenAI's chat ``logprobs``: ``content``, one entry per token of the message."""

    content: list[ChatTokenLogprob] | None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[dict[str, Any]] | None = None


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: ChatDelta
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class _Envelope(BaseModel):
    id: str
    created: int
    model: str
    system_fingerprint: str = "specdec"


class CompletionResponse(_Envelope):
    object: Literal["text_completion"] = "text_completion"
    choices: list[CompletionChoice]
    usage: Usage | None = None
    timings: Timings | None = None


class ChatResponse(_Envelope):
    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatChoice]
    usage: Usage
    timings: Timings


class ChatChunk(_Envelope):
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
    timings: Timings | None = None


class TokenizeRequest(BaseModel):
    """``POST /tokenize``: vLLM's fields (``prompt``, ``add_special_tokens``) or
    llama-server's (``content``, ``add_special``)."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    model: str | None = None
    prompt: str | None = None
    content: str | None = None
    add_special_tokens: bool | None = None
    add_special: bool | None = None

    def text(self) -> str:
        if self.prompt is not None and self.content is not None and self.prompt != self.content:
            raise FieldError("prompt", "prompt and content differ: send one of them")
        text = self.prompt if self.prompt is not None else self.content
        if text is None:
            raise FieldError("prompt", "prompt is required (or llama-server's content)")
        return text

    def special(self) -> bool:
        if self.add_special_tokens is not None:
            return self.add_special_tokens
        return True if self.add_special is None else self.add_special


class DetokenizeRequest(BaseModel):
    """``POST /detokenize``: ``tokens``, a list of token ids (vLLM's and llama-server's)."""

    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    tokens: list[int]


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "specdec"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorBody(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    error: ErrorBody
