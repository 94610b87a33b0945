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
import json
import os
import select
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from specdec.templates.sandbox import TemplateError, TemplateLimits, render_here

MAX_WORKERS = 4
GRACE_S = 1.0  # beyond the template's own time limit, before the worker is killed
START_TIMEOUT_S = 60.0  # a worker's start (an interpreter and Jinja) on a loaded machine
_HEADER = struct.Struct("<Q")
_MAX_MESSAGE = 64 << 20

_BOOT = (
    "import json, sys\n"
    "sys.path[:0] = json.loads(sys.argv[1])\n"
    "from specdec.templates.child import main\n"
    "main()\n"
)


class WorkerUnavailable(Exception):
    """No worker process could be started here."""


def _send(stream: Any, obj: Any) -> None:
    body = json.dumps(obj, ensure_ascii=False, default=str).encode("utf-8", "surrogatepass")
    stream.write(_HEADER.pack(len(body)) + body)
    stream.flush()


class _Worker:
    """One worker process and its pipes."""

    def __init__(self) -> None:
        paths = [p for p in sys.path if p and os.path.isabs(p)]
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-c", _BOOT, json.dumps(paths)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                close_fds=True,
            )
        except OSError as e:
            raise WorkerUnavailable(str(e)) from e
        ready = self._receive(time.monotonic() + START_TIMEOUT_S)
        if not (isinstance(ready, dict) and ready.get("ready")):
            self.kill()
            raise WorkerUnavailable("the worker did not start")

    def _read(self, n: int, deadline: float) -> bytes | None:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        out = bytearray()
        while len(out) < n:
            wait = deadline - time.monotonic()
            if wait <= 0 or not select.select([fd], [], [], wait)[0]:
                return None
            chunk = os.read(fd, n - len(out))
            if not chunk:  # the worker died
                return None
            out += chunk
        return bytes(out)

    def _receive(self, deadline: float) -> Any:
        head = self._read(_HEADER.size, deadline)
        if head is None:
            return None
        (n,) = _HEADER.unpack(head)
        if n > _MAX_MESSAGE:
            return None
        body = self._read(n, deadline)
        return None if body is None else json.loads(body.decode("utf-8", "surrogatepass"))

    def render(self, request: dict[str, Any], wait_s: float) -> Any:
        """The worker's reply, or None when it did not answer in ``wait_s`` (or died)."""
        try:
            _send(self.proc.stdin, request)
        except (OSError, ValueError):
            return None
        return self._receive(time.monotonic() + wait_s)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()

    def close(self) -> None:
        """Ask the worker to exit (end of its input), then make sure it did."""
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
            self.proc.wait(timeout=2)
        except (OSError, subprocess.TimeoutExpired):
            pass
        self.kill()


class _Pool:
    """Idle workers, handed out one per render; at most MAX_WORKERS exist."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: list[_Worker] = []
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
            reply = worker.render(request, limits.seconds + GRACE_S)
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

    def _take(self) -> _Worker:
        with self._lock:
            while self._idle:
                worker = self._idle.pop()
                if worker.proc.poll() is None:
                    return worker
                worker.kill()  # it died while idle (killed from outside)
            if self.unavailable is not None:
                raise WorkerUnavailable(self.unavailable)
        try:
            return _Worker()
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
