"""Spec-on and spec-off sides: one server with a per-request switch, or two servers.

One server: spec-off requests carry ``"speculative": {"n_max": 0}`` and the flat key
``"speculative.n_max": 0`` (specdec serve takes both; llama-server reads the flat one). A server
may ignore the switch, so it is trusted only when the responses' draft counters show it took
effect: a probe before the run, then every spec-off response during it. A server that reports
no counters cannot be checked and needs a second URL (a server without speculation).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any

from specdec.endpoint.client import EndpointClient, EndpointConfig, RateLimiter, Reply, Request
from specdec.endpoint.counters import SpecCounters
from specdec.endpoint.errors import EndpointError

SWITCH_OFF: Mapping[str, Any] = MappingProxyType(
    {"speculative": {"n_max": 0}, "speculative.n_max": 0}
)
PER_REQUEST = "per-request"
TWO_SERVERS = "two-servers"
# repetitive, so that prompt lookup and draft models both have something to propose
PROBE_PROMPT = (
    "Repeat the list exactly: alpha beta gamma delta, alpha beta gamma delta, "
    "alpha beta gamma delta, alpha beta gamma delta,"
)


@dataclass(frozen=True)
class Sides:
    """The spec-on and spec-off endpoint configurations."""

    on: EndpointConfig
    off: EndpointConfig
    switch: str  # PER_REQUEST | TWO_SERVERS

    def describe(self) -> str:
        if self.switch == PER_REQUEST:
            return f"{self.on.url} (spec-off requests send speculative.n_max = 0)"
        return f"spec-on {self.on.url}, spec-off {self.off.url}"


def make_sides(on: EndpointConfig, off_url: str | None, off_model: str | None = None) -> Sides:
    if off_url:
        off = replace(on, url=off_url, model=off_model if off_model else on.model)
        if off.url == on.url:
            raise EndpointError(
                "--endpoint-off is the same URL as --endpoint: give the spec-off server's URL, "
                "or leave it out to use the per-request switch"
            )
        return Sides(on, off, TWO_SERVERS)
    return Sides(on, replace(on, extra_body={**on.extra_body, **SWITCH_OFF}), PER_REQUEST)


@dataclass(frozen=True)
class SwitchCheck:
    """What the probe saw."""

    on: SpecCounters | None
    off: SpecCounters | None
    notes: tuple[str, ...]

    @property
    def reports_counters(self) -> bool:
        return self.on is not None or self.off is not None


async def probe_switch(on: EndpointClient, off: EndpointClient, switch: str) -> SwitchCheck:
    """One short greedy request on each side; with the per-request switch, an error unless
    the counters show that the spec-off request drafted nothing."""
    req = Request(PROBE_PROMPT, 16, temperature=0.0, seed=0, stream=True, label="switch probe")
    r_on = await on.generate(req)
    r_off = await off.generate(req)
    notes: list[str] = []
    if switch == PER_REQUEST:
        if r_on.counters is None and r_off.counters is None:
            raise EndpointError(
                f"{on.config.url} reports no speculative counters (timings.draft_n, "
                "usage.drafted_tokens), so the per-request switch cannot be verified: start a "
                "second server without speculation and pass it as --endpoint-off"
            )
        if r_off.counters is not None and r_off.counters.drafted > 0:
            raise EndpointError(
                f"{on.config.url} ignored speculative.n_max = 0 (the spec-off probe drafted "
                f"{r_off.counters.drafted} tokens): pass a server without speculation as "
                "--endpoint-off"
            )
        if r_off.counters is None:
            notes.append("spec-off responses carry no draft counters: read as none drafted")
    if r_on.counters is None:
        notes.append("the spec-on server reports no per-request draft counters")
    elif r_on.counters.drafted == 0:
        notes.append("the spec-on probe drafted nothing (is speculation enabled on the server?)")
    if switch == TWO_SERVERS and r_off.counters is not None and r_off.counters.drafted > 0:
        notes.append(
            f"the spec-off server drafted {r_off.counters.drafted} tokens in the probe: it "
            "speculates too"
        )
    return SwitchCheck(r_on.counters, r_off.counters, tuple(notes))


def check_off_reply(reply: Reply, sides: Sides) -> None:
    """During a run: a spec-off reply through the per-request switch must draft nothing."""
    if sides.switch == PER_REQUEST and reply.counters is not None and reply.counters.drafted:
        raise EndpointError(
            f"{sides.on.url} drafted {reply.counters.drafted} tokens in a request with "
            "speculative.n_max = 0: the switch does not hold; pass --endpoint-off"
        )


def open_clients(
    sides: Sides, rng: random.Random, *, connections: int = 1
) -> tuple[EndpointClient, EndpointClient]:
    """Clients for the two sides sharing one rate bound (``max_rps`` counts both sides), each
    with a pool of ``connections`` (the requests it will have in flight at once)."""
    limiter = RateLimiter(sides.on.max_rps)
    return (
        EndpointClient(sides.on, rng=rng, limiter=limiter, connections=connections, name="spec-on"),
        EndpointClient(
            sides.off, rng=rng, limiter=limiter, connections=connections, name="spec-off"
        ),
    )
