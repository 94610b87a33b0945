"""Run a bench plan: load each configuration once, profile it, measure, append each result.

Block mode (the default) loads one configuration, runs all its measurements and releases it
before the next. ``plan.interleave`` loads every configuration at once (configurations that
name the same model with the same settings share one instance, see ``SharedModels``) and,
for each repeat and prompt, runs every configuration's measurements of that prompt before the
next prompt, the configuration order rotated by prompt and repeat: slow drift (thermal
state, other load) then falls on all configurations alike instead of on whole blocks.

Crash safety: every finished measurement is one fsynced JSON line, so an interruption loses
at most the generation in progress; ``resume=True`` skips every measurement whose key
(configuration, mode, prompt, repeat, K) is already in the file.
"""

from __future__ import annotations

import gc
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from tqdm import tqdm

from specdec.bench.analysis import predicted_from_counts, predicted_from_rounds
from specdec.bench.configs import BenchConfig
from specdec.bench.plan import MODES, BenchPlan, Measurement, config_ks, measurements
from specdec.bench.profile import profile_config
from specdec.bench.results import SCHEMA_VERSION, Results, ResultsWriter, open_for_append
from specdec.core.drafter import Drafter
from specdec.core.loop import as_drafter, generate
from specdec.core.model import CausalLM
from specdec.core.model_drafter import ModelDrafter
from specdec.core.result import GenerationResult
from specdec.drafters import NgramDrafter
from specdec.drafters.planned import PlannedSuffixDrafter
from specdec.drafters.prediction import PredictionDrafter
from specdec.drafters.suffix import SuffixDrafter
from specdec.errors import ConfigError, SpecdecError
from specdec.models.loader import ModelConfig, load_model
from specdec.pairs import (
    DraftRef,
    HybridRef,
    Loader,
    is_planned,
    load_pair,
    pair_context_limit,
    parse_drafter,
    release,
)
from specdec.prompt_sets import Prompt, select_prompts
from specdec.prompting import encode_prompt
from specdec.theory import Costs
from specdec.util.credentials import redact_argv
from specdec.util.machine import git_commit, machine_info, package_versions

Hook = Callable[[dict[str, Any]], None]
Log = Callable[[str], None]


@dataclass
class BenchOutcome:
    path: Path
    session: int
    measured: int = 0  # new measurements this session
    already_done: int = 0  # skipped because the file had them (resume)
    skipped_prompts: list[str] = field(default_factory=list)  # "config: prompt (reason)"
    partial_line_cut: bool = False


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


# Plan fields that must agree between a file and a resumed run (they change what a
# measurement with a given key means).
_COMPAT_FIELDS = ("max_new_tokens", "stop_on_eos", "chat", "seed", "reuse_prefix")


def check_resume_compatible(plan: BenchPlan, existing: Results) -> None:
    if not existing.headers:
        return
    first = existing.headers[0].get("plan", {})
    for name in _COMPAT_FIELDS:
        if name in first and first[name] != getattr(plan, name):
            raise ConfigError(
                f"cannot resume: the file was measured with {name} = {first[name]!r}, this run "
                f"asks for {getattr(plan, name)!r}"
            )
    before = {c["label"]: c for h in existing.headers for c in h.get("plan", {}).get("configs", [])}
    for cfg in plan.configs:
        old = before.get(cfg.label)
        if old is not None and old != cfg.to_dict():
            raise ConfigError(
                f"cannot resume: configuration {cfg.label!r} was measured with other settings "
                f"({old}); give the new one another label=..."
            )


def header_record(
    plan: BenchPlan, session: int, argv: Sequence[str] | None, prompts: Sequence[Prompt]
) -> dict[str, Any]:
    return {
        "type": "header",
        "schema": SCHEMA_VERSION,
        "session": session,
        "started": _now(),
        "argv": redact_argv(argv) if argv is not None else None,  # no API key on disk
        "machine": machine_info(),
        "versions": package_versions(),
        "git": git_commit(),
        "plan": plan.to_dict(),
        "prompts": [{"id": p.id, "category": p.category, "fine": p.fine_category} for p in prompts],
    }


