"""Request and response shapes of the OpenAI-compatible endpoints (pydantic models).

Bounds live on the fields so that a bad value is reported with the field's name (HTTP 400);
they are the CLI's rules (K >= 0, temperature >= 0, 0 < top_p <= 1, top_k >= 0, seeds below
2^63). Fields other servers accept and specdec does not implement are rejected when they ask
for something (``logprobs: 5``), and ignored when they carry their neutral value; unknown
fields are ignored, as OpenAI's own server does for forward compatibility.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from specdec.constraints.spec import Constraint, ConstraintError, json_schema
from specdec.serve.errors import FieldError
from specdec.util.bounds import SEED_LIMIT  # as the CLI

MAX_STOPS = 4  # OpenAI's limit

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
        "logprobs": (None, False, 0),
        "top_logprobs": (None, 0),
        "echo": (None, False),
        "best_of": (None, 1),
        "suffix": (None, ""),
        "logit_bias": (None, {}),
        "presence_penalty": (None, 0, 0.0),
        "frequency_penalty": (None, 0, 0.0),
        "tools": (None, []),  # /v1/completions (chat takes tools)
        "functions": (None, []),
        "audio": (None,),
    }
)
# What OpenAI documents as unsupported together with ``prediction`` beyond UNSUPPORTED (which
# is refused anyway): the field and its neutral values.
NOT_WITH_PREDICTION: Mapping[str, tuple[Any, ...]] = MappingProxyType(
    {"max_completion_tokens": (None,)}
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
    n: int = Field(default=1, ge=1, le=1, description="only one choice per request")
    stream: bool = False
    stream_options: StreamOptions | None = None
    speculative: Speculative | None = None
    speculative_n_max: int | None = Field(default=None, alias="speculative.n_max", ge=0, le=64)
    prediction: PredictionContent | None = None
    response_format: ResponseFormat | None = None

    @field_validator("temperature", "top_p", "top_k", "n", "stream", mode="before")
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

    def check(self) -> None:
        """Raise ``FieldError`` for a field that asks for something specdec does not do."""
        for name, value in (self.model_extra or {}).items():
            neutral = UNSUPPORTED.get(name)
            if neutral is not None and value not in neutral:
                raise FieldError(name, f"{name} is not supported by specdec serve")
        if self.prediction is not None:
            for name, neutral in NOT_WITH_PREDICTION.items():
                if getattr(self, name, None) not in neutral:
                    raise FieldError(
                        name, f"{name} cannot be used with prediction (use max_tokens)"
                    )

    def wanted_tokens(self) -> int | None:
        return self.max_tokens

    def constraint(self) -> Constraint | None:
        """The output's constraint from ``response_format`` (None: free text)."""
        return None if self.response_format is None else self.response_format.constraint()

    def k_override(self) -> int | None:
        """The request's drafts per round, if it names one."""
        if self.speculative is not None and self.speculative.n_max is not None:
            return self.speculative.n_max
        return self.speculative_n_max


class CompletionRequest(GenerationFields):
    prompt: str | list[int] | list[str]

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, v: str | list[int] | list[str]) -> str | list[int]:
        if isinstance(v, list) and v and isinstance(v[0], str):
            if len(v) != 1:
                raise ValueError("one prompt per request (n = 1)")
            v = v[0]
        if not v or (isinstance(v, str) and not v.strip()):
            raise ValueError("the prompt is empty")
        return v  # type: ignore[return-value]


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

    def check(self) -> None:
        super().check()
        if not any(m.text().strip() or m.tool_calls for m in self.messages):
            raise FieldError("messages", "no message has any content")
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

    def choice(self) -> str:
        """``none``, ``auto``, ``required`` or the name of the function to call (OpenAI's
        default: ``auto`` with tools, ``none`` without)."""
        c = self.tool_choice
        if c is None:
            return "auto" if self.tools else "none"
        return c if isinstance(c, str) else c.function.name

    def wanted_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


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


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: None = None
    finish_reason: str | None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[dict[str, Any]] | None = None


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: str


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: ChatDelta
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
