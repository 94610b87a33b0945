"""Benchmark configurations: which draft (a model, or n-gram lookup) feeds which target.

A configuration is written on the command line as comma-separated ``key=value`` pairs::

    draft=qwen2.5-coder-0.5b-instruct-q4_k_m,draft_backend=llamacpp,
    target=qwen2.5-coder-1.5b-instruct-q4_k_m,target_backend=hf,dtype=bfloat16

Keys: ``draft`` (a model reference, ``ngram`` or ``ngram:MAX_N``, ``suffix[:OPTS]``,
``planned[:OPTS]`` or ``hybrid:MODEL``; suffix options separated by ``;`` since ``,``
separates keys), ``target``, ``label``, and ``backend`` / ``device`` / ``dtype`` (both
models) or with a ``draft_`` / ``target_`` prefix (one model), ``n_ctx``, ``n_threads``,
``ngram_min``, ``k`` (this configuration's own K sweep, e.g. ``k=16`` or ``k=1;2;4``: the
planned drafter sizes its drafts itself, so its K is only a cap), ``draft_window`` (a draft
model, alone or in a hybrid, sees only the last W tokens of the context, e.g.
``draft_window=256``; below ``n_ctx``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from specdec.drafters.suffix import parse_suffix_options
from specdec.errors import ConfigError
from specdec.models.loader import ModelConfig
from specdec.pairs import DEFAULT_DRAFT, DEFAULT_TARGET, HYBRID_PREFIX, PLANNED, PLANNED_K

DEFAULT_N_CTX = 2048  # fits every Spec-Bench prompt (<= ~1,700 Qwen tokens) plus the output


@dataclass(frozen=True)
class NgramSpec:
    """The prompt-lookup drafter's n-gram sizes."""

    max_n: int = 3
    min_n: int = 1


@dataclass(frozen=True)
class BenchConfig:
    """One draft -> target configuration; ``label`` names it in results and reports."""

    label: str
    target: ModelConfig
    draft: ModelConfig | None = None  # a draft model (alone, or behind a suffix drafter)
    ngram: NgramSpec | None = None
    free: str | None = None  # a model-free drafter reference: suffix[:OPTS] | planned[:OPTS]
    hybrid: bool = False  # the draft model drafts only where the suffix drafter has nothing
    ks: tuple[int, ...] | None = None  # this configuration's K sweep (None: the plan's)
    draft_window: int | None = None  # the draft model sees the last W tokens (None: all)
    prediction: bool = False  # a prompt's prediction is drafted first (drafters.prediction)

    def __post_init__(self) -> None:
        given = [x for x in (self.draft, self.ngram, self.free) if x is not None]
        if len(given) != 1:
            raise ConfigError(
                f"configuration {self.label!r} needs exactly one drafter: a draft model, "
                "ngram, suffix or planned"
            )
        if self.hybrid and self.draft is None:
            raise ConfigError(f"configuration {self.label!r}: a hybrid needs a draft model")
        if self.free is not None and self.free.split(":")[0] not in ("suffix", PLANNED):
            raise ConfigError(f"configuration {self.label!r}: unknown drafter {self.free!r}")
        if self.ks is not None and (not self.ks or any(k < 1 for k in self.ks)):
            raise ConfigError(f"configuration {self.label!r}: K values must be >= 1")
        self._check_window()
        if not self.label or any(c in self.label for c in "\n\t"):
            raise ConfigError(f"bad configuration label {self.label!r}")

    def _check_window(self) -> None:
        w = self.draft_window
        if w is None:
            return
        if self.draft is None:
            raise ConfigError(
                f"configuration {self.label!r}: draft_window needs a draft model "
                "(draft=MODEL or hybrid:MODEL)"
            )
        if isinstance(w, bool) or not isinstance(w, int) or not 1 <= w < self.draft.n_ctx:
            raise ConfigError(
                f"configuration {self.label!r}: draft_window must be an integer in "
                f"1..{self.draft.n_ctx - 1} (below the draft's n_ctx), got {w!r}"
            )

    @property
    def drafter_kind(self) -> str:
        if self.ngram is not None:
            return "ngram"
        if self.free is not None:
            return self.free.split(":")[0]
        return "hybrid" if self.hybrid else "model"

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "target": asdict(self.target),
            "draft": asdict(self.draft) if self.draft is not None else None,
            "ngram": asdict(self.ngram) if self.ngram is not None else None,
            "free": self.free,
            "hybrid": self.hybrid,
            "ks": list(self.ks) if self.ks is not None else None,
            "draft_window": self.draft_window,
            "prediction": self.prediction,
        }

    @staticmethod
    def from_dict(d: dict[str, Any]) -> BenchConfig:
        return BenchConfig(
            label=d["label"],
            target=ModelConfig(**d["target"]),
            draft=ModelConfig(**d["draft"]) if d.get("draft") else None,
            ngram=NgramSpec(**d["ngram"]) if d.get("ngram") else None,
            free=d.get("free"),
            hybrid=bool(d.get("hybrid", False)),
            ks=tuple(d["ks"]) if d.get("ks") else None,
            draft_window=d.get("draft_window"),
            prediction=bool(d.get("prediction", False)),
        )


