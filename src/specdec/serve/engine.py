"""One generation at a time per loaded pair, a bounded queue, cancellation between rounds.

The models and their caches belong to ONE worker thread: every job runs there, start to end,
one after the other, so no request can see or change another's cache state mid-generation
(the next job's prefill keeps only the prefix its prompt really shares with the cache). The
event loop never runs model code; it talks to a job through an ``asyncio.Queue`` that the
worker fills with ``call_soon_threadsafe``. A job checks its ``cancelled`` flag between rounds
(``Job.cancelled``), so a client that goes away frees the models at the next round.

Admission: at most ``max_queue`` jobs wait behind the running one; beyond that ``submit``
raises ``QueueFull`` (the server answers 429 with a Retry-After estimated from recent jobs).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any


class QueueFull(Exception):
    """Every queue slot is taken."""

    def __init__(self, retry_after: int) -> None:
        super().__init__(f"the queue is full; retry in {retry_after} s")
        self.retry_after = retry_after


class ShuttingDown(Exception):
    """The server is shutting down and takes no new work."""


@dataclass
class Finished:
    """The job's work returned ``value`` (the last message of every job that ran)."""

    value: Any


@dataclass
class Failed:
    """The job's work raised ``error``."""

    error: BaseException


class Job:
    """A unit of work on the worker thread, seen from both sides: the worker calls ``emit``,
    the event loop awaits ``next()``; either side may read ``cancelled``."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._messages: asyncio.Queue[Any] = asyncio.Queue()
        self.cancelled = threading.Event()
        self.submitted = time.perf_counter()
        self.started: float | None = None  # when the worker picked it up

    def emit(self, message: Any) -> None:
        """Hand a message to the event loop (worker side)."""
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody is listening
            self.loop.call_soon_threadsafe(self._messages.put_nowait, message)

    async def next(self) -> Any:
        """The next message (event-loop side)."""
        return await self._messages.get()

    def cancel(self) -> None:
        """Stop at the next round, or before starting when still queued."""
        self.cancelled.set()

    @property
    def queue_seconds(self) -> float:
        return (self.started or time.perf_counter()) - self.submitted


Work = Callable[[Job], Any]


def worker_thread() -> ThreadPoolExecutor:
    """The thread a served pair is loaded on and generates on. One thread for both: llama.cpp
    built with OpenMP keeps a thread team per calling thread, and a pair whose first passes
    ran on another thread (an exact target's load-time self-check, the verify-cost
    measurement) decoded 15-40 % slower on the second one here (2-core AMD EPYC: a plain
    step 45-52 ms against 36-39 ms; ``benchmarks/results/serve-exact-price-before-fix.jsonl``)."""
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="specdec-generate")


class Engine:
    """The worker thread of one loaded pair and its admission queue."""

    def __init__(
        self,
        max_queue: int,
        on_failure: Callable[[], None] | None = None,
        worker: ThreadPoolExecutor | None = None,
    ) -> None:
        """``worker``: the one-thread executor the pair was loaded on (``worker_thread``), so
        that every llama.cpp pass runs on one thread; a new one when None."""
        if max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {max_queue}")
        self.max_queue = max_queue
        self._on_failure = on_failure  # resets the caches after a job that raised
        self._executor = worker or worker_thread()
        self._jobs: set[Job] = set()  # admitted and not finished (event-loop side only)
        self._running: Job | None = None
        self._mean_seconds = 1.0  # a running mean of job durations, for Retry-After
        self.closing = False

    @property
    def waiting(self) -> int:
        return len(self._jobs) - (1 if self._running is not None else 0)

    @property
    def running(self) -> int:
        return 1 if self._running is not None else 0

    def submit(self, work: Work) -> Job:
        """Queue ``work`` (called with its Job on the worker thread); its return value arrives
        as ``Finished``, an exception as ``Failed``. Raises QueueFull or ShuttingDown."""
        if self.closing:
            raise ShuttingDown("the server is shutting down")
        if self._live() > self.max_queue:
            raise QueueFull(self.retry_after())
        loop = asyncio.get_running_loop()
        job = Job(loop)
        self._jobs.add(job)
        future = loop.run_in_executor(self._executor, self._run, job, work)
        future.add_done_callback(lambda _: self._finished(job))
        return job

    def _live(self) -> int:
        """Jobs admitted and not finished, less the queued ones already cancelled (their
        clients left: the worker skips them)."""
        return sum(1 for j in self._jobs if j is self._running or not j.cancelled.is_set())

    def retry_after(self) -> int:
        """Seconds a refused request should wait: recent jobs' mean time per job ahead."""
        return max(1, min(600, math.ceil(self._mean_seconds * max(1, self._live()))))

    def _run(self, job: Job, work: Work) -> None:
        """Worker side: run one job to its end."""
        job.started = time.perf_counter()
        with contextlib.suppress(RuntimeError):  # a closed loop
            job.loop.call_soon_threadsafe(self._started, job)
        if job.cancelled.is_set():
            job.emit(Finished(None))
            return
        try:
            job.emit(Finished(work(job)))
        except BaseException as e:  # reported to the request; the worker goes on
            if self._on_failure is not None:
                self._on_failure()
            job.emit(Failed(e))

    def _started(self, job: Job) -> None:
        self._running = job

    def _finished(self, job: Job) -> None:
        self._jobs.discard(job)
        if self._running is job:
            self._running = None
        if job.started is not None:
            took = time.perf_counter() - job.started
            self._mean_seconds = 0.8 * self._mean_seconds + 0.2 * took

    def begin_shutdown(self, grace_s: float) -> None:
        """A shutdown begins (event-loop side): take no new work, answer the queued jobs now
        (``Finished(None)``: they never run), and let the running one go on for ``grace_s``
        seconds before it is cancelled (it stops at its next round)."""
        if self.closing:
            return
        self.closing = True
        for job in list(self._jobs):
            if job.started is None:  # still queued (the worker has not picked it up)
                job.cancel()
                job.emit(Finished(None))
        loop = asyncio.get_running_loop()
        loop.call_later(grace_s, self._cancel_all)

    def _cancel_all(self) -> None:
        for job in list(self._jobs):
            job.cancel()

    async def shutdown(self) -> None:
        """Take no new work, cancel what is queued or running (it stops at its next round),
        and wait for the worker to be idle: the caches are left consistent."""
        self.closing = True
        for job in list(self._jobs):
            job.cancel()
        await asyncio.get_running_loop().run_in_executor(None, self._executor.shutdown, True)
