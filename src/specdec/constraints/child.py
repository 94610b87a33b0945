"""The worker process of ``specdec.constraints.check``: builds the engine's vocabulary once
(its first message: the token table), then checks one constraint at a time under a memory
limit: the grammar is built, a matcher made and its first mask computed (where a costly
lexer is built), and the grammar text or the engine's error goes back.

A request the engine cannot finish within the parent's deadline is ended by the parent (it
kills this process); one past the memory limit fails an allocation here (the process may
die of it, which the parent reports the same way).
"""

from __future__ import annotations

import sys
from typing import Any

from specdec.util.workers import (
    address_space,
    lift_soft_limit,
    read_message,
    set_soft_limit,
    write_message,
)


def _check(vocab: Any, request: dict[str, Any]) -> dict[str, Any]:
    import resource

    from specdec.constraints.engine import grammar_text
    from specdec.constraints.probe import first_mask_error
    from specdec.constraints.spec import Constraint, ConstraintError

    base = address_space()
    if base:
        set_soft_limit(resource.RLIMIT_AS, base + int(request["memory_bytes"]))
    try:
        c = Constraint(request["kind"], request["source"], request["field"], request["trigger"])
        text = grammar_text(c)
        error = first_mask_error(vocab, text)
        return {"error": error} if error else {"grammar": text}
    except ConstraintError as e:
        return {"error": e.detail}
    except MemoryError:
        return {"error": "past its memory limit", "fatal": True}
    finally:
        lift_soft_limit(resource.RLIMIT_AS)


def main() -> None:
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing but replies on the real standard output
    hello = read_message(stdin)
    if not isinstance(hello, dict):
        return
    from specdec.constraints.engine import vocabulary
    from specdec.constraints.tokens import TokenTable

    table = TokenTable(
        tuple(p.encode("latin-1") for p in hello["pieces"]),
        frozenset(hello["special"]),
        tuple(hello["eos"]),
    )
    vocab = vocabulary(table)
    write_message(stdout, {"ready": True})
    while (request := read_message(stdin)) is not None:
        reply = _check(vocab, request)
        write_message(stdout, reply)
        if reply.get("fatal"):
            return
