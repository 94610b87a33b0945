"""Constrained decoding: a JSON schema, any JSON object, a regular expression or a grammar
(Lark, GBNF) as a token mask, applied by one row processor (``core.processors``) to the
target's rows along the draft's path and to a draft model's rows, its state moved with the
context (rolled back with the caches after rejected drafts). The output then has exactly the
distribution of plain decoding under the same constraint; greedy output is its tokens.

    spec        Constraint: what the user asked (kind, text, the field it came from)
    tokens      TokenTable: the bytes of every token id, the control and end ids
    engine      the grammar engine (llguidance, the optional ``structured`` extra)
    probe       one grammar tried against a vocabulary (a matcher and its first mask)
    check       constraints checked in worker processes with a deadline and a memory limit
    child       that worker process
    processor   GrammarProcessor: the RowProcessor over the engine's matcher
    grammars    Grammars: one model's constraints (what is built once per model)

docs/structured-outputs.md says what is supported, how it is checked and what it costs.
"""

from __future__ import annotations

from specdec.constraints.spec import Constraint, ConstraintError, json_schema

__all__ = ["Constraint", "ConstraintError", "json_schema"]
