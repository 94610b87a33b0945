"""A worker process that answers one request at a time over pipes, with deadlines: what
runs code whose cost specdec cannot bound in-process (a chat template from a model file, a
grammar from a request) where a hard memory limit and a kill end it.

Messages are length-prefixed JSON both ways (``write_message`` / ``read_message`` on the
worker's side). The worker is ``python -I -c <boot>`` with this interpreter's absolute
``sys.path``; ``boot`` imports the worker's module and calls its ``main()``, which answers
``{"ready": true}`` once it is set up. The parent waits for each reply until a deadline and
kills a worker that has not answered by then (stuck in one long C call) or died.
"""

from __future__ import annotations

import json
import os
import select
import struct
import subprocess
import sys
import time
from typing import Any

HEADER = struct.Struct("<Q")
MAX_MESSAGE = 64 << 20


class WorkerUnavailable(Exception):
    """No worker process could be started here."""


def encode_message(obj: Any) -> bytes:
    body = json.dumps(obj, ensure_ascii=False, default=str).encode("utf-8", "surrogatepass")
    return HEADER.pack(len(body)) + body


def write_message(stream: Any, obj: Any) -> None:
    """Send ``obj`` (JSON) on a binary stream (the worker's standard output)."""
    stream.write(encode_message(obj))
    stream.flush()


def read_message(stream: Any) -> Any:
    """The next message on a binary stream (the worker's standard input); None at its end."""
    head = stream.read(HEADER.size)
    if head is None or len(head) != HEADER.size:
        return None
    (n,) = HEADER.unpack(head)
    body = stream.read(n)
    if body is None or len(body) != n:
        return None
    return json.loads(body.decode("utf-8", "surrogatepass"))


class WorkerProcess:
    """One worker process (``python -I``, running ``module.main()``) and its pipes."""

    def __init__(
        self, module: str, start_timeout_s: float, hello: Any = None, *, boot: str | None = None
    ) -> None:
        """Start the worker; ``hello``, when given, is its first message (its set-up data),
        sent before it answers ready. WorkerUnavailable when it does not start in time.
        ``boot``: the worker's code instead of ``module.main()`` (tests' fake workers)."""
        paths = [p for p in sys.path if p and os.path.isabs(p)]
        boot = boot or (
            "import json, sys\n"
            "sys.path[:0] = json.loads(sys.argv[1])\n"
            f"from {module} import main\n"
            "main()\n"
        )
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-c", boot, json.dumps(paths)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                close_fds=True,
            )
        except OSError as e:
            raise WorkerUnavailable(str(e)) from e
        if hello is not None and not self._send(hello):
            self.kill()
            raise WorkerUnavailable("the worker did not take its set-up")
        ready = self._receive(time.monotonic() + start_timeout_s)
        if not (isinstance(ready, dict) and ready.get("ready")):
            self.kill()
            raise WorkerUnavailable("the worker did not start")

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def _send(self, obj: Any) -> bool:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(encode_message(obj))
            self.proc.stdin.flush()
        except (OSError, ValueError):
            return False
        return True

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
        head = self._read(HEADER.size, deadline)
        if head is None:
            return None
        (n,) = HEADER.unpack(head)
        if n > MAX_MESSAGE:
            return None
        body = self._read(n, deadline)
        return None if body is None else json.loads(body.decode("utf-8", "surrogatepass"))

    def request(self, obj: Any, wait_s: float) -> Any:
        """The worker's reply to ``obj``, or None when it did not answer in ``wait_s`` (or
        died); the caller kills a worker that did not answer."""
        if not self._send(obj):
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


def address_space() -> int:
    """Bytes of address space this process uses now (0 where /proc does not say)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def set_soft_limit(kind: int, soft: int) -> None:
    """Lower a resource's soft limit to ``soft`` (within its hard limit)."""
    import resource

    _, hard = resource.getrlimit(kind)
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(kind, (soft, hard))


def lift_soft_limit(kind: int) -> None:
    """Raise a resource's soft limit back to its hard limit."""
    import resource

    _, hard = resource.getrlimit(kind)
    resource.setrlimit(kind, (hard, hard))
