"""The worker process of ``specdec.templates.isolation``: renders one request at a time under a
memory limit, a CPU-time limit and a timer, and answers on standard output.

Messages are length-prefixed JSON both ways. The worker exits at the end of its input (the
parent closed it, or died).
"""

from __future__ import annotations

import json
import os
import signal
import struct
import sys
from typing import Any

from specdec.templates.sandbox import TemplateError, TemplateLimits, render_here

_HEADER = struct.Struct("<Q")


class _OutOfTime(BaseException):
    """Raised by the timer: a BaseException, so that no ``except Exception`` inside Jinja
    (its constant folding catches everything) can swallow it."""


def _read(stream: Any, n: int) -> bytes | None:
    data = stream.read(n)
    return data if data is not None and len(data) == n else None


def _receive(stream: Any) -> Any:
    head = _read(stream, _HEADER.size)
    if head is None:
        return None
    body = _read(stream, _HEADER.unpack(head)[0])
    return None if body is None else json.loads(body.decode("utf-8", "surrogatepass"))


def _send(stream: Any, obj: Any) -> None:
    body = json.dumps(obj, ensure_ascii=False).encode("utf-8", "surrogatepass")
    stream.write(_HEADER.pack(len(body)) + body)
    stream.flush()


def _address_space() -> int:
    """Bytes of address space this process uses now (0 where /proc does not say)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _limit(kind: int, soft: int) -> None:
    import resource

    _, hard = resource.getrlimit(kind)
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(kind, (soft, hard))


def _unlimit(kind: int) -> None:
    import resource

    _, hard = resource.getrlimit(kind)
    resource.setrlimit(kind, (hard, hard))


def _timeout(signum: int, frame: Any) -> None:
    raise _OutOfTime


def _render(request: dict[str, Any]) -> dict[str, Any]:
    import resource

    limits = TemplateLimits(**request["limits"])
    base = _address_space()
    cpu = resource.getrusage(resource.RUSAGE_SELF)
    used = int(cpu.ru_utime + cpu.ru_stime)
    if base:
        _limit(resource.RLIMIT_AS, base + limits.memory_bytes)
    _limit(resource.RLIMIT_CPU, used + int(limits.seconds) + 3)
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
        _unlimit(resource.RLIMIT_AS)
        _unlimit(resource.RLIMIT_CPU)


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
    _send(stdout, {"ready": True})
    while (request := _receive(stdin)) is not None:
        try:
            reply = _render(request)
        except _OutOfTime:  # the timer fired just outside the render
            reply = {"error": "the chat template ran out of time"}
        _send(stdout, reply)
        if reply.get("fatal"):
            return