def measurement_record(
    m: Measurement,
    res: GenerationResult,
    *,
    session: int,
    drafter_kind: str,
    max_new_tokens: int,
    plain_tps: float | None,
    profile: dict[str, Any] | None,
) -> dict[str, Any]:
    reached, accepted = res.acceptance_counts()
    reached = (reached + [0] * m.k)[: m.k]  # one entry per draft position 1..K
    accepted = (accepted + [0] * m.k)[: m.k]
    tps = res.tokens_per_second
    speedup = tps / plain_tps if m.k > 0 and plain_tps and plain_tps > 0 else None
    c = profile.get("c") if profile else None
    vr = profile.get("verify_ratio") if profile else None
    draft_lengths = res.draft_length_histogram()
    predicted = predicted_from_rounds(draft_lengths, len(res.tokens), m.k, c, vr, drafter_kind)
    if predicted is None:  # no rounds or no costs: the positional formula, where it applies
        predicted = predicted_from_counts(reached, accepted, m.k, c, vr)
    return {
        "type": "measurement",
        "session": session,
        "config": m.config,
        "mode": m.mode,
        "temperature": MODES[m.mode].temperature,
        "prompt_id": m.prompt.id,
        "category": m.prompt.category,
        "fine_category": m.prompt.fine_category,
        "repeat": m.repeat,
        "k": m.k,
        "seed": m.seed,
        "drafter": "none" if m.k == 0 else drafter_kind,
        "max_new_tokens": max_new_tokens,
        "prompt_tokens": len(res.prompt_ids),
        "n_tokens": len(res.tokens),
        "finish_reason": res.finish_reason,
        "rounds": res.n_rounds,
        "drafted": sum(r.k for r in res.rounds),
        "t_total": res.t_total,
        "t_prefill": res.t_prefill,
        "ttft": res.ttft,  # time to first token: prefill + first round
        "t_decode": res.t_total - res.t_prefill,
        "tokens_per_second": tps,
        "mean_accepted_per_round": res.mean_accepted_per_round if m.k else 0.0,
        "mean_tokens_per_round": res.mean_tokens_per_round,
        "reached": reached,
        "accepted": accepted,
        "draft_lengths": draft_lengths,  # rounds by drafts verified (index 0: plain steps)
        "time_split": res.time_split(),
        "plain_tokens_per_second": plain_tps,
        "speedup": speedup,
        "predicted_speedup": predicted,
        # the draft window and its re-bases (null without one): a windowed draft's prefill,
        # in t_prefill and ttft, covered only the window
        "draft_window": res.extra.get("draft_window") if m.k else None,
        "draft_rebases": res.extra.get("draft_rebases") if m.k else None,
        # OpenAI's predicted-output counts (null unless a prediction was drafted)
        **prediction_counts(res),
        "finished": _now(),
        "tokens": res.tokens,
    }


def prediction_counts(res: GenerationResult) -> dict[str, int | None]:
    """accepted / rejected prediction tokens (None without a prediction)."""
    if "prediction_tokens" not in res.extra:
        return {"accepted_prediction_tokens": None, "rejected_prediction_tokens": None}
    accepted, rejected = res.prediction_tokens()
    return {"accepted_prediction_tokens": accepted, "rejected_prediction_tokens": rejected}


def _use_chat(plan: BenchPlan, target: CausalLM) -> bool:
    has = callable(getattr(target.tokenizer, "apply_chat", None))
    if plan.chat == "on" and not has:
        raise ConfigError("chat=on but the target tokenizer has no chat template")
    return has if plan.chat == "auto" else plan.chat == "on"


