"""Run the requested levels of a certificate, with incremental progress and resume."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from specdec import __version__
from specdec.constraints.engine import engine
from specdec.core.drafter import Drafter
from specdec.core.model import CausalLM
from specdec.errors import ConfigError
from specdec.models.loader import ModelConfig
from specdec.prompting import encode_prompt

from .common import torch_threads
from .constrained import run_constrained
from .faults import check_fault_levels, fault_models, injected_fault
from .invariance import batch_invariance
from .mock_level import run_level2
from .plan import Plan
from .progress import ProgressLog
from .prompts import CertifyPrompts
from .real import run_level3
from .report import Certificate, write_certificate
from .synthetic import run_level1

PROGRESS_FILE = "progress.jsonl"
Loader = Callable[[], tuple[CausalLM | Drafter | None, CausalLM]]


@dataclass(frozen=True)
class CertifyConfig:
    """One certificate run. ``draft`` / ``target`` describe the models (labels for the report;
    loading is done by the ``loader`` given to ``run_certificate``)."""

    levels: tuple[str, ...]
    plan: Plan
    quick: bool
    seed: int
    alpha: float
    draft: str | None = None
    target: str | None = None
    prompts_source: str | None = None
    chat: str = "auto"  # auto | on | off
    out_dir: Path | None = None
    resume: bool = False
    fault: str | None = None
    command: str = "specdec certify"

    def header(self) -> dict[str, Any]:
        """What identifies the experiment (the progress log refuses to mix two of them)."""
        return {
            "levels_requested": list(self.levels),
            "quick": self.quick,
            "seed": self.seed,
            "alpha": self.alpha,
            "draft": self.draft,
            "target": self.target,
            "prompts_source": self.prompts_source,
            "chat": self.chat,
            "fault": self.fault,
            "plan": asdict(self.plan),
        }


def model_label(cfg: ModelConfig | str | None) -> str | None:
    if cfg is None or isinstance(cfg, str):
        return cfg
    return cfg.label()


def runtime_info(model: object) -> dict[str, str] | None:
    """What actually runs (the resolved dtype / device where the backend reports them)."""
    if model is None:
        return None
    info = {"class": type(model).__name__}
    for attr in ("dtype", "device", "path"):
        value = getattr(model, attr, None)
        if value is not None:
            info[attr] = str(value)
    if hasattr(model, "exact"):  # the llama.cpp backend: which numerics (models.exact)
        info["numerics"] = "exact" if model.exact else "default"
    kv = getattr(model, "type_k", None), getattr(model, "type_v", None)
    if None not in kv:  # the llama.cpp backend's KV cache types, keys / values
        info["kv_cache"] = "/".join(str(t) for t in kv)
    if hasattr(model, "exact"):  # which llama.cpp build ran: its CPU library as mapped
        from specdec.models.llamacpp import LibIdentityError, loaded_library

        try:
            lib = loaded_library()
        except LibIdentityError as err:  # recorded, not fatal: the certificate says so
            info["ggml_cpu"] = str(err)
            lib = None
        if lib is not None:
            version = lib.row_invariant_version
            build = "stock build" if version is None else f"exact build, patch version {version}"
            info["ggml_cpu"] = f"{build}, libggml-cpu SHA-256 {lib.sha256[:16]}"
    return info


def prompt_ids(
    target: CausalLM,
    texts: Sequence[str | Sequence[int]],
    found: Sequence[str | None] | None,
    chat: str,
) -> tuple[list[list[int]], list[list[int] | None] | None]:
    """(the prompts' token ids, the predictions' ids): texts encoded with the target's chat
    template per ``chat``, token-id lists taken as they are, the predictions ``found`` (None
    when no prompt carries one) as plain text."""
    has_template = getattr(target.tokenizer, "apply_chat", None) is not None
    if chat == "on" and not has_template:
        raise ConfigError("--chat on: the target has no chat template")
    use_chat = chat == "on" or (chat == "auto" and has_template)
    ids = []
    for t in texts:
        if isinstance(t, str):
            ids.append(encode_prompt(target, t, chat=use_chat))
        else:
            one = [int(x) for x in t]
            if not one:
                raise ConfigError("a prompt given as token ids is empty")
            ids.append(one)
    predictions = (
        None
        if found is None
        else [
            None if x is None else target.tokenizer.encode(x, add_special_tokens=False)
            for x in found
        ]
    )
    return ids, predictions


def run_certificate(
    cfg: CertifyConfig,
    loader: Loader | None = None,
    *,
    progress: Callable[[str], None] | None = None,
    prompts: CertifyPrompts | None = None,
) -> Certificate:
    """Run the levels in cfg.levels; write certificate.json/.md into cfg.out_dir if set.

    loader() returns (draft or drafter, target) and is called only when Level 3 or the probe
    runs; a backend fault named in cfg.fault is applied to what it returns. ``prompts``: the
    prompts of Level 3 and the probe, read by the caller before the run (the CLI reads
    cfg.prompts_source with ``prompts.load_certify_prompts``, so that a bad prompt file fails
    before the first level). ``progress`` receives one-line status messages (the CLI prints
    them to stderr).
    """
    say = progress or (lambda _msg: None)
    check_fault_levels(cfg.fault, cfg.levels)
    if "constrained" in cfg.levels:
        engine("--levels constrained")  # the grammar engine, or one line before any level runs
    needs_models = "3" in cfg.levels or "probe" in cfg.levels
    if needs_models and prompts is None:
        raise ConfigError(
            "level 3 and the probe need prompts (certify.prompts.load_certify_prompts reads "
            "cfg.prompts_source)"
        )
    header = cfg.header()
    log = ProgressLog(
        cfg.out_dir / PROGRESS_FILE if cfg.out_dir else None, header, resume=cfg.resume
    )
    if cfg.resume and log.done:
        say(f"resuming: {len(log.done)} completed units found")
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    cert = Certificate(
        header={
            **header,
            "specdec_version": __version__,
            "seed_scheme": "every random stream is seeded with blake2b(seed, labels) "
            "(specdec.certify.seeds.derive_seed); labels name the level, case or setup, method, "
            "prompt and sequence index",
            "created_utc": created,
            "command": cfg.command,
        }
    )
    with injected_fault(cfg.fault):
        if "1" in cfg.levels:
            say("level 1: the accept/reject walk on synthetic distributions ...")
            with torch_threads(1):
                cert.level1 = run_level1(cfg.plan.level1, log=log)
            say(f"level 1: {cert.level1.status} ({cert.level1.seconds:.0f} s)")
        if "2" in cfg.levels:
            say("level 2: the decoding loop on mock models ...")
            with torch_threads(1):
                cert.level2 = run_level2(cfg.plan.level2, log=log)
            say(f"level 2: {cert.level2.status} ({cert.level2.seconds:.0f} s)")
        if "constrained" in cfg.levels:
            say("constrained: the decoding loop under a grammar on mock models ...")
            with torch_threads(1):
                cert.constrained = run_constrained(cfg.plan.constrained, log=log)
            cert.header["constraints"] = cert.constrained.grammars
            say(f"constrained: {cert.constrained.status} ({cert.constrained.seconds:.0f} s)")
        if needs_models:
            if loader is None:
                raise ConfigError("level 3 and the probe need models (--draft and --target)")
            say(f"loading models: draft {cfg.draft}, target {cfg.target} ...")
            loaded_draft, loaded_target = loader()
            cert.header["draft_runtime"] = runtime_info(loaded_draft)
            cert.header["target_runtime"] = runtime_info(loaded_target)
            draft: CausalLM | Drafter | None = loaded_draft
            target = loaded_target
            if cfg.fault is not None and loaded_draft is not None:
                draft, target = fault_models(cfg.fault, loaded_draft, loaded_target)
            assert prompts is not None
            ids, predictions = prompt_ids(target, prompts.texts, prompts.predictions, cfg.chat)
            cert.header["prompts"] = (
                f"{len(ids)} from {prompts.where} ({min(map(len, ids))}-{max(map(len, ids))} "
                "tokens)"
            )
            if predictions is not None:
                cert.header["predictions"] = (
                    f"{sum(x is not None for x in predictions)} of the prompts carry a "
                    "prediction, drafted in front of the draft (drafters.prediction)"
                )
            l3 = cfg.plan.level3
            if "3" in cfg.levels:
                if draft is None:
                    raise ConfigError("level 3 needs a draft (a model or 'ngram'), not 'none'")
                say("level 3: probe, greedy agreement and the per-token test on the real setup ...")
                cert.level3 = run_level3(
                    draft,
                    target,
                    ids,
                    l3,
                    draft_label=cfg.draft or "draft",
                    target_label=cfg.target or "target",
                    log=log,
                    progress=lambda msg: say(f"level 3: {msg}"),
                    predictions=predictions,
                )
                say(f"level 3: {cert.level3.status} ({sum(cert.level3.seconds.values()):.0f} s)")
            else:
                say("batch-invariance probe ...")
                probed: list[tuple[str, CausalLM]] = [(cfg.target or "target", target)]
                if isinstance(draft, CausalLM):
                    probed.append((cfg.draft or "draft", draft))
                probes = [
                    batch_invariance(model, ids[: l3.probe_prompts], ns=l3.probe_ns, label=label)
                    for label, model in probed
                ]
                cert.probe = probes[0]
                cert.draft_probe = probes[1] if len(probes) > 1 else None
    if cfg.out_dir is not None:
        write_certificate(cert, cfg.out_dir)
    return cert
