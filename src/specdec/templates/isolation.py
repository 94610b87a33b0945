"""Chat templates rendered in worker processes with a hard memory and time limit.

The sandbox's checks name the operations that can build large values; this layer bounds the
rest. Each render runs in a worker process (``python -I``, started once and reused) that sets
``RLIMIT_AS`` to its current size plus ``TemplateLimits.memory_bytes`` and ``RLIMIT_CPU``
for the render, and stops template code after ``seconds`` with a timer. The caller waits at
most ``seconds + GRACE_S``; a worker that has not answered by then (stuck in one long C
operation) is killed and the render fails with one clear error. A worker that runs out of
memory is replaced. Up to ``MAX_WORKERS`` renders run at once, each in its own worker, so in
``specdec serve`` a hostile template holds one worker for at most a few seconds while other
requests render in others; the waiting thread holds no lock and no GIL.

Where no worker can run (not a POSIX system, or the interpreter cannot start one) rendering
falls back to the sandbox in this process.
"""

from __future__ import annotations

import atexit
import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from specdec.templates.sandbox import TemplateError, TemplateLimits, render_here
from specdec.util.workers import WorkerProcess, WorkerUnavailable

MAX_WORKERS = 4
GRACE_S = 1.0  # beyond the template's own time limit, before the worker is killed
START_TIMEOUT_S = 60.0  # a worker's start (an interpreter and Jinja) on a loaded machine
CHILD = "specdec.templates.child"


def _start_worker() -> WorkerProcess:
    return WorkerProcess(CHILD, START_TIMEOUT_S)


class _Pool:
    """Idle workers, handed out one per render; at most MAX_WORKERS exist."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: list[WorkerProcess] = []
        self._slots = threading.BoundedSemaphore(MAX_WORKERS)
        self.unavailable: str | None = None if os.name == "posix" else "not a POSIX system"

    def render(
        self,
        template: str,
        messages: Sequence[Mapping[str, Any]],
        variables: Mapping[str, Any] | None,
        limits: TemplateLimits,
    ) -> str:
        request = {
            "template": template,
            "messages": [dict(m) for m in messages],
            "variables": dict(variables or {}),
            "limits": limits.as_dict(),
        }
        with self._slots:
            worker = self._take()
            reply = worker.request(request, limits.seconds + GRACE_S)
            if reply is None:
                worker.kill()
                raise TemplateError(
                    f"the chat template ran for more than {limits.seconds:g} s or past its "
                    f"memory limit ({limits.memory_bytes >> 20} MiB); its process was stopped"
                )
            if reply.get("fatal"):
                worker.kill()
            else:
                with self._lock:
                    self._idle.append(worker)
        if "error" in reply:
            raise TemplateError(str(reply["error"]))
        return str(reply["text"])

    def _take(self) -> WorkerProcess:
        with self._lock:
            while self._idle:
                worker = self._idle.pop()
                if worker.alive:
                    return worker
                worker.kill()  # it died while idle (killed from outside)
            if self.unavailable is not None:
                raise WorkerUnavailable(self.unavailable)
        try:
            return _start_worker()
        except WorkerUnavailable as e:
            with self._lock:
                self.unavailable = str(e)
            raise

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for w in idle:
            w.close()


_POOL = _Pool()
atexit.register(_POOL.close)


def render_isolated(
    template: str,
    messages: Sequence[Mapping[str, Any]],
    variables: Mapping[str, Any] | None,
    limits: TemplateLimits,
) -> str:
    """Render in a worker process; in this process where no worker can run."""
    try:
        return _POOL.render(template, messages, variables, limits)
    except WorkerUnavailable:
        return render_here(template, messages, variables, limits)
