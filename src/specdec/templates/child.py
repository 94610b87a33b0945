"""The worker process of ``specdec.templates.isolation``: renders one request at a time under a
memory limit, a CPU-time limit and a timer, and answers on standard output.

Messages are length-prefixed JSON both ways. The worker exits at the end of its input (the
parent closed it, or died).
"""

from __future__ import annotations

import signal
import sys
from typing import Any

from specdec.templates.sandbox import TemplateError, TemplateLimits, render_here
from specdec.util.workers import (
    address_space,
    lift_soft_limit,
    read_message,
    set_soft_limit,
    write_message,
)


class _OutOfTime(BaseException):
    """Raised by the timer: a BaseException, so that no ``except Exception`` inside Jinja
    (its constant folding catches everything) can swallow it."""


def _timeout(signum: int, frame: Any) -> None:
    raise _OutOfTime


def _render(request: dict[str, Any]) -> dict[str, Any]:
    import resource

    limits = TemplateLimits(**request["limits"])
    base = address_space()
    cpu = resource.getrusage(resource.RUSAGE_SELF)
    used = int(cpu.ru_utime + cpu.ru_stime)
    if base:
        set_soft_limit(resource.RLIMIT_AS, base + limits.memory_bytes)
    set_soft_limit(resource.RLIMIT_CPU, used + int(limits.seconds) + 3)
    signal.setitimer(signal.ITIMER_REAL, limits.seconds)
    try:
        text = render_here(
            request["template"], request["messages"], request["variables"], limits, trace=False
        )
        return {"text": text}
    except _OutOfTime:
        return {"error": f"the chat template ran for more than {limits.seconds:g} s"}
    except TemplateError as e:
        fatal = isinstance(e.__cause__, MemoryError)
        return {"error": str(e), "fatal": fatal}
    except MemoryError:
        limit = limits.memory_bytes >> 20
        return {
            "error": f"the chat template ran past its memory limit ({limit} MiB)",
            "fatal": True,
        }
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        lift_soft_limit(resource.RLIMIT_AS)
        lift_soft_limit(resource.RLIMIT_CPU)


def _warm_up() -> None:
    """Import Jinja2 and build its sandbox once before any limit is set: the memory limit is
    the template's, and a first render that imported Jinja2 under it (8 MiB in the tests)
    failed in the import's own regex compilation instead of in the template."""
    render_here("{{ messages|length }}", [], None, TemplateLimits(), trace=False)


def main() -> None:
    _warm_up()
    signal.signal(signal.SIGALRM, _timeout)
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing but replies on the real standard output
    write_message(stdout, {"ready": True})
    while (request := read_message(stdin)) is not None:
        try:
            reply = _render(request)
        except _OutOfTime:  # the timer fired just outside the render
            reply = {"error": "the chat template ran out of time"}
        write_message(stdout, reply)
        if reply.get("fatal"):
            return