def short_name(cfg: ModelConfig) -> str:
    """'llamacpp', 'hf-bf16', 'mock:close', ... : the backend and precision in a few chars."""
    backend = cfg.resolved_backend()
    if backend == "mock":
        return cfg.model
    if backend == "hf":
        dt = {"bfloat16": "bf16", "float32": "fp32", "float16": "fp16"}.get(cfg.dtype, cfg.dtype)
        return f"hf-{dt}"
    return backend + ("-exact" if cfg.exact else "")


def default_label(
    draft: ModelConfig | None,
    ngram: NgramSpec | None,
    target: ModelConfig,
    free: str | None = None,
    hybrid: bool = False,
    draft_window: int | None = None,
) -> str:
    if free is not None:
        d = free.split(":")[0]
    elif draft is not None:
        d = ("hybrid-" if hybrid else "") + short_name(draft)
        d += f"-w{draft_window}" if draft_window is not None else ""
    else:
        d = f"ngram{ngram.max_n if ngram else 3}"
    return f"{d}->{short_name(target)}"


def _mc(model: str, backend: str, dtype: str = "auto") -> ModelConfig:
    return ModelConfig(model=model, backend=backend, dtype=dtype, n_ctx=DEFAULT_N_CTX)


def default_matrix(draft: str = DEFAULT_DRAFT, target: str = DEFAULT_TARGET) -> list[BenchConfig]:
    """The five configurations of the study, cheapest first:
    (a) llama.cpp -> llama.cpp, (b) llama.cpp -> hf bf16, (c) hf bf16 -> hf bf16,
    (d) hf fp32 -> hf fp32, (e) n-gram prompt lookup -> hf bf16."""
    return [
        BenchConfig("llamacpp->llamacpp", _mc(target, "llamacpp"), draft=_mc(draft, "llamacpp")),
        BenchConfig(
            "llamacpp->hf-bf16", _mc(target, "hf", "bfloat16"), draft=_mc(draft, "llamacpp")
        ),
        BenchConfig(
            "hf-bf16->hf-bf16", _mc(target, "hf", "bfloat16"), draft=_mc(draft, "hf", "bfloat16")
        ),
        BenchConfig(
            "hf-fp32->hf-fp32", _mc(target, "hf", "float32"), draft=_mc(draft, "hf", "float32")
        ),
        BenchConfig("ngram->hf-bf16", _mc(target, "hf", "bfloat16"), ngram=NgramSpec()),
    ]


def llamacpp_matrix(draft: str = DEFAULT_DRAFT, target: str = DEFAULT_TARGET) -> list[BenchConfig]:
    """Every drafter on the llama.cpp target (the fastest plain decoder of a GGUF on a CPU, so
    every K = 0 run is the baseline a user would otherwise run): the cost-aware suffix
    drafter (the default of ``specdec generate`` without a profile; K = 16 is only its cap),
    the suffix drafter, n-gram lookup, the draft model, and the hybrid of the two."""
    t = _mc(target, "llamacpp")
    return [
        BenchConfig("planned->llamacpp", t, free=PLANNED, ks=(PLANNED_K,)),
        BenchConfig("suffix->llamacpp", t, free="suffix"),
        BenchConfig("ngram3->llamacpp", t, ngram=NgramSpec()),
        BenchConfig("llamacpp->llamacpp", t, draft=_mc(draft, "llamacpp")),
        BenchConfig("hybrid-llamacpp->llamacpp", t, draft=_mc(draft, "llamacpp"), hybrid=True),
    ]


MATRICES = {"study": default_matrix, "llamacpp": llamacpp_matrix}


def quick_matrix() -> list[BenchConfig]:
    """``--quick``: the decelerating (a) and the paying (b) configuration of the default set."""
    return default_matrix()[:2]


_MODEL_KEYS = ("backend", "device", "dtype")
_KNOWN = {
    "draft",
    "draft_window",
    "exact",
    "prediction",
    "k",
    "target",
    "label",
    "n_ctx",
    "n_threads",
    "ngram_min",
    *_MODEL_KEYS,
    *(f"{role}_{k}" for role in ("draft", "target") for k in _MODEL_KEYS),
}


