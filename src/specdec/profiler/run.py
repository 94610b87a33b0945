"""``specdec profile``: measure every way to run the target here, predict, check, recommend.

1. For each target backend: the verify curve, prefill throughput and loop overhead.
2. The target's greedy continuation of each probe prompt (once, on the first backend).
3. For each drafter: its costs (a draft model's step and prefill; a lookup's per-round cost)
   and its greedy acceptance probe on those continuations.
4. Predictions for plain decoding on each backend and for every drafter x backend x K.
5. A ranking by predicted end-to-end time for the request size, with the fastest plain
   decoder as the baseline, and short real runs of the top few to check the predictions;
   the recommendation is the fastest *measured* of the checked configurations.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from specdec.core.drafter import Drafter
from specdec.core.loop import generate
from specdec.core.model import CausalLM, extend_last
from specdec.core.vocab import check_same_vocabulary
from specdec.drafters.planned import PlannedSuffixDrafter
from specdec.drafters.suffix import SuffixDrafter
from specdec.errors import ConfigError, SpecdecError
from specdec.models.llamacpp import exact_attention
from specdec.models.loader import ModelConfig, load_model
from specdec.pairs import (
    DEFAULT_DRAFT,
    DEFAULT_TARGET,
    PLANNED_K,
    is_model_free,
    is_planned,
    parse_drafter,
    release,
)
from specdec.profiler import cache
from specdec.profiler.decide import (
    DEFAULT_MARGIN,
    FALLBACK_MARGIN,
    Candidate,
    Recommendation,
    Scored,
    rank,
)
from specdec.profiler.exact_price import ExactPrice, measure_exact_price
from specdec.profiler.measure import (
    calibrated,
    ceiling_passes,
    curve_from_ratios,
    curve_ratios,
    greedy_run,
    model_draft_probe,
    model_free_probe,
    prefill_throughput,
    round_walk_probe,
    target_costs,
    with_curve_shape,
    with_model_draft,
    with_model_free_draft,
    with_prefill_from,
)
from specdec.profiler.predict import Prediction, ProbeSequence, pass_ceiling_tps, predict
from specdec.prompting import encode_prompt
from specdec.theory import Costs, costs_from_dict
from specdec.util import cpuload
from specdec.util.bounds import check_n_ctx, check_threads
from specdec.util.printable import printable

Log = Callable[[str], None]

# the fewest prompt tokens the probe must prefill for its own prefill time to give the
# throughput (below it, e.g. one-token prompts, a dedicated 256-token pass does)
MIN_TIMED_PREFILL = 32


@dataclass(frozen=True)
class ProfileSpec:
    """What to profile."""

    target: str = DEFAULT_TARGET
    target_backends: tuple[str, ...] = ("llamacpp", "hf")
    drafts: tuple[str, ...] = (DEFAULT_DRAFT, "ngram", "suffix", "planned")
    draft_backend: str = "llamacpp"
    n_new: int = 32  # tokens per probe continuation
    k_model: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 8)
    k_free: tuple[int, ...] = (1, 2, 3, 4, 6, 8, 12, 16)
    check_top: int = 2  # real runs of the top predicted configurations (+ plain, + planned)
    chat: bool = True
    n_ctx: int = 4096
    n_threads: int | None = None
    dtype: str = "auto"
    device: str = "auto"

    def __post_init__(self) -> None:
        if not self.target_backends:
            raise ConfigError("profile needs at least one target backend")
        if self.n_new < 2:
            raise ConfigError(f"the probe needs at least 2 new tokens, got {self.n_new}")
        if any(k < 1 for k in (*self.k_model, *self.k_free)):
            raise ConfigError("profiled K values must be >= 1")
        if self.check_top < 0:
            raise ConfigError(f"--check-top must be >= 0, got {self.check_top}")
        check_threads(self.n_threads)
        check_n_ctx(self.n_ctx)

    def settings(self) -> dict[str, Any]:
        """Everything besides the models and prompts that the numbers depend on."""
        d = asdict(self)
        del d["target"], d["drafts"], d["check_top"]
        # the price of exact numerics measured here depends on their attention (the build's)
        d["exact_kv"] = exact_attention().key()
        return d

    def model_config(self, model: str, backend: str) -> ModelConfig:
        return ModelConfig(model, backend, self.device, self.dtype, self.n_ctx, self.n_threads)


@dataclass
class Check:
    """A short real run of one configuration, against its prediction."""

    config: str
    k: int
    predicted_tps: float
    measured_tps: float
    predicted_e2e_s: float
    measured_e2e_s: float

    @property
    def error(self) -> float:
        """(predicted - measured) / measured decode speed."""
        return self.predicted_tps / self.measured_tps - 1.0 if self.measured_tps > 0 else math.nan


@dataclass
class ProfileResult:
    key: str
    spec: dict[str, Any]
    prompt_tokens: list[int]
    costs: dict[str, dict[str, Any]]  # candidate label -> Costs fields
    predictions: list[dict[str, Any]]
    checks: list[dict[str, Any]] = field(default_factory=list)
    recommendation: dict[str, Any] = field(default_factory=dict)
    probe_accept: dict[str, list[float]] = field(default_factory=dict)  # drafter -> by position
    draft_refs: dict[str, str] = field(default_factory=dict)  # drafter name -> reference
    skipped_backends: dict[str, str] = field(default_factory=dict)  # backend -> why
    seconds: float = 0.0
    exact: dict[str, Any] = field(default_factory=dict)  # ExactPrice (llama.cpp targets)
    build: dict[str, Any] = field(default_factory=dict)  # the llama.cpp target's build, kernels

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_dict(d: dict[str, Any]) -> ProfileResult:
        """A profile from its JSON, read as the decisions read it (every candidate's costs,
        the recommendation, a ranking for a long prompt); ValueError naming what is wrong
        with an entry of another shape (a damaged cache entry is profiled again)."""
        if not isinstance(d, dict):
            raise ValueError("not a JSON object")
        keys = ProfileResult.__dataclass_fields__
        try:
            result = ProfileResult(**{k: v for k, v in d.items() if k in keys})
            result._check()
        except ValueError:
            raise
        except (TypeError, KeyError, AttributeError, IndexError, ArithmeticError) as e:
            raise ValueError(f"{type(e).__name__}: {e}") from e
        return result

    def _check(self) -> None:
        shapes = {
            "spec": dict,
            "prompt_tokens": list,
            "costs": dict,
            "predictions": list,
            "checks": list,
            "recommendation": dict,
            "probe_accept": dict,
            "draft_refs": dict,
            "skipped_backends": dict,
            "exact": dict,
            "build": dict,
        }
        for name, kind in shapes.items():
            if not isinstance(getattr(self, name), kind):
                raise ValueError(f"{name} is not a JSON {kind.__name__}")
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in self.prompt_tokens):
            raise ValueError("prompt_tokens are not integers")
        if not all(isinstance(v, str) for v in self.draft_refs.values()):
            raise ValueError("draft_refs are not strings")
        for name, accept in self.probe_accept.items():
            if not isinstance(accept, list) or not all(
                isinstance(a, int | float) and not isinstance(a, bool) and 0 <= a <= 1
                for a in accept
            ):
                raise ValueError(f"probe_accept[{name!r}] is not a list of rates")
        for cand, _ in self.candidates():
            self.costs_for(cand)
        rec = self.recommendation
        cand = Candidate(**rec["candidate"])
        self.costs_for(cand)
        if isinstance(rec["k"], bool) or not isinstance(rec["k"], int) or rec["k"] < 0:
            raise ValueError("the recommended K is not an integer >= 0")
        str(rec["reason"])
        if not isinstance(rec.get("exact", False), bool):
            raise ValueError("the recommendation's exact is not true or false")
        if self.exact:  # the price of exact numerics, read by profile's and demo's lines
            ExactPrice.from_dict(self.exact)
        self.rank_for(max(1, 8 * len(self.prompt_tokens)) * 4096, 128)  # a long prompt

    def candidates(self) -> list[tuple[Candidate, Prediction]]:
        out = []
        for p in self.predictions:
            cand = Candidate(**p["candidate"])
            pred = Prediction(**{k: v for k, v in p["prediction"].items()})
            out.append((cand, pred))
        return out

    def costs_for(self, cand: Candidate) -> Costs:
        return costs_from_dict(self.costs[cand.label])

    def rank_for(self, prompt_tokens: int, new_tokens: int) -> Recommendation:
        """The decision for one request size (prompt and output lengths)."""
        per_backend = {
            c.target_backend: self.costs_for(c) for c, _ in self.candidates() if c.drafter == "none"
        }
        return rank(
            self.candidates(),
            prompt_tokens=prompt_tokens,
            new_tokens=new_tokens,
            costs=per_backend,
        )


def _probe_accept(seqs: Sequence[ProbeSequence], k: int) -> list[float]:
    """Acceptance by draft position (conditional, as the bench reports it) at K = k."""
    from specdec.profiler.predict import simulate

    reached, accepted = [0] * k, [0] * k
    for seq in seqs:
        plan = simulate(seq, k)
        for d, a in zip(plan.drafted, plan.kept, strict=True):
            for i in range(min(d, a + 1)):
                reached[i] += 1
                accepted[i] += int(i < a)
    return [a / r if r else 0.0 for a, r in zip(accepted, reached, strict=True)]


def profile_cache_key(spec: ProfileSpec, prompts: Sequence[str]) -> str:
    return cache.profile_key(
        target=spec.target, drafts=spec.drafts, settings=spec.settings(), prompts=list(prompts)
    )


def cached_profile(
    spec: ProfileSpec, prompts: Sequence[str], log: Log = lambda _: None
) -> ProfileResult | None:
    """The cached profile for ``spec`` and ``prompts``, or None (nothing is measured; a
    damaged entry is None too, and ``log`` hears one line about it)."""
    key = profile_cache_key(spec, prompts)
    return _read_profile(key, cache.load_cached(key, log=log), log)


def _read_profile(key: str, hit: dict[str, Any] | None, log: Log) -> ProfileResult | None:
    if hit is None:
        return None
    try:
        return ProfileResult.from_dict(hit)
    except ValueError as e:
        where = cache.profile_dir() / f"{key}.json"
        log(f"ignoring the damaged profile {where} ({printable(e, 200)}): profiling again")
        return None


def run_profile(
    spec: ProfileSpec,
    prompts: Sequence[str],
    *,
    refresh: bool = False,
    log: Log = lambda _: None,
    loader: Callable[[ModelConfig], CausalLM] = load_model,
) -> ProfileResult:
    """Profile (or read the cached profile of) every candidate configuration."""
    if not prompts:
        raise ConfigError("profile needs at least one probe prompt")
    key = profile_cache_key(spec, prompts)
    if not refresh:
        hit = _read_profile(key, cache.load_cached(key, log=log), log)
        if hit is not None:
            log(f"profile: cached ({cache.profile_dir() / (key + '.json')})")
            return hit
    t0 = time.perf_counter()
    loaded: list[object] = []
    before = cpuload.sample()
    try:
        result = _measure(spec, prompts, key, log, loader, loaded)
    finally:
        release(*loaded)
    result.seconds = time.perf_counter() - t0
    share = cpuload.others_share(before, cpuload.sample())
    if cpuload.under_load(share):
        assert share is not None
        log(
            f"profile: measured in {result.seconds:.0f} s while other processes used "
            f"{share:.0%} of the CPUs: its figures are this run's, not cached"
        )
        return result
    try:
        path = cache.save(key, result.to_dict())
    except (OSError, SpecdecError) as e:  # the profile is this run's; said in one line
        log(f"profile: measured in {result.seconds:.0f} s; could not cache it: {printable(e)}")
        return result
    log(f"profile: measured in {result.seconds:.0f} s, saved to {path}")
    return result


def _measure(
    spec: ProfileSpec,
    prompts: Sequence[str],
    key: str,
    log: Log,
    loader: Callable[[ModelConfig], CausalLM],
    loaded: list[object],
) -> ProfileResult:
    targets: dict[str, CausalLM] = {}
    costs: dict[str, Costs] = {}
    skipped: dict[str, str] = {}
    n_pass = max((*spec.k_model, *spec.k_free, PLANNED_K)) + 1  # a round's largest pass
    for backend in spec.target_backends:
        log(f"profile: loading the target on {backend}")
        lm = loader(spec.model_config(spec.target, backend))
        loaded.append(lm)
        why = skip_reason(backend, ceiling_passes(lm, n_pass), costs) if costs else None
        if why is not None:
            log(f"profile: {backend}: {why}")
            skipped[backend] = why
            loaded.remove(lm)
            release(lm)
            continue
        targets[backend] = lm
        log(f"profile: measuring {backend} (verify curve, prefill, loop overhead)")
        # the first backend's prefill and verify curve are measured on the probe prompts
        # themselves, below: here a rough curve (one pass at each end) stands in until then
        costs[backend] = (
            target_costs(lm, n_max=n_pass)
            if costs
            else target_costs(lm, n_max=n_pass, prefill=False, repeats=1, ns=(1,))
        )
    first = targets[spec.target_backends[0]]  # never skipped: nothing was measured before it
    ids = [encode_prompt(first, p, chat=spec.chat and _has_chat(first)) for p in prompts]
    for i in ids:
        if len(i) + spec.n_new + max((*spec.k_model, *spec.k_free)) + 1 > spec.n_ctx:
            raise ConfigError(f"a probe prompt of {len(i)} tokens does not fit n_ctx {spec.n_ctx}")
    log(f"profile: greedy continuations of {len(ids)} prompts, and verify passes at their contexts")
    first_backend = spec.target_backends[0]
    n_curve = len(costs[first_backend].verify_s)
    runs: list[tuple[list[int], float, float]] = []
    ratios: dict[int, list[float]] = {}
    for p in ids:
        runs.append(greedy_run(first, p, spec.n_new, keep_cache=True))
        # verify passes at this run's own contexts, its cache truncated to them (no prefill)
        for n, r in curve_ratios(first, curve_samples([p], [runs[-1][0]]), n_max=n_curve).items():
            ratios.setdefault(n, []).extend(r)
    if first.n_cached:
        first.truncate(0)
    conts = [toks for toks, _, _ in runs]
    prefilled = [len(i) - 1 for i in ids]
    if sum(prefilled) >= MIN_TIMED_PREFILL:
        costs[first_backend] = with_prefill_from(
            costs[first_backend], prefilled, [p for _, _, p in runs]
        )
    else:  # probe prompts too short to time a prefill on: a dedicated pass
        costs[first_backend] = replace(costs[first_backend], prefill_tps=prefill_throughput(first))
    # the curve's shape from passes at the probe's own contexts (see ``curve_ratios``)
    shape = curve_from_ratios(ratios, n_curve)
    costs[first_backend] = with_curve_shape(costs[first_backend], shape)
    # the curve's level from the real decoding steps of these runs (see ``calibrated``)
    n_steps = sum(len(t) for t in conts)
    if n_steps:
        costs[first_backend] = calibrated(
            costs[first_backend], sum(d for _, d, _ in runs) / n_steps
        )

    entries: list[tuple[Candidate, Prediction]] = []
    labels: dict[str, Costs] = {}
    for backend, c in costs.items():
        cand = Candidate(backend, "none", False)
        plain = [
            ProbeSequence(len(p), len(t), run=(0,) * len(t))
            for p, t in zip(ids, conts, strict=True)
        ]
        entries.append((cand, predict(cand.label, c, plain, 0, model_draft=False)))
        labels[cand.label] = c

    # (drafter name, target backend) -> the drafter object run with that backend
    drafters: dict[tuple[str, str], CausalLM | Drafter] = {}
    refs: dict[str, str] = {"none": "none"}  # drafter name -> its reference
    probe_accept: dict[str, list[float]] = {}
    for ref in spec.drafts:
        if ref == "none":
            continue
        model_draft = not is_model_free(ref)
        # drafter name -> probe sequences, per backend (one shared entry when the drafter's
        # proposals do not depend on the backend)
        per_backend: dict[str, list[ProbeSequence]] = {}
        if model_draft:
            log(f"profile: loading draft {ref} on {spec.draft_backend}")
            dm = loader(spec.model_config(ref, spec.draft_backend))
            loaded.append(dm)
            check_same_vocabulary(dm, first)
            k_cap = max(spec.k_model)
            seqs = [
                model_draft_probe(dm, p, t, k_cap, first.vocab_size)
                for p, t in zip(ids, conts, strict=True)
            ]
            ks = spec.k_model
            name = _short(ref)
            for backend in costs:
                drafters[(name, backend)] = dm
                per_backend[backend] = seqs
        else:
            # the planned drafter sizes its own drafts (K only caps them) and learns from
            # its rounds, so it is probed round by round at its cap
            ks = (PLANNED_K,) if is_planned(ref) else spec.k_free
            k_cap = max(ks)
            name = ref
            shared: list[ProbeSequence] | None = None
            for backend, c in costs.items():
                drafter = _model_free(ref, c, first.eos_token_ids)
                drafters[(name, backend)] = drafter
                if is_planned(ref):
                    shared = [
                        round_walk_probe(drafter, p, t, k_cap)
                        for p, t in zip(ids, conts, strict=True)
                    ]
                elif shared is None:
                    shared = [
                        model_free_probe(drafter, p, t, k_cap)
                        for p, t in zip(ids, conts, strict=True)
                    ]
                per_backend[backend] = shared
        refs[name] = ref
        probe_accept[name] = _probe_accept(next(iter(per_backend.values())), max(ks))
        # a draft model's step and prefill do not depend on the target's backend: timed once
        drafted = with_model_draft(costs[first_backend], dm) if model_draft else None
        for backend, c in costs.items():
            obj = drafters[(name, backend)]
            dc = (
                replace(
                    c,
                    draft_token_s=drafted.draft_token_s,
                    draft_prefill_tps=drafted.draft_prefill_tps,
                )
                if drafted is not None
                else with_model_free_draft(c, obj, targets[backend])  # type: ignore[arg-type]
            )
            cand = Candidate(backend, name, model_draft)
            labels[cand.label] = dc
            seqs_b = per_backend[backend]
            for k in ks:
                entries.append((cand, predict(cand.label, dc, seqs_b, k, model_draft=model_draft)))

    result = ProfileResult(
        key=key,
        spec=asdict(spec),
        prompt_tokens=[len(i) for i in ids],
        costs={label: asdict(c) for label, c in labels.items()},
        predictions=[{"candidate": asdict(c), "prediction": asdict(p)} for c, p in entries],
        probe_accept=probe_accept,
        skipped_backends=skipped,
    )
    mean_prompt = round(sum(len(i) for i in ids) / len(ids))
    rec = result.rank_for(mean_prompt, spec.n_new)
    log("profile: checking the top predictions with real runs")
    checks = _check(rec, spec.check_top, targets, drafters, ids, spec.n_new)
    result.checks = [asdict(ch) | {"error": ch.error} for ch in checks]
    result.recommendation = _recommend(rec, checks)
    result.recommendation["draft_ref"] = refs[result.recommendation["candidate"]["drafter"]]
    result.draft_refs = refs
    path = getattr(targets.get("llamacpp"), "path", None)
    if path is not None:
        from specdec.models.llamacpp import build_summary

        result.build = build_summary(getattr(targets["llamacpp"], "kernels", None))
    if path is not None:  # exact numerics: their price here, and whether they are the default
        log("profile: measuring the price of exact numerics (worker processes)")
        price = measure_exact_price(str(path), spec.n_threads)
        log("profile: " + price.sentence())
        result.exact = price.to_dict()
        result.recommendation["exact"] = price.default and (
            result.recommendation["candidate"]["target_backend"] == "llamacpp"
        )
    return result


def curve_samples(
    ids: Sequence[Sequence[int]], conts: Sequence[Sequence[int]]
) -> list[tuple[list[int], list[int]]]:
    """Where ``curve_ratios`` times its passes: each probe prompt followed by two thirds and
    by a third of the target's continuation of it (contexts decoding verifies at; the longer
    first, so that a cache holding the run is only truncated), with the rest of the
    continuation as the rows."""
    out = []
    for p, t in zip(ids, conts, strict=True):
        for m in sorted({len(t) // 3, 2 * len(t) // 3}, reverse=True):
            out.append(([*p, *t[:m]], list(t[m:])))
    return out


def skip_reason(
    backend: str, points: Sequence[tuple[int, float]], costs: dict[str, Costs]
) -> str | None:
    """Why profiling ``backend`` further cannot change the ranking (None when it can): with
    its passes timed at ``points`` [(rows, seconds)] up to a round's largest, even free drafts
    that are all accepted yield fewer tokens per second (``pass_ceiling_tps``) than plain
    decoding on a backend in ``costs`` (measured already). Saves minutes where one backend
    is many times slower (transformers in fp32 next to llama.cpp on a CPU)."""
    best = min(costs, key=lambda b: costs[b].step_s)
    plain_tps = 1.0 / costs[best].step_s
    ceiling = pass_ceiling_tps(points)
    if ceiling >= plain_tps:
        return None
    shown = ", ".join(f"{n}: {s:.2f} s" for n, s in points)
    return (
        f"not profiled further: even with free drafts that are all accepted, verification "
        f"on {backend} reaches at most {ceiling:.1f} tok/s (passes by rows, {shown}), below "
        f"plain decoding on {best} ({plain_tps:.1f} tok/s)"
    )


def _model_free(ref: str, costs: Costs, ends: frozenset[int]) -> Drafter:
    """A model-free drafter; a planned one sized by this backend's costs; a suffix one
    drafting up to the target's end of generation (``ends``) at most."""
    drafter = parse_drafter(ref)
    assert drafter is not None
    if isinstance(drafter, SuffixDrafter):
        drafter.ends = ends
    if is_planned(ref):
        assert isinstance(drafter, SuffixDrafter)
        return PlannedSuffixDrafter(drafter, costs)
    return drafter