class _Runner:
    """One bench session (kept small: the state of a run, not module state)."""

    def __init__(
        self,
        plan: BenchPlan,
        writer: ResultsWriter,
        existing: Results,
        session: int,
        loader: Loader,
        bar: tqdm,
        log: Log,
        on_record: Hook | None,
        outcome: BenchOutcome,
    ) -> None:
        self.plan = plan
        self.writer = writer
        self.existing = existing
        self.session = session
        self.loader = loader
        self.bar = bar
        self.log = log
        self.on_record = on_record
        self.outcome = outcome
        self.done = existing.keys()
        self.skipped = {(s["config"], s["prompt_id"]) for s in existing.skips}
        self.plain_tps: dict[tuple[str, str, str, int], float] = {
            (r["config"], r["mode"], r["prompt_id"], r["repeat"]): r["tokens_per_second"]
            for r in existing.measurements
            if r["k"] == 0 and r.get("tokens_per_second") is not None
        }

    def write(self, record: dict[str, Any]) -> None:
        self.writer.append(record)
        if self.on_record is not None:
            self.on_record(record)

    def load(
        self, cfg: BenchConfig, loader: Loader | None = None
    ) -> tuple[CausalLM, CausalLM | Drafter]:
        """The pair; a planned drafter comes unplanned (its inner suffix drafter) and gets its
        planner once the configuration's profile has measured the verify curve."""
        self.bar.set_description_str(f"{cfg.label}: loading")
        ref: DraftRef = cfg.draft
        if cfg.ngram is not None:
            ref = NgramDrafter(max_n=cfg.ngram.max_n, min_n=cfg.ngram.min_n)
        elif cfg.free is not None:
            ref = parse_drafter(cfg.free.replace(";", ","))
        elif cfg.hybrid:
            assert cfg.draft is not None
            ref = HybridRef(cfg.draft)
        draft, target = load_pair(
            ref,
            cfg.target,
            loader=self.loader if loader is None else loader,
            draft_window=cfg.draft_window,
        )
        assert draft is not None, "a bench configuration always has a drafter"
        return target, draft

    def encode(
        self, cfg: BenchConfig, target: CausalLM, n_ctx: int, prompts: Sequence[Prompt]
    ) -> dict[str, list[int]]:
        chat = _use_chat(self.plan, target)
        ids: dict[str, list[int]] = {}
        room = self.plan.max_new_tokens + max(config_ks(self.plan, cfg)) + 1
        for p in prompts:
            reason = None
            try:
                enc = encode_prompt(target, p.text, chat=chat)
            except SpecdecError as e:
                reason = str(e)
            else:
                if len(enc) + room > n_ctx:
                    reason = (
                        f"{len(enc)} prompt tokens + {room} for the output exceed the context "
                        f"window of {n_ctx}"
                    )
                else:
                    ids[p.id] = enc
            if reason is not None:
                self.outcome.skipped_prompts.append(f"{cfg.label}: {p.id} ({reason})")
                if (cfg.label, p.id) not in self.skipped:
                    self.write(
                        {
                            "type": "skip",
                            "session": self.session,
                            "config": cfg.label,
                            "prompt_id": p.id,
                            "category": p.category,
                            "reason": reason,
                        }
                    )
                    self.skipped.add((cfg.label, p.id))
        return ids

    def prepare(
        self,
        cfg: BenchConfig,
        target: CausalLM,
        draft: CausalLM | Drafter,
        prompts: Sequence[Prompt],
        t0: float,
    ) -> _Prepared:
        """A loaded pair made ready to measure: its prompts encoded (skips recorded), a
        warm-up, its profile (measured and recorded when the file has none), and a planned
        drafter given its planner."""
        self.log(f"{cfg.label}: loaded in {time.perf_counter() - t0:.1f} s")
        n_ctx = pair_context_limit(draft, target)
        ids = self.encode(cfg, target, n_ctx, prompts)
        if self.plan.warmup and ids:
            self.bar.set_description_str(f"{cfg.label}: warm-up")
            first = next(iter(ids.values()))
            generate(target, draft, first, max_new_tokens=4, k=2, stop_on_eos=False)
        profile = self.existing.profile_for(cfg.label)
        if profile is None:
            self.bar.set_description_str(f"{cfg.label}: profiling")
            prof = profile_config(
                cfg.label,
                target,
                # a windowed draft model's step is its model's step (c as without one)
                draft.model if isinstance(draft, ModelDrafter) else draft,
                context_tokens=self.plan.profile_context_tokens,
                n_max=self.plan.verify_max,
                repeats=self.plan.profile_repeats,
            )
            profile = {"type": "profile", "session": self.session, **prof.to_dict()}
            self.write(profile)
            self.log(
                f"{cfg.label}: target step {prof.target_step_s * 1e3:.1f} ms, draft step "
                f"{prof.draft_step_s * 1e3:.2f} ms (c = {prof.c:.3f}), verify(8)/verify(1) "
                f"= {prof.verify_ratio[min(7, len(prof.verify_ratio) - 1)]:.2f}"
            )
        if is_planned(cfg.free):
            assert isinstance(draft, SuffixDrafter)
            draft = PlannedSuffixDrafter(draft, planner_costs(profile))
        predictions = {
            p.id: target.tokenizer.encode(p.prediction, add_special_tokens=False)
            for p in prompts
            if cfg.prediction and p.prediction is not None and p.id in ids
        }
        return _Prepared(cfg, target, draft, ids, profile, predictions)

    def drafter_for(self, p: _Prepared, m: Measurement) -> CausalLM | Drafter | None:
        """The configuration's drafter, behind the prompt's prediction when it has one and
        the configuration drafts predictions; None for plain runs."""
        if m.k == 0:
            return None
        pred = p.predictions.get(m.prompt.id)
        if pred is None:
            return p.draft
        return PredictionDrafter(
            pred, costs=planner_costs(p.profile), fallback=as_drafter(p.draft, p.target)
        )

    def measure(self, p: _Prepared, m: Measurement) -> None:
        """Run one measurement and append its record (a prompt the configuration skipped
        only advances the bar)."""
        if m.prompt.id not in p.ids:
            self.bar.update(1)
            return
        self.bar.set_postfix_str(f"{m.mode} {m.prompt.id} r{m.repeat} K={m.k}")
        res = generate(
            p.target,
            self.drafter_for(p, m),
            p.ids[m.prompt.id],
            max_new_tokens=self.plan.max_new_tokens,
            k=m.k,
            sampling=MODES[m.mode],
            seed=m.seed,
            stop_on_eos=self.plan.stop_on_eos,
            reuse_prefix=self.plan.reuse_prefix,
        )
        # a speculative run's speedup pairs with its own configuration's plain run
        pkey = (m.config, m.mode, m.prompt.id, m.repeat)
        rec = measurement_record(
            m,
            res,
            session=self.session,
            drafter_kind=p.cfg.drafter_kind,
            max_new_tokens=self.plan.max_new_tokens,
            plain_tps=self.plain_tps.get(pkey),
            profile=p.profile,
        )
        if m.k == 0:
            self.plain_tps[pkey] = res.tokens_per_second
        self.write(rec)
        self.done.add(m.key)
        self.outcome.measured += 1
        self.bar.update(1)

    def run_config(
        self, cfg: BenchConfig, todo: list[Measurement], prompts: Sequence[Prompt]
    ) -> None:
        """Block mode: load one configuration, run all its measurements, release it."""
        t0 = time.perf_counter()
        target, draft = self.load(cfg)
        try:
            prepared = self.prepare(cfg, target, draft, prompts, t0)
            self.bar.set_description_str(cfg.label)
            for m in todo:
                self.measure(prepared, m)
        finally:
            release(draft, target)
            del target, draft
            gc.collect()

    def run_interleaved(
        self, work: Sequence[tuple[BenchConfig, list[Measurement]]], prompts: Sequence[Prompt]
    ) -> None:
        """Interleaved mode: load every configuration at once (identical model configs share
        one instance), then for each repeat and prompt run every configuration's measurements
        of that prompt, the configuration order rotated by prompt and repeat."""
        models = SharedModels(self.loader)
        try:
            ready: list[tuple[_Prepared, dict[tuple[int, str], list[Measurement]]]] = []
            for cfg, todo in work:
                t0 = time.perf_counter()
                target, draft = self.load(cfg, models.loader_for(cfg.label))
                models.claim(cfg.label)
                groups: dict[tuple[int, str], list[Measurement]] = {}
                for m in todo:
                    groups.setdefault((m.repeat, m.prompt.id), []).append(m)
                ready.append((self.prepare(cfg, target, draft, prompts, t0), groups))
                del target, draft
            for repeat in range(self.plan.repeats):
                for i, prompt in enumerate(prompts):
                    for prepared, groups in rotated(ready, i + repeat):
                        group = groups.get((repeat, prompt.id), [])
                        if not group:
                            continue
                        models.claim(prepared.cfg.label)
                        self.bar.set_description_str(prepared.cfg.label)
                        for m in group:
                            self.measure(prepared, m)
        finally:
            ready = []
            models.release()
            gc.collect()