def _flag(key: str, value: str) -> bool:
    if value not in ("0", "1"):
        raise ConfigError(f"configuration key {key} takes 0 or 1, got {value!r}")
    return value == "1"


def _int(key: str, value: str) -> int:
    try:
        return int(value)
    except ValueError as e:
        raise ConfigError(f"configuration key {key} needs an integer, got {value!r}") from e


def parse_config(spec: str) -> BenchConfig:
    """Parse ``key=value,...`` (see the module docstring) into a BenchConfig."""
    kv: dict[str, str] = {}
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        key, eq, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if not eq or not key:
            raise ConfigError(f"bad configuration item {part!r} in {spec!r}: use key=value")
        if key not in _KNOWN:
            raise ConfigError(
                f"unknown configuration key {key!r}; known keys: {', '.join(sorted(_KNOWN))}"
            )
        if key in kv:
            raise ConfigError(f"configuration key {key!r} given twice in {spec!r}")
        kv[key] = value
    if "target" not in kv:
        raise ConfigError(f"configuration {spec!r} has no target=...")
    draft_ref = kv.get("draft", DEFAULT_DRAFT)
    n_ctx = _int("n_ctx", kv["n_ctx"]) if "n_ctx" in kv else DEFAULT_N_CTX
    n_threads = _int("n_threads", kv["n_threads"]) if "n_threads" in kv else None

    exact = _flag("exact", kv["exact"]) if "exact" in kv else False

    def model(role: str, ref: str) -> ModelConfig:
        opts = {k: kv.get(f"{role}_{k}", kv.get(k, "auto")) for k in _MODEL_KEYS}
        return ModelConfig(
            model=ref,
            backend=opts["backend"],
            device=opts["device"],
            dtype=opts["dtype"],
            n_ctx=n_ctx,
            n_threads=n_threads,
            exact=exact and role == "target",
        )

    target = model("target", kv["target"])
    draft: ModelConfig | None = None
    ngram: NgramSpec | None = None
    free: str | None = None
    hybrid = False
    ks = _ks(kv["k"]) if "k" in kv else None
    window = _int("draft_window", kv["draft_window"]) if "draft_window" in kv else None
    if draft_ref.split(":")[0] in ("suffix", PLANNED):
        name, _, opts = draft_ref.partition(":")
        free = name + (":" + opts.replace(";", ",") if opts else "")
        parse_suffix_options(opts.replace(";", ","))  # bad options fail here, not mid-run
    elif draft_ref.startswith(HYBRID_PREFIX):
        draft, hybrid = model("draft", draft_ref.removeprefix(HYBRID_PREFIX)), True
    elif draft_ref == "ngram" or draft_ref.startswith("ngram:"):
        _, _, n = draft_ref.partition(":")
        max_n = _int("draft", n) if n else 3
        min_n = _int("ngram_min", kv["ngram_min"]) if "ngram_min" in kv else 1
        if not 1 <= min_n <= max_n:
            raise ConfigError(f"n-gram sizes need 1 <= min <= max, got {min_n}, {max_n}")
        ngram = NgramSpec(max_n=max_n, min_n=min_n)
    elif draft_ref in ("", "none"):
        raise ConfigError("a bench configuration needs a drafter (plain decoding is always run)")
    else:
        draft = model("draft", draft_ref)
    prediction = _flag("prediction", kv["prediction"]) if "prediction" in kv else False
    label = kv.get("label") or default_label(draft, ngram, target, free, hybrid, window)
    if prediction and not kv.get("label"):
        label = "prediction+" + label
    return BenchConfig(
        label=label,
        target=target,
        draft=draft,
        ngram=ngram,
        free=free,
        hybrid=hybrid,
        ks=ks,
        draft_window=window,
        prediction=prediction,
    )


def _ks(value: str) -> tuple[int, ...]:
    ks = tuple(_int("k", v) for v in value.split(";") if v.strip())
    if not ks or any(k < 1 for k in ks) or len(set(ks)) != len(ks):
        raise ConfigError(f"configuration key k needs distinct values >= 1, got {value!r}")
    return ks


def check_unique_labels(configs: list[BenchConfig]) -> None:
    labels = [c.label for c in configs]
    dups = sorted({x for x in labels if labels.count(x) > 1})
    if dups:
        raise ConfigError(
            f"configuration label(s) {', '.join(dups)} used twice; add label=... to tell them apart"
        )