def _short(ref: str) -> str:
    return ref.rsplit("/", 1)[-1].removesuffix(".gguf")


def _has_chat(model: CausalLM) -> bool:
    return getattr(model.tokenizer, "apply_chat", None) is not None and bool(
        getattr(model.tokenizer, "chat_template", True)
    )


def _check(
    rec: Recommendation,
    top: int,
    targets: dict[str, CausalLM],
    drafters: dict[tuple[str, str], CausalLM | Drafter],
    ids: Sequence[Sequence[int]],
    n_new: int,
) -> list[Check]:
    chosen: list[Scored] = [rec.plain]
    for s in rec.ranked:
        if len(chosen) > top:
            break
        if s is not rec.plain:
            chosen.append(s)
    # the planned drafter on the fastest plain decoder's backend is the recommendation's
    # fallback candidate: always measured
    backend = rec.plain.candidate.target_backend
    chosen += [
        s
        for s in rec.ranked
        if is_planned(s.candidate.drafter)
        and s.candidate.target_backend == backend
        and s not in chosen
    ][:1]

    # Per backend and prompt the target prefills once (timed) and every checked configuration
    # then decodes from that cache (reuse_prefix), in an order rotated per prompt so slow drift
    # hits them alike: the prompt's prefill is the same work for all of them, so it is paid
    # once, and each configuration's end-to-end time is that prefill plus its own run (a
    # draft model's own prefill included).
    def draft_of(s: Scored) -> CausalLM | Drafter | None:
        if s.candidate.drafter == "none":
            return None
        return drafters[(s.candidate.drafter, s.candidate.target_backend)]

    totals = {id(s): [0, 0.0, 0.0] for s in chosen}  # tokens, decode s, end-to-end s
    for s in chosen:  # warm-up
        generate(targets[s.candidate.target_backend], draft_of(s), ids[0], max_new_tokens=4, k=s.k)
    for backend in dict.fromkeys(s.candidate.target_backend for s in chosen):
        target = targets[backend]
        mine = [s for s in chosen if s.candidate.target_backend == backend]
        for i, p in enumerate(ids):
            if target.n_cached:
                target.truncate(0)
            t0 = time.perf_counter()
            extend_last(target, p[:-1])
            prefill = time.perf_counter() - t0
            for s in mine[i % len(mine) :] + mine[: i % len(mine)]:
                res = generate(target, draft_of(s), p, max_new_tokens=n_new, k=s.k)
                t = totals[id(s)]
                t[0] += len(res.tokens)
                t[1] += res.t_total - res.t_prefill
                t[2] += prefill + res.t_total
        target.truncate(0)
    checks = []
    for s in chosen:
        tokens, decode, e2e = totals[id(s)]
        pred = s.prediction
        checks.append(
            Check(
                config=s.candidate.label,
                k=s.k,
                predicted_tps=pred.decode_tps,
                measured_tps=tokens / decode if decode > 0 else math.nan,
                predicted_e2e_s=pred.e2e_s,
                measured_e2e_s=e2e,
            )
        )
    return checks