@dataclass
class _Prepared:
    """One configuration ready to measure."""

    cfg: BenchConfig
    target: CausalLM
    draft: CausalLM | Drafter
    ids: dict[str, list[int]]  # encoded prompts (skipped ones absent)
    profile: dict[str, Any]
    predictions: dict[str, list[int]] = field(default_factory=dict)  # prompt id -> tokens


_T = TypeVar("_T")


def rotated(items: Sequence[_T], shift: int) -> list[_T]:
    """``items`` rotated left by ``shift`` (modulo their number)."""
    if not items:
        return []
    s = shift % len(items)
    return [*items[s:], *items[:s]]


class SharedModels:
    """The models of an interleaved run: each configuration loads through ``loader_for``,
    which returns one instance for every configuration asking for an identical
    ``ModelConfig`` (the n-th request of one configuration for a given ModelConfig shares
    with the n-th request of the others, so a configuration whose draft and target are the
    same model still gets two instances, with caches of their own).

    Generation leaves its caches to the next generation, which prefills its own prompt (or,
    with reuse_prefix, keeps only the cached prefix it shares with its prompt, read from
    the cache itself), so a shared model cannot carry wrong state into another
    configuration's run. ``claim`` still empties a shared model's cache when another
    configuration used it last, so that a configuration never reuses a prefix another
    configuration cached (its prefill then costs what it costs in block mode)."""

    def __init__(self, loader: Loader) -> None:
        self._loader = loader
        self._by_config: dict[tuple[ModelConfig, int], CausalLM] = {}
        self._models: list[CausalLM] = []  # distinct, in load order
        self._used_by: dict[str, list[CausalLM]] = {}
        self._last_user: dict[int, str] = {}  # id(model) -> configuration label

    def loader_for(self, label: str) -> Loader:
        seen: Counter[ModelConfig] = Counter()
        used = self._used_by.setdefault(label, [])

        def load(mc: ModelConfig) -> CausalLM:
            key = (mc, seen[mc])
            seen[mc] += 1
            lm = self._by_config.get(key)
            if lm is None:
                lm = self._by_config[key] = self._loader(mc)
                self._models.append(lm)
            used.append(lm)
            return lm

        return load

    def claim(self, label: str) -> None:
        """Before ``label`` runs: empty the cache of each of its models that another
        configuration used last."""
        for lm in self._used_by.get(label, []):
            last = self._last_user.get(id(lm))
            if last is not None and last != label and lm.n_cached:
                lm.truncate(0)
            self._last_user[id(lm)] = label

    def release(self) -> None:
        """Release every distinct model once."""
        models, self._models = self._models, []
        self._by_config.clear()
        self._used_by.clear()
        release(*models)


