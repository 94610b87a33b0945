"""``specdec bench --endpoint``: spec-on vs spec-off on a running server, over a sweep of
client concurrency.

Design. For each mode (greedy, sampled), concurrency c and repeat, the prompts are cut into
groups of c requests (wrapping around the prompt list so that every group is full). A group
is sent to one side as c concurrent streamed requests, then the same c requests (same
prompts, same seeds) to the other side; which side goes first alternates from group to group,
so slow drift of the machine falls on both. Per request: time to first token, decode tokens/s
(tokens after the first, per second after the first arrived), end-to-end latency and the
draft counters when the server reports them; per group: its wall time (throughput), and the
server's ``/metrics`` counters before and after it when it exposes known series.

Results are JSON lines, appended and fsynced one record at a time (``bench.results``): a
header per session, ``endpoint_request`` records and an ``endpoint_group`` record that closes
each group. ``--resume`` skips groups that have their closing record.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from specdec.bench.plan import MAX_COUNT
from specdec.bench.results import ResultsWriter, open_for_append
from specdec.endpoint.capacity import MAX_CONCURRENCY, ensure_open_files
from specdec.endpoint.client import EndpointClient, Reply, Request
from specdec.endpoint.counters import has_known_series, metrics_counters
from specdec.endpoint.pairing import (
    Sides,
    SwitchCheck,
    check_off_reply,
    open_clients,
    probe_switch,
)
from specdec.errors import ConfigError
from specdec.prompt_sets import Prompt
from specdec.util.bounds import check_range, check_seed
from specdec.util.credentials import redact_argv, redact_url
from specdec.util.printable import printable

from .records import GroupKey, finished_groups, read_records

SCHEMA = "specdec-endpoint-bench/1"
MODES = ("greedy", "sampled")
SAMPLED_TEMPERATURE = 1.0


@dataclass(frozen=True)
class EndpointBenchPlan:
    prompts: tuple[Prompt, ...]
    concurrency: tuple[int, ...] = (1, 2, 4)
    modes: tuple[str, ...] = ("greedy",)
    max_new_tokens: int = 64
    repeats: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.prompts:
            raise ConfigError("no prompts to send")
        if not self.concurrency or any(c < 1 for c in self.concurrency):
            raise ConfigError(f"concurrency levels must be >= 1, got {self.concurrency}")
        bad = [m for m in self.modes if m not in MODES]
        if bad or not self.modes:
            raise ConfigError(f"modes must be among {', '.join(MODES)}, got {self.modes}")
        if self.max_new_tokens < 1 or self.repeats < 1:
            raise ConfigError("max-new-tokens and repeats must be >= 1")
        check_range(self.repeats, "repeats", 1, MAX_COUNT)
        check_range(max(self.concurrency), "concurrency", 1, MAX_CONCURRENCY)
        check_seed(self.seed)

    def describe(self) -> dict[str, Any]:
        return {
            "prompt_ids": [p.id for p in self.prompts],
            "concurrency": list(self.concurrency),
            "modes": list(self.modes),
            "max_new_tokens": self.max_new_tokens,
            "repeats": self.repeats,
            "seed": self.seed,
        }


@dataclass(frozen=True)
class Slot:
    """One request of a group: which prompt and which seed (the same on both sides)."""

    index: int
    prompt: Prompt
    seed: int


def groups(plan: EndpointBenchPlan, mode: str, c: int, repeat: int) -> list[list[Slot]]:
    """The groups of c requests for one (mode, concurrency, repeat)."""
    n = len(plan.prompts)
    total = -(-max(n, c) // c) * c  # at least every prompt once, whole groups
    rng = random.Random(f"{plan.seed}:{mode}:{c}:{repeat}")
    slots = [Slot(i, plan.prompts[i % n], rng.randrange(2**31)) for i in range(total)]
    return [slots[g : g + c] for g in range(0, total, c)]


def first_side(group: int) -> str:
    return "on" if group % 2 == 0 else "off"


@dataclass
class EndpointBenchOutcome:
    measured_groups: int = 0
    skipped_groups: int = 0
    notes: list[str] = field(default_factory=list)


def _check_resumable(records: Sequence[dict[str, Any]], header: dict[str, Any]) -> None:
    old = [r for r in records if r.get("type") == "endpoint_header"]
    if not old and records:
        raise ConfigError("the results file is not from `specdec bench --endpoint`")
    for h in old:
        for key in ("plan", "endpoint_on", "endpoint_off", "switch", "model", "api"):
            if h.get(key) != header.get(key):
                raise ConfigError(
                    f"cannot resume: the file was made with another {key} "
                    f"({h.get(key)!r} vs {header.get(key)!r})"
                )


def request_record(
    reply: Reply, *, key: GroupKey, slot: Slot, start_offset: float
) -> dict[str, Any]:
    mode, c, repeat, group, side = key
    counters = reply.counters
    return {
        "type": "endpoint_request",
        "mode": mode,
        "concurrency": c,
        "repeat": repeat,
        "group": group,
        "side": side,
        "slot": slot.index,
        "prompt_id": slot.prompt.id,
        "category": slot.prompt.category,
        "seed": slot.seed,
        "start_offset_s": start_offset,
        "ttft_s": reply.ttft_s,
        "e2e_s": reply.e2e_s,
        "decode_tps": reply.decode_tps,
        "n_tokens": reply.n_tokens,
        "tokens_source": reply.tokens_source,
        "n_chunks": reply.n_chunks,
        "finish_reason": reply.finish_reason,
        "drafted": counters.drafted if counters else None,
        "accepted": counters.accepted if counters else None,
        "counter_source": counters.source if counters else None,
        "attempts": reply.attempts,
    }


async def _run_group(
    client: EndpointClient,
    slots: Sequence[Slot],
    mode: str,
    max_tokens: int,
) -> tuple[list[tuple[Reply, float]], float]:
    """The group's requests at once: ([(reply, start offset)], wall seconds)."""
    temperature = SAMPLED_TEMPERATURE if mode == "sampled" else 0.0
    t0 = time.monotonic()

    async def one(slot: Slot) -> tuple[Reply, float]:
        offset = time.monotonic() - t0
        label = f"{mode}, {len(slots)} clients, prompt {printable(slot.prompt.id, 80)}"
        req = Request(
            slot.prompt.text, max_tokens, temperature=temperature, seed=slot.seed, label=label
        )
        return await client.generate(req), offset

    tasks = [asyncio.create_task(one(s)) for s in slots]
    try:
        results = await asyncio.gather(*tasks)
    except BaseException:
        for t in tasks:  # one failed: stop the others before the client closes
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    return list(results), time.monotonic() - t0


