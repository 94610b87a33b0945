"""The requests of ``certify --endpoint``: greedy pairs, sampled requests, per-token scoring.

- **Both servers at once.** With two servers, the spec-on and the spec-off requests run side by
  side, each server seeing at most ``plan.concurrency`` requests at a time (1 by default, so
  neither batches): the wall time is that of the slower side, not the sum. With one server and
  the per-request switch, the two sides share that bound (they share the server).
- **Resumable.** Every reply is appended to ``OUT/progress.jsonl`` as it arrives (the header
  holds the plan, the URLs and the model); ``resume=True`` reads the replies back and sends
  only the missing requests. A different plan or server is refused.
- **Timed.** ``pace`` records where the time goes, prints the time left, and
  warns when one side is much slower per request than the other.
"""

from __future__ import annotations

import asyncio
import math
import statistics
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from specdec.certify.common import FAIL, PASS, WARN
from specdec.certify.progress import ProgressLog, revive
from specdec.endpoint.capacity import ensure_open_files
from specdec.endpoint.client import EndpointClient, Reply, Request
from specdec.endpoint.counters import SpecCounters, has_known_series, metrics_counters
from specdec.endpoint.errors import BadReply, EndpointError
from specdec.endpoint.pairing import (
    TWO_SERVERS,
    Sides,
    check_off_reply,
    open_clients,
    probe_switch,
)

from .certificate import EndpointCertificate
from .greedy import GreedyCase, compare_greedy
from .pace import Pace
from .pertoken import (
    TOKEN_IDS,
    EndpointPerTokenResult,
    pertoken_test,
    pit_of_completion,
    probe_pertoken,
    scoring_request,
)
from .plan import EndpointCertifyPlan
from .sampled import STATISTICS, joint_holm, sampled_tests
from .seeds import EndpointSeedPlan

PROGRESS_FILE = "progress.jsonl"
PILOT = 4  # requests per side that time the sampled part under a budget (not tested)
ANALYSIS_S = 15.0  # what the budget keeps for the power simulations
BUDGET_KEY = "budget:samples"
SIDES = ("on", "off")


# -- replies as stored in the progress file ----------------------------------------------------


def reply_to_json(r: Reply) -> dict[str, Any]:
    return {
        "text": r.text,
        "finish_reason": r.finish_reason,
        "e2e_s": r.e2e_s,
        "n_tokens": r.n_tokens,
        "counters": asdict(r.counters) if r.counters else None,
        "tokens": list(r.tokens) if r.tokens is not None else None,
        "top_logprobs": [dict(x) for x in r.top_logprobs] if r.top_logprobs else None,
        "token_ids": list(r.token_ids) if r.token_ids is not None else None,
        "attempts": r.attempts,
    }


def _check(d: dict[str, Any], name: str, *kinds: type) -> Any:
    value = d.get(name)
    ok = value is None or (isinstance(value, kinds) and not isinstance(value, bool))
    if not ok or (value is None and name == "text"):
        raise TypeError(f"{name} holds {type(value).__name__}")
    return value