def planner_costs(profile: dict[str, Any]) -> Costs:
    """The costs a planned drafter sizes its drafts by: the configuration's measured verify
    curve (the loop's own per-round work is small next to a target pass and left out)."""
    return Costs(verify_s=tuple(profile["verify_s"]), prefill_tps=float("inf"))


def run_bench(
    plan: BenchPlan,
    out: str | Path,
    *,
    resume: bool = False,
    overwrite: bool = False,
    argv: Sequence[str] | None = None,
    loader: Loader = load_model,
    progress: bool = True,
    log: Log | None = None,
    on_record: Hook | None = None,
) -> BenchOutcome:
    """Run ``plan``, appending records to ``out``; see the module docstring.

    loader: ModelConfig -> CausalLM (tests inject their own); on_record is called after each
    record is safely on disk (tests use it to simulate a crash).
    """
    prompts = select_prompts(
        plan.prompt_source,
        categories=plan.categories,
        per_category=plan.prompts_per_category,
        seed=plan.seed,
    )
    writer, existing, cut = open_for_append(out, resume=resume, overwrite=overwrite)
    with writer:
        check_resume_compatible(plan, existing)
        session = len(existing.headers) + 1
        outcome = BenchOutcome(Path(out), session, partial_line_cut=cut)
        writer.append(header_record(plan, session, argv, prompts))
        todo_by_cfg = []
        done = existing.keys()
        for cfg in plan.configs:
            all_ms = measurements(plan, cfg, prompts)
            todo = [m for m in all_ms if m.key not in done]
            outcome.already_done += len(all_ms) - len(todo)
            todo_by_cfg.append((cfg, todo))
        total = sum(len(t) for _, t in todo_by_cfg)
        with tqdm(
            total=total, file=sys.stderr, disable=not progress, unit="gen", dynamic_ncols=True
        ) as bar:
            say: Log = log if log is not None else (lambda msg: None)
            runner = _Runner(plan, writer, existing, session, loader, bar, say, on_record, outcome)
            work = []
            for cfg, todo in todo_by_cfg:
                if not todo and existing.profile_for(cfg.label) is not None:
                    say(f"{cfg.label}: every measurement is already recorded")
                    continue
                work.append((cfg, todo))
            if plan.interleave:
                runner.run_interleaved(work, prompts)
            else:
                for cfg, todo in work:
                    runner.run_config(cfg, todo, prompts)
    return outcome