async def run_endpoint_bench(
    plan: EndpointBenchPlan,
    sides: Sides,
    out: str | Path,
    *,
    resume: bool,
    overwrite: bool,
    argv: Sequence[str],
    seed_rng: random.Random,
    log: Callable[[str], None],
) -> EndpointBenchOutcome:
    """Run the plan against the two sides, appending to ``out``."""
    outcome = EndpointBenchOutcome()
    clients = max(plan.concurrency)
    # both sides' pools are open at once (one connection per client each)
    ensure_open_files(2 * clients, f"--concurrency {clients}")
    on, off = open_clients(sides, seed_rng, connections=clients)
    async with on, off:
        model_on = await on.resolve_model()
        model_off = await off.resolve_model()
        check: SwitchCheck = await probe_switch(on, off, sides.switch)
        outcome.notes.extend(check.notes)
        header = {
            "type": "endpoint_header",
            "schema": SCHEMA,
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "argv": redact_argv(argv),  # no API key on disk
            "endpoint_on": redact_url(sides.on.url),
            "endpoint_off": redact_url(sides.off.url) if sides.off.url != sides.on.url else None,
            "switch": sides.switch,
            "model": model_on,
            "model_off": model_off,
            "api": sides.on.api,
            "plan": plan.describe(),
            "probe": {
                "on": asdict(check.on) if check.on else None,
                "off": asdict(check.off) if check.off else None,
                "notes": list(check.notes),
            },
        }
        writer, _, cut = open_for_append(
            out, resume=resume, overwrite=overwrite, header_type="endpoint_header"
        )
        with writer:
            records = read_records(out) if resume else []
            if resume:
                _check_resumable(records, header)
            if cut:
                outcome.notes.append(f"cut a partial last line off {out} before resuming")
            done = finished_groups(records)
            short: dict[tuple[str, int, str], int] = {}  # the fewest requests on the wire
            lengths: dict[tuple[str, int, int, int], list[list[int | None]]] = {}
            unequal = 0  # slots whose two replies differ in length
            writer.append(header)
            scrape = {
                "on": has_known_series(await on.scrape_metrics() or {}),
                "off": has_known_series(await off.scrape_metrics() or {}),
            }
            for mode in plan.modes:
                for c in plan.concurrency:
                    for repeat in range(plan.repeats):
                        for g, slots in enumerate(groups(plan, mode, c, repeat)):
                            first = first_side(g)
                            for side in (first, "off" if first == "on" else "on"):
                                key: GroupKey = (mode, c, repeat, g, side)
                                if key in done:
                                    outcome.skipped_groups += 1
                                    continue
                                client = on if side == "on" else off
                                peak, n_tokens = await _measure_group(
                                    client, slots, key, plan, sides, writer, scrape[side]
                                )
                                outcome.measured_groups += 1
                                both = lengths.setdefault((mode, c, repeat, g), [])
                                both.append(n_tokens)
                                if len(both) == 2:
                                    unequal += sum(a != b for a, b in zip(*both, strict=True))
                                if peak < c:
                                    short[(mode, c, side)] = min(
                                        peak, short.get((mode, c, side), c)
                                    )
                        log(f"mode {mode}, concurrency {c}, repeat {repeat + 1}: done")
            if unequal:
                outcome.notes.append(
                    f"{unequal} request(s) got replies of different lengths from the two sides "
                    "(a reply cut short, or outputs that differ): left out of the paired "
                    "end-to-end speedup (the report counts them)"
                )
    for (mode, c, side), peak in short.items():
        outcome.notes.append(
            f"{mode}, {c} clients, spec-{side}: in a group only {peak} requests were on the "
            "wire at once (measured at the client); the report gives the figures per level"
        )
    return outcome