def _recommend(rec: Recommendation, checks: Sequence[Check]) -> dict[str, Any]:
    """The recommendation from the measured checks, with its reason:

    1. the fastest checked speculative configuration that measured at least
       ``DEFAULT_MARGIN`` (1.05x) faster end to end than the fastest plain decoder;
    2. else the planned suffix drafter when it measured at least ``FALLBACK_MARGIN`` (0.97x)
       of the plain decoder: it cuts its drafts to what the measured verify cost pays for,
       so on text without repeats it runs as plain decoding and on repeated text (copies,
       edits, quoted documents, which the probe prompts may lack) it gains;
    3. else the plain decoder.
    """
    by_label = {(c.config, c.k): c for c in checks}
    plain_check = by_label.get((rec.plain.candidate.label, rec.plain.k))
    plain_e2e = plain_check.measured_e2e_s if plain_check else math.inf
    best: Scored = rec.plain
    best_e2e = plain_e2e
    fallback: tuple[Scored, float] | None = None
    for s in rec.ranked:
        ch = by_label.get((s.candidate.label, s.k))
        if ch is None or s is rec.plain:
            continue
        if ch.measured_e2e_s * DEFAULT_MARGIN <= plain_e2e and ch.measured_e2e_s < best_e2e:
            best, best_e2e = s, ch.measured_e2e_s
        if (
            is_planned(s.candidate.drafter)
            and ch.measured_e2e_s * FALLBACK_MARGIN <= plain_e2e
            and (fallback is None or ch.measured_e2e_s < fallback[1])
        ):
            fallback = (s, ch.measured_e2e_s)
    reason = rec.reason
    if best is rec.plain and fallback is not None:
        best, best_e2e = fallback
        reason = (
            f"{best.candidate.label}: measured {plain_e2e / best_e2e:.2f}x end to end over "
            f"{rec.plain.candidate.label} on the probe prompts ({best_e2e:.1f} s vs "
            f"{plain_e2e:.1f} s), within {1 / FALLBACK_MARGIN - 1:.0%} of it, and it drafts "
            "only where the text repeats and the verify cost pays, so it falls back to plain "
            "steps elsewhere (chosen over plain decoding unless it measured below "
            f"{FALLBACK_MARGIN:.2f}x). Prediction: " + reason
        )
    elif best is not rec.best:
        if best is rec.plain:
            reason = (
                f"measured: {best.candidate.label} was fastest of the checked configurations "
                f"(the prediction favoured {rec.best.candidate.label}). " + reason
            )
        else:
            reason = (
                f"{best.candidate.label}, K={best.k}: measured {plain_e2e / best_e2e:.2f}x end "
                f"to end over {rec.plain.candidate.label} on the probe prompts "
                f"({best_e2e:.1f} s vs {plain_e2e:.1f} s; speculation must reach "
                f"{DEFAULT_MARGIN:.2f}x), although the prediction favoured "
                f"{rec.best.candidate.label}. Prediction: " + reason
            )
    return {
        "candidate": asdict(best.candidate),
        "label": best.candidate.label,
        "k": best.k,
        "predicted_speedup": best.speedup_vs_plain,
        "reason": reason,
    }