def _listed(value: Any, kind: type, name: str) -> tuple[Any, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(
        isinstance(x, kind) and not isinstance(x, bool) for x in value
    ):
        raise TypeError(f"{name} is not a list of {kind.__name__}")
    return tuple(value)


def reply_from_json(d: dict[str, Any]) -> Reply:
    """A reply stored by ``reply_to_json``, its fields' types checked (a TypeError names
    the first that is wrong: ``ProgressLog.read`` turns it into one line)."""
    if not isinstance(d, dict):
        raise TypeError(f"a reply is stored as {type(d).__name__}")
    c = _check(d, "counters", dict)
    tops = _listed(d.get("top_logprobs"), dict, "top_logprobs")
    for row in tops or ():
        if not all(isinstance(v, int | float) for v in row.values()):
            raise TypeError("top_logprobs holds a row that is not token -> number")
    return Reply(
        text=_check(d, "text", str),
        finish_reason=_check(d, "finish_reason", str),
        e2e_s=float(_check(d, "e2e_s", int, float) or 0.0),
        ttft_s=None,
        n_tokens=_check(d, "n_tokens", int),
        tokens_source="progress",
        n_chunks=0,
        counters=revive(SpecCounters, c) if c else None,
        tokens=_listed(d.get("tokens"), str, "tokens"),
        top_logprobs=tops or None,
        attempts=int(_check(d, "attempts", int) or 1),
        token_ids=_listed(d.get("token_ids"), int, "token_ids"),
    )


def _budget_of(d: dict[str, Any]) -> tuple[int, float]:
    """The stored choice of a budgeted run: (samples per prompt and side, s per pair)."""
    n, t = d["samples"], d["item_s"]
    if not (isinstance(n, int) and n >= 2 and isinstance(t, int | float) and math.isfinite(t)):
        raise ValueError(f"samples {n!r}, item_s {t!r}")
    return n, float(t)


def _score_of(d: dict[str, Any]) -> tuple[list[float], int]:
    """A stored scoring: (PIT values, nan for None; tokens in the top N)."""
    u, n_in = d["u"], d["in_top"]
    if not isinstance(u, list) or not all(x is None or isinstance(x, int | float) for x in u):
        raise TypeError("u is not a list of numbers")
    if not (isinstance(n_in, int) and 0 <= n_in <= len(u)):
        raise ValueError(f"in_top {n_in!r}")
    return [math.nan if x is None else float(x) for x in u], n_in


class Gates:
    """How many requests may be in flight per server."""

    def __init__(self, sides: Sides, concurrency: int) -> None:
        self.parallel = sides.switch == TWO_SERVERS
        on = asyncio.Semaphore(concurrency)
        self._gate = {"on": on, "off": asyncio.Semaphore(concurrency) if self.parallel else on}

    def __getitem__(self, side: str) -> asyncio.Semaphore:
        return self._gate[side]


async def _all(coros: Sequence[Coroutine[Any, Any, Any]]) -> list[Any]:
    """Run the coroutines concurrently; on the first error cancel the rest and re-raise."""
    tasks = [asyncio.create_task(c) for c in coros]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


class _Run:
    """One certify run's state: clients, gates, progress file, pace, counters."""

    def __init__(
        self,
        plan: EndpointCertifyPlan,
        sides: Sides,
        on: EndpointClient,
        off: EndpointClient,
        store: ProgressLog,
        pace: Pace,
        seeds: EndpointSeedPlan,
    ) -> None:
        self.plan, self.sides, self.on, self.off = plan, sides, on, off
        self.seeds = seeds
        self.store, self.pace = store, pace
        self.gates = Gates(sides, plan.concurrency)
        self.drafted: list[int] = []
        self.accepted: list[int] = []
        self.in_top = 0  # scored tokens among the spec-off row's top N

    def client(self, side: str) -> EndpointClient:
        return self.on if side == "on" else self.off

    async def reply(self, key: str, side: str, req: Request, *, timed: bool = False) -> Reply:
        """The reply stored under ``key``, or the request sent now (and stored)."""
        stored = self.store.read(key, reply_from_json)
        if stored is not None:
            self.pace.reused += 1
            r = stored
        else:
            async with self.gates[side]:
                r = await self.client(side).generate(req)
            self.store.put(key, reply_to_json(r))
            if timed:
                self.pace.request(side, r.e2e_s, r.attempts)
        if side == "off":
            check_off_reply(r, self.sides)
        elif r.counters is not None:
            self.drafted.append(r.counters.drafted)
            self.accepted.append(r.counters.accepted)
        return r

    # -- greedy ------------------------------------------------------------------------------
    async def greedy(self, logprobs: bool) -> list[GreedyCase]:
        plan = self.plan
        out = []
        for i, prompt in enumerate(plan.greedy_texts()):
            req = Request(
                prompt,
                plan.greedy_tokens,
                temperature=0.0,
                seed=self.seeds.greedy_seed(i),
                logprobs=plan.top_logprobs if logprobs else None,
                stream=False,
                extra=plan.prediction_body(i),
                label=f"greedy prompt {i + 1}",
            )
            pair = [self.reply(f"greedy:{i}:{side}", side, req) for side in ("on", "off")]
            if self.gates.parallel:
                r_on, r_off = await _all(pair)
            else:
                r_on, r_off = await pair[0], await pair[1]
            case = compare_greedy(prompt, r_on, r_off, plan.tie_gap)
            j = case.token_index
            if case.status == "differs" and j is not None and None in (case.gap_on, case.gap_off):
                label = f"follow-up row of greedy prompt {i + 1} at token {j}"
                rows = (
                    await self.row_at("on", prompt, r_on, j, label)
                    if case.gap_on is None
                    else None,
                    await self.row_at("off", prompt, r_off, j, label)
                    if case.gap_off is None
                    else None,
                )
                case = compare_greedy(prompt, r_on, r_off, plan.tie_gap, follow_up=rows)
            out.append(case)
        return out

    async def row_at(
        self, side: str, prompt: str, reply: Reply, j: int, label: str
    ) -> Mapping[str, float] | None:
        """The side's top-20 row at token j of its reply, by a second request: the prompt's
        and the reply's first j token ids as the prompt, one token at temperature 0. For a
        server that returns no row for some tokens (llama-server: drafted tokens)."""
        if reply.token_ids is None or len(reply.token_ids) < j:
            return None
        if self.sides.on.api != "completions":
            return None
        client = self.client(side)
        ids = await client.tokenize(prompt)
        if not ids:
            return None
        prompt_ids = tuple(ids) + reply.token_ids[:j]
        req = Request(prompt_ids, 1, seed=0, logprobs=20, stream=False, label=label)
        try:
            async with self.gates[side]:
                r = await client.generate(req)
        except BadReply:
            raise
        except EndpointError:  # refused: the divergence stays without that row (a FAIL)
            return None
        return r.top_logprobs[0] if r.top_logprobs else None

    # -- the time budget ---------------------------------------------------------------------
    async def fit_budget(
        self, prompt_ids: list[list[int]] | None, elapsed: float
    ) -> tuple[int, str | None]:
        """The sample count per prompt and side that fits the plan's time budget (read back
        from the progress file when resuming), and a note when it is below the plan's."""
        plan = self.plan
        assert plan.max_seconds is not None
        stored = self.store.read(BUDGET_KEY, _budget_of)
        if stored is not None:
            n, t_item = stored
        else:
            t_item = await self._pilot(prompt_ids)
            left = plan.max_seconds - elapsed - t_item * PILOT - ANALYSIS_S
            fit = math.floor(0.9 * left / (plan.sampled_prompts * t_item)) if t_item > 0 else 0
            floor = min(plan.samples, plan.min_samples)
            n = max(floor, min(plan.samples, fit))
            self.store.put(BUDGET_KEY, {"samples": n, "item_s": t_item})
        if n >= plan.samples:
            return n, None
        return n, (
            f"the time budget ({plan.max_seconds:.0f} s) fits {n} of {plan.samples} sampled "
            f"requests per prompt and side (a pilot measured {t_item:.2f} s per request pair)"
            + (
                "; that is the minimum: if it does not fit, the run stops at the budget"
                if n == plan.min_samples
                else ""
            )
        )

    def _sampled_request(self, i: int, seed: int, *, with_ids: bool, label: str) -> Request:
        """One request of the sampled part (and of its pilot) on the i-th sampled prompt: the
        plan's sampling settings and the prompt's prediction; with token ids and the sampled
        token's logprob where the per-token test runs."""
        plan = self.plan
        text = plan.sampled_texts()[i]
        return Request(
            text,
            plan.sample_tokens,
            temperature=plan.temperature,
            seed=seed,
            top_p=plan.top_p,
            top_k=plan.top_k,
            logprobs=1 if with_ids else None,
            stream=False,
            extra={**(TOKEN_IDS if with_ids else {}), **plan.prediction_body(i)},
            label=label,
        )

    async def _pilot(self, prompt_ids: list[list[int]] | None) -> float:
        """Seconds per request pair of the sampled part (both servers at once where they
        work at once), from PILOT requests per side on the first sampled prompt with seeds
        that the tests never use."""
        plan = self.plan
        times: dict[str, list[float]] = {"on": [], "off": [], "score": []}

        async def one(side: str, seed: int) -> None:
            req = self._sampled_request(
                0, seed, with_ids=prompt_ids is not None, label="pilot of the sampled part"
            )
            async with self.gates[side]:
                r = await self.client(side).generate(req)
            times[side].append(r.e2e_s)
            if side == "on" and prompt_ids is not None and r.token_ids:
                sreq = scoring_request(
                    prompt_ids[0], r.token_ids, plan.pertoken_top, label="pilot scoring"
                )
                async with self.gates["off"]:
                    s = await self.off.generate(sreq)
                times["score"].append(s.e2e_s)

        seeds = self.seeds.pilot_seeds(2 * PILOT)
        jobs = [one(side, seeds[2 * j + i]) for j in range(PILOT) for i, side in enumerate(SIDES)]
        await _all(jobs)

        def med(xs: list[float]) -> float:
            return statistics.median(xs) if xs else 0.0

        on, off, score = med(times["on"]), med(times["off"]), med(times["score"])
        per = max(on, off + score) if self.gates.parallel else on + off + score
        return per / plan.concurrency

    # -- sampled -----------------------------------------------------------------------------
    async def sampled(
        self, prompt_ids: list[list[int]] | None
    ) -> tuple[list[list[str]], list[list[str]], list[float], int, int]:
        """(texts on [prompt][sample], texts off, PIT values, completions scored, tokens in
        the top N); the PIT part only when ``prompt_ids`` (one list per sampled prompt)."""
        plan = self.plan
        texts = plan.sampled_texts()
        total = len(texts) * plan.samples * (3 if prompt_ids is not None else 2)
        started = time.monotonic()
        done = [0]
        pits: dict[tuple[int, int], list[float]] = {}

        def tick() -> None:
            done[0] += 1
            self.pace.progress("sampled", done[0], total, started)

        async def one(i: int, k: int, side: str, seed: int) -> str:
            label = f"sampled prompt {i + 1}, request {k + 1}"
            req = self._sampled_request(i, seed, with_ids=prompt_ids is not None, label=label)
            r = await self.reply(f"sampled:{i}:{side}:{k}", side, req, timed=True)
            tick()
            if side == "on" and prompt_ids is not None:
                pits[(i, k)] = await self.score(i, k, prompt_ids[i], r)
                tick()
            return r.text

        results_on: list[list[str]] = []
        results_off: list[list[str]] = []
        for i in range(len(texts)):
            self.pace.log(f"sampled prompt {i + 1}/{len(texts)}: {plan.samples} requests per side")
            seeds_on, seeds_off = self.seeds.request_seeds(i, plan.samples)
            coros = []
            for k, (s_on, s_off) in enumerate(zip(seeds_on, seeds_off, strict=True)):
                coros += [one(i, k, "on", s_on), one(i, k, "off", s_off)]  # interleaved
            got = await _all(coros)
            results_on.append(got[0::2])
            results_off.append(got[1::2])
        u: list[float] = []
        for key in sorted(pits):
            u.extend(pits[key])
        return results_on, results_off, u, len(pits), self.in_top

    async def score(self, i: int, k: int, prompt_ids: list[int], r: Reply) -> list[float]:
        """The PIT values of spec-on sample (i, k) against the spec-off server's rows."""
        key = f"score:{i}:{k}"
        done = self.store.read(key, _score_of)
        if done is not None:
            self.pace.reused += 1
            self.in_top += done[1]
            return done[0]
        ids = r.token_ids
        if ids is None:
            raise EndpointError(f"{self.on.config.url} returned a sample without token ids")
        if not ids:
            self.store.put(key, {"u": [], "in_top": 0})
            return []
        label = f"scoring of sampled prompt {i + 1}, request {k + 1}"
        req = scoring_request(prompt_ids, ids, self.plan.pertoken_top, label=label)
        async with self.gates["off"]:
            s = await self.off.generate(req)
        self.pace.request("score", s.e2e_s, s.attempts)
        rows = s.prompt_logprobs
        if rows is None or len(rows) != len(prompt_ids) + len(ids):
            raise EndpointError(
                f"{self.off.config.url} returned {len(rows) if rows else 'no'} prompt_logprobs "
                f"rows for a prompt of {len(prompt_ids) + len(ids)} tokens"
            )
        tail = rows[len(prompt_ids) :]
        v = self.seeds.pit_uniforms(i, k, self.plan.sample_tokens)  # [sample_tokens]
        u = pit_of_completion(tail, ids, v, self.plan.pertoken_top)
        top = self.plan.pertoken_top
        n_in = sum(1 for row, t in zip(tail, ids, strict=True) if row and 1 <= row[t][1] <= top)
        self.in_top += n_in
        self.store.put(key, {"u": [None if x != x else x for x in u], "in_top": n_in})
        return u


@dataclass
class _Collected:
    """What the requests of a run gave (``_collect``), before any analysis."""

    plan: EndpointCertifyPlan  # with the sample count the budget chose
    model: str
    run: _Run
    greedy: list[GreedyCase]
    prompt_ids: list[list[int]] | None
    pertoken_note: str | None
    texts_on: list[list[str]]
    texts_off: list[list[str]]
    u: list[float]
    n_scored: int
    in_top: int
    metrics_before: dict[str, float] | None
    metrics_after: dict[str, float] | None


def network_budget(plan: EndpointCertifyPlan) -> float | None:
    """Seconds the requests of a budgeted run may take, all of them together: the budget
    less what the analysis keeps (ANALYSIS_S), but at least half of it; None: no budget."""
    if plan.max_seconds is None:
        return None
    return max(plan.max_seconds / 2, plan.max_seconds - ANALYSIS_S)


def budget_spent(plan: EndpointCertifyPlan, pace: Pace, path: Path | None) -> str:
    """The one line of a run whose requests ran out of the time budget."""
    assert plan.max_seconds is not None
    n = sum(len(v) for v in pace.request_s.values())
    slowest = max((max(v) for v in pace.request_s.values() if v), default=None)
    where = f" in the {pace.current} part" if pace.current else ""
    again = f"; --resume continues from {path}" if path is not None and path.exists() else ""
    return (
        f"the time budget of {plan.max_seconds / 60:g} min (--max-minutes) ran out{where} after "
        f"{n} timed replies"
        + (f" (the slowest {slowest:.1f} s)" if slowest is not None else "")
        + ": the servers were too slow for it or stalled; give more --max-minutes (0: none)"
        + again
    )


async def _collect(
    plan: EndpointCertifyPlan,
    sides: Sides,
    on: EndpointClient,
    off: EndpointClient,
    pace: Pace,
    notes: list[str],
    progress: Callable[[str], None],
    path: Path | None,
    resume: bool,
    seeds: EndpointSeedPlan,
) -> _Collected:
    """Every request of the run: setup and probes, greedy, pilot, sampled (and scoring)."""
    with pace.phase("setup"):
        model = await on.resolve_model()
        model_off = await off.resolve_model()
        if resume and (path is None or not path.exists()):
            raise EndpointError(f"cannot resume: {path or 'no output directory'} not found")
        store = ProgressLog(
            path,
            {
                "plan": asdict(plan),
                "on": sides.on.url,
                "off": sides.off.url,
                "switch": sides.switch,
                "api": sides.on.api,
                "model": model,
                "model_off": model_off,
            },
            resume=resume,
        )
        if store.done:
            progress(f"resuming: {len(store.done)} replies read back from {path}")
        check = await probe_switch(on, off, sides.switch)
        notes.extend(check.notes)
        metrics_before = await on.scrape_metrics()
    run = _Run(plan, sides, on, off, store, pace, seeds)

    greedy: list[GreedyCase] = []
    if plan.greedy_prompts:
        with pace.phase("greedy"):
            logprobs = await _logprobs_supported(on, off, plan.top_logprobs)
            if not logprobs:
                notes.append(
                    "the server returns no logprobs: greedy divergences cannot be checked for "
                    "near-ties"
                )
            progress(f"greedy agreement on {plan.greedy_prompts} prompts")
            greedy = await run.greedy(logprobs)

    prompt_ids: list[list[int]] | None = None
    pertoken_note: str | None = None
    texts_on: list[list[str]] = []
    texts_off: list[list[str]] = []
    u: list[float] = []
    n_scored = in_top = 0
    if plan.sampled_prompts:
        with pace.phase("pertoken probe"):
            prompt_ids, pertoken_note = await _pertoken_setup(plan, on, off)
        if plan.max_seconds is not None:
            with pace.phase("pilot"):
                n, note = await run.fit_budget(prompt_ids, pace.elapsed())
            if note:
                notes.append(note)
                progress(note)
            plan = run.plan = replace(plan, samples=n)
        with pace.phase("sampled"):
            texts_on, texts_off, u, n_scored, in_top = await run.sampled(prompt_ids)
    metrics_after = await on.scrape_metrics()
    return _Collected(
        plan,
        model,
        run,
        greedy,
        prompt_ids,
        pertoken_note,
        texts_on,
        texts_off,
        u,
        n_scored,
        in_top,
        metrics_before,
        metrics_after,
    )


async def run_endpoint_certify(
    plan: EndpointCertifyPlan,
    sides: Sides,
    *,
    command: str = "",
    progress: Callable[[str], None] = lambda _: None,
    out_dir: str | Path | None = None,
    resume: bool = False,
) -> EndpointCertificate:
    """Run the plan against the two sides. With ``out_dir``, replies go to its progress file
    as they arrive, and ``resume`` continues from it. With a time budget, the requests stop
    when it runs out (``network_budget``), whatever the servers do: one EndpointError line."""
    pace = Pace(log=progress)
    notes: list[str] = []
    connections = plan.concurrency + 1  # + a follow-up row or /tokenize outside the gates
    ensure_open_files(2 * connections, f"--concurrency {plan.concurrency}")
    seeds = EndpointSeedPlan(plan.seed)
    on, off = open_clients(sides, seeds.client_rng(), connections=connections)
    path = Path(out_dir) / PROGRESS_FILE if out_dir is not None else None
    try:
        async with asyncio.timeout(network_budget(plan)), on, off:  # None: no deadline
            got = await _collect(plan, sides, on, off, pace, notes, progress, path, resume, seeds)
    except TimeoutError as e:
        raise EndpointError(budget_spent(plan, pace, path)) from e
    plan, prompt_ids = got.plan, got.prompt_ids

    with pace.phase("analysis"):
        family = len(STATISTICS) + (prompt_ids is not None)
        rng = seeds.sampled_power_rng()
        tests = (
            sampled_tests(got.texts_on, got.texts_off, plan, rng, family=family)
            if plan.sampled_prompts
            else []
        )
        pertoken: EndpointPerTokenResult | None = None
        if prompt_ids is not None:
            u = got.u
            pertoken = pertoken_test(
                u,
                n_completions=got.n_scored,
                top=plan.pertoken_top,
                in_top=got.in_top / len(u) if u else float("nan"),
                level=plan.alpha / family,
                power=plan.power,
                trials=plan.power_trials,
                rng=seeds.pertoken_power_rng(),
            )
        tests, pertoken = joint_holm(tests, pertoken, plan.alpha)

    drafted, accepted = got.run.drafted, got.run.accepted
    before, after = got.metrics_before, got.metrics_after
    scraped = (
        metrics_counters(before, after)
        if before is not None and after and has_known_series(after)
        else None
    )
    if not drafted and scraped is not None:
        drafted, accepted = [scraped.drafted], [scraped.accepted]
        notes.append("draft counters: the spec-on server's /metrics before and after the run")
    if pace.slow_note:
        notes.append(pace.slow_note)
    greedy = got.greedy
    status = PASS
    if any(c.status == "near-tie" for c in greedy):
        status = WARN
    if drafted and sum(drafted) == 0:
        notes.append(
            "the spec-on side drafted nothing in any request: this run shows nothing "
            "about speculation"
        )
        status = WARN if status == PASS else status
    if not drafted:
        notes.append(
            "the spec-on side reports no draft counters: that it speculated at all is not checked"
        )
    failed = any(c.status == "differs" for c in greedy) or any(t.rejected for t in tests)
    if failed or (pertoken is not None and pertoken.rejected):
        status = FAIL
    timing = pace.to_dict()
    return EndpointCertificate(
        status=status,
        sides=sides.describe(),
        model=got.model,
        api=sides.on.api,
        plan={k: v for k, v in asdict(plan).items() if k not in ("prompts", "predictions")}
        | {"n_prompts": len(plan.prompts)}
        | (
            {"n_predictions": sum(p is not None for p in plan.predictions)}
            if plan.predictions is not None
            else {}
        ),
        greedy=greedy,
        tests=tests,
        drafted_on=sum(drafted) if drafted else None,
        accepted_on=sum(accepted) if drafted else None,
        notes=notes,
        seconds=float(timing["total_s"]),
        command=command,
        pertoken=pertoken,
        pertoken_note=got.pertoken_note,
        timing=timing,
    )


async def _pertoken_setup(
    plan: EndpointCertifyPlan, on: EndpointClient, off: EndpointClient
) -> tuple[list[list[int]] | None, str | None]:
    """The sampled prompts' token ids when the per-token test can run, else (None, why)."""
    if not plan.pertoken:
        return None, "turned off"
    if not plan.pertoken_sampling:
        return None, "the sampling is not temperature 1 without top-p / top-k"
    why = await probe_pertoken(on, off, plan.pertoken_top)
    if why is not None:
        return None, why
    ids = []
    for text in plan.sampled_texts():
        got = await off.tokenize(text)
        if not got:
            return None, f"{off.config.url}/tokenize gave no ids for a sampled prompt"
        ids.append(got)
    return ids, None


async def _logprobs_supported(on: EndpointClient, off: EndpointClient, n: int) -> bool:
    """Whether both sides answer a request that asks for top logprobs with logprobs."""
    req = Request("Hello", 2, seed=0, logprobs=n, stream=False, label="logprobs probe")
    for client in (on, off):
        try:
            reply = await client.generate(req)
        except BadReply:
            raise
        except EndpointError as e:
            if "logprob" in str(e).lower():
                return False
            raise
        if reply.tokens is None:
            return False
    return True