async def _measure_group(
    client: EndpointClient,
    slots: Sequence[Slot],
    key: GroupKey,
    plan: EndpointBenchPlan,
    sides: Sides,
    writer: ResultsWriter,
    scrape: bool,
) -> tuple[int, list[int | None]]:
    """Measure one group and write its records: the most requests it had on the wire, and
    each slot's reply length."""
    mode, c, repeat, group, side = key
    before = await client.scrape_metrics() if scrape else None
    client.in_flight.open_window()
    replies, wall = await _run_group(client, slots, mode, plan.max_new_tokens)
    sent = client.in_flight.window()
    after = await client.scrape_metrics() if scrape else None
    for (reply, offset), slot in zip(replies, slots, strict=True):
        if side == "off":
            check_off_reply(reply, sides)
        writer.append(request_record(reply, key=key, slot=slot, start_offset=offset))
    scraped = metrics_counters(before, after) if before is not None and after else None
    tokens = [r.n_tokens for r, _ in replies if r.n_tokens is not None]
    writer.append(
        {
            "type": "endpoint_group",
            "mode": mode,
            "concurrency": c,
            "repeat": repeat,
            "group": group,
            "side": side,
            "n_requests": len(slots),
            # requests on the wire at once, measured at the client (what the server could see)
            "peak_in_flight": sent.peak,
            "mean_in_flight": sent.mean,
            "wall_s": wall,
            "n_tokens": sum(tokens),
            "throughput_tps": sum(tokens) / wall if wall > 0 else None,
            "median_e2e_s": statistics.median(r.e2e_s for r, _ in replies),
            "metrics_drafted": scraped.drafted if scraped else None,
            "metrics_accepted": scraped.accepted if scraped else None,
        }
    )
    return sent.peak, [r.n_tokens for r, _ in replies]
