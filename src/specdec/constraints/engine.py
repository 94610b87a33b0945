"""The grammar engine, llguidance (why this one: docs/structured-outputs.md, "The engine"),
behind three functions: ``engine()`` (the module, or one clear error when the optional
``structured`` extra is not installed), ``vocabulary(table)`` (its tokenizer for one
vocabulary, built once per model: about 1 s for 151,936 tokens) and ``grammar_text(c)``
(a ``Constraint`` as the grammar text the engine's matcher takes).

Nothing else in specdec imports llguidance.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from specdec.constraints.endless import lark_never_ends, schema_never_ends
from specdec.constraints.spec import Constraint, ConstraintError, schema_object
from specdec.constraints.tokens import TokenTable, greedy_encoder

INSTALL_HINT = "pip install 'specdec[structured]'"

# JSON as the grammar writes it: whitespace between tokens as in the JSON standard, at most
# this many characters at a time, so that a model cannot fill its output with blank lines
# inside a value the schema constrains (llama.cpp's json-schema-to-grammar bounds it too)
JSON_WHITESPACE = r"(?:\x20|\x0A{1,2}[\x20\x09]{0,40})?"
JSON_OPTIONS: dict[str, Any] = {"whitespace_pattern": JSON_WHITESPACE, "lenient": False}

# the engine's own bounds on a grammar's cost (its defaults, stated here so that they are
# ours): per mask step, lexer fuel ~14k/ms and Earley items ~20k/ms; lexer states ~1-2 kB each
LIMITS: dict[str, int] = {
    "step_lexer_fuel": 200_000,
    "step_max_items": 50_000,
    "max_lexer_states": 100_000,
    "max_grammar_size": 500_000,
    "initial_lexer_fuel": 1_000_000,
}


class StructuredUnavailable(ConstraintError):
    """The grammar engine is not installed."""


def engine(field: str = "response_format") -> ModuleType:
    """The llguidance module, or StructuredUnavailable (one line: what to install)."""
    try:
        import llguidance
    except ImportError as e:
        raise StructuredUnavailable(
            field,
            f"structured outputs need the grammar engine llguidance, which is not installed "
            f"({INSTALL_HINT})",
        ) from e
    return llguidance


def limits() -> Any:
    """The engine's parser limits (``LIMITS``)."""
    return engine().LLParserLimits(**LIMITS, verbose_errors=False)


class _Wrapper:
    """The tokenizer object llguidance's ``TokenizerWrapper`` reads."""

    def __init__(self, table: TokenTable) -> None:
        # control tokens are marked by a 0xFF first byte, which no text contains
        self.tokens = [
            b"\xff" + b"<[%d]>" % i if i in table.special else p for i, p in enumerate(table.pieces)
        ]
        self.special_token_ids = sorted(table.special)
        self.eos_token_id = table.eos[0] if table.eos else None
        self.bos_token_id = None
        self._encode = table.encode
        self._greedy = greedy_encoder(table.pieces) if table.encode is None else None

    def __call__(self, text: bytes | str) -> list[int]:
        data = text.encode("utf-8") if isinstance(text, str) else text
        if self._greedy is not None:
            return self._greedy(data)
        assert self._encode is not None
        return self._encode(data.decode("utf-8", errors="replace"))


def vocabulary(table: TokenTable) -> Any:
    """The engine's tokenizer (``LLTokenizer``) for ``table``; expensive, build once."""
    llg = engine()
    if not table.eos:
        raise ConstraintError(
            "response_format", "the model has no end-of-sequence token, so no grammar can end"
        )
    return llg.LLTokenizer(
        llg.TokenizerWrapper(_Wrapper(table)), n_vocab=table.vocab_size, eos_token=list(table.eos)
    )


def grammar_text(c: Constraint) -> str:
    """The engine's grammar for ``c`` (not yet checked against a vocabulary: the matcher
    reports errors, ``constraints.check``); ConstraintError naming ``c.field``, also for a
    grammar or schema that can never end (``constraints.endless``)."""
    llg = engine(c.field)
    endless: str | None = None
    try:
        if c.kind == "json_object":
            return str(llg.LLMatcher.grammar_from_json_schema({"type": "object"}, JSON_OPTIONS))
        if c.kind == "json_schema":
            schema = schema_object(c.source, c.field)
            text = str(llg.LLMatcher.grammar_from_json_schema(schema, JSON_OPTIONS))
            endless = schema_never_ends(schema)
        elif c.kind == "regex":
            return str(llg.LLMatcher.grammar_from_regex(c.source))
        else:
            lark = c.source
            if c.kind == "gbnf":
                from llguidance.gbnf_to_lark import gbnf_to_lark

                lark = gbnf_to_lark(c.source)
            text = str(llg.LLMatcher.grammar_from_lark(lark))
            endless = lark_never_ends(lark)
            if endless and c.kind == "gbnf":
                endless += " (GBNF's root is 'start' here)"
    except RecursionError as e:
        raise ConstraintError(c.field, f"the {c.kind} is nested too deeply") from e
    except Exception as e:  # the engine's converters raise ValueError and their own errors
        raise ConstraintError(c.field, one_line(str(e))) from e
    if endless:  # the engine accepts it, but no output could ever satisfy it
        raise ConstraintError(c.field, endless)
    return text


def one_line(message: str, limit: int = 300) -> str:
    """An engine's message as one line (its state dumps dropped), at most ``limit`` chars."""
    first = message.strip().split("\n<state>")[0].strip().replace("\n", " ")
    return first if len(first) <= limit else first[: limit - 3] + "..."
