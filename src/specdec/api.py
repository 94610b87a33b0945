"""The small public API: load a draft/target pair, generate text or stream it.

    import specdec
    pair = specdec.load()                                  # the default pair
    print(pair.generate("def fib(n):", max_new_tokens=16))  # text (the stats ride along)
    for piece in pair.stream("Explain RAII", system="Be brief.", temperature=0.7, seed=1):
        print(piece, end="", flush=True)

Everything here is a thin layer over ``specdec.pairs`` (loading) and ``specdec.core``
(the loop); the lower layers stay available for token-level work.
"""

from __future__ import annotations

import dataclasses
import inspect
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec

from specdec.completion import Comparison, Completion, TextStream
from specdec.configuration import MACHINE_DEFAULT, Configuration, measured_costs, resolve
from specdec.constraints.grammars import Grammars
from specdec.core.detokenize import IncrementalDecoder
from specdec.core.drafter import Drafter
from specdec.core.loop import as_drafter, generate_stream
from specdec.core.model import CausalLM
from specdec.core.policy import FixedK, KPolicy, capped_adaptive_k
from specdec.core.processors import LogitBias, Penalties, RowProcessor, chain
from specdec.drafters.planned import PlannedSuffixDrafter
from specdec.drafters.prediction import PredictionDrafter
from specdec.errors import ConfigError, PairBusyError
from specdec.pairs import (
    DEFAULT_DRAFT_BACKEND,
    DEFAULT_K,
    DEFAULT_TARGET,
    DEFAULT_TARGET_BACKEND,
    PLANNED_K,
    ModelOptions,
    load_pair,
)
from specdec.prompting import Message, check_text, encode_request, encode_text
from specdec.request import GenerationRequest, make_request
from specdec.theory import Costs
from specdec.util.signatures import drained

if TYPE_CHECKING:
    from specdec.profiler.auto import AutoChoice

# Completion, Comparison and TextStream (specdec.completion) are part of this module's API
__all__ = ["Comparison", "Completion", "Pair", "TextStream", "load"]


_P = ParamSpec("_P")


def _streaming(
    make: Callable[_P, GenerationRequest],
) -> Callable[Concatenate[Pair, _P], TextStream]:
    """``Pair.stream``: the parameters of ``make_request`` by construction (written once),
    the request it makes started by ``Pair.stream_request``."""

    def stream(self: Pair, *args: _P.args, **kwargs: _P.kwargs) -> TextStream:
        return self.stream_request(make(*args, **kwargs))

    stream.__doc__ = (
        "Start a generation; iterate the returned ``TextStream`` for text pieces. The "
        "arguments are those of ``specdec.request.make_request``:\n\n" + (make.__doc__ or "")
    )
    signature = inspect.signature(make)
    own = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    stream.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[own, *signature.parameters.values()], return_annotation="TextStream"
    )
    return stream


class Pair:
    """A loaded target and its drafter (or none), ready to generate. ``auto`` is the
    profile's choice when the profile or the machine default chose (``load``); ``config`` the
    resolved configuration it was loaded from (when it came from ``load``), whose target's
    measured costs (``target_costs``) size the drafts of a prediction (``stream(prediction=)``;
    a pair built from models alone drafts a prediction as far as K allows). ``log`` hears
    when those costs are measured (the first time on a machine: seconds).

    One generation at a time: the models hold one generation's caches, so a second one
    started while a stream is running (from another thread, or a stream not yet read to its
    end, cancelled or let go of) raises ``PairBusyError`` at once and the running one goes
    on unharmed. Threads that share a pair serialise their calls; or load one pair each."""

    def __init__(
        self,
        target: CausalLM,
        draft: CausalLM | Drafter | None,
        auto: AutoChoice | None = None,
        config: Configuration | None = None,
        log: Callable[[str], None] = lambda _: None,
    ) -> None:
        self.target = target
        self.draft = draft
        self.auto = auto
        self.config = config
        self.log = log
        self._grammars: Grammars | None = None
        self._busy = threading.Lock()  # held from a generation's start to its end

    @property
    def grammars(self) -> Grammars:
        """The target's constraints (``specdec.constraints``): its vocabulary for the grammar
        engine, built on first use, and the constraints checked so far."""
        if self._grammars is None:
            self._grammars = Grammars(self.target)
        return self._grammars

    def _claim(self) -> None:
        if not self._busy.acquire(blocking=False):
            raise PairBusyError(
                "this Pair is already generating (in another thread, or a stream not yet "
                "read to its end or cancelled): a Pair runs one generation at a time; finish "
                "or cancel() the other stream, or load a Pair per thread"
            )

    def target_costs(self) -> Costs | None:
        """The target's costs: a planned drafter's own, else (for a pair from ``load``) measured
        once per machine and cached (``log`` hears when), else None. Measuring runs the
        target: ``PairBusyError`` while a generation runs."""
        self._claim()
        try:
            return self._target_costs()
        finally:
            self._busy.release()

    def _target_costs(self) -> Costs | None:
        if isinstance(self.draft, PlannedSuffixDrafter):
            return self.draft.costs
        if self.config is None:
            return None
        return measured_costs(self.config.target, self.target, self.log)

    def prediction_drafter(
        self, prediction: str | Sequence[int], *, parse_special: bool = False
    ) -> PredictionDrafter:
        """A drafter of ``prediction`` (text, tokenized once as text: special-token text in
        it too, unless ``parse_special``; or token ids) in front of the pair's own drafter,
        which drafts where the prediction has no match."""
        if isinstance(prediction, str):
            check_text(prediction, "the prediction")
            ids = encode_text(
                self.target, prediction, add_special_tokens=False, parse_special=parse_special
            )
        else:
            ids = [int(t) for t in prediction]
            if any(not 0 <= t < self.target.vocab_size for t in ids):
                raise ConfigError(
                    f"prediction token ids must be in 0..{self.target.vocab_size - 1}"
                )
        return PredictionDrafter(
            ids, costs=self._target_costs(), fallback=as_drafter(self.draft, self.target)
        )

    def encode(
        self,
        prompt: str | None = None,
        *,
        messages: Sequence[Message] | None = None,
        system: str | None = None,
        raw: bool = False,
        chat: bool | None = None,
        parse_special: bool = False,
    ) -> list[int]:
        """Prompt text and/or chat messages -> token ids; chat by default (the target's chat
        template when it has one, raw text otherwise). See ``stream`` for the arguments."""
        request = make_request(
            prompt,
            messages=messages,
            system=system,
            raw=raw,
            chat=chat,
            parse_special=parse_special,
        )
        return self.prompt_ids(request)

    def prompt_ids(self, request: GenerationRequest) -> list[int]:
        """The request's prompt as token ids (token ids as they are; text and messages
        through the chat template when there is one, or as raw text)."""
        if request.prompt is not None and not isinstance(request.prompt, str):
            return list(request.prompt)
        return encode_request(
            self.target,
            request.prompt,
            messages=request.messages,
            system=request.system,
            chat=request.chat,
            parse_special=request.parse_special,
        )

    def default_k(self, prediction: bool = False) -> int | None:
        """K for a request that leaves it to the pair (the one place this is decided, for
        the API, the command line and the server): None where the profile's policy decides
        (a pair it chose, without a prediction); PLANNED_K for planned drafts and
        predictions, which size their drafts themselves below it; else DEFAULT_K."""
        if self.auto is not None and not prediction:
            return None
        planned = isinstance(self.draft, PlannedSuffixDrafter) or prediction
        return PLANNED_K if planned else DEFAULT_K

    def row_processor(
        self, request: GenerationRequest, prompt_ids: Sequence[int]
    ) -> RowProcessor | None:
        """What the request changes in the logits before sampling (``core.processors``),
        for the target's rows and the draft's alike; None when it changes nothing."""
        vocab = self.target.vocab_size
        bias = LogitBias(dict(request.logit_bias), vocab) if request.logit_bias else None
        penalties = Penalties(
            len(prompt_ids),
            vocab,
            presence=request.presence_penalty,
            frequency=request.frequency_penalty,
            repetition=request.repetition_penalty,
        )
        grammar = (
            None
            if request.constraint is None
            else self.grammars.processor(request.constraint, len(prompt_ids))
        )
        return chain([bias, penalties if penalties.active else None, grammar])

    stream = _streaming(make_request)

    def stream_request(self, request: GenerationRequest) -> TextStream:
        """Start the generation of a checked request (``specdec.request.make_request``: the
        arguments of ``stream``); iterate the returned ``TextStream`` for text pieces. The pair
        is this generation's until it ends (``PairBusyError`` for another meanwhile)."""
        self._claim()
        try:
            return self._stream(request)
        except BaseException:
            self._busy.release()
            raise

    def _stream(self, request: GenerationRequest) -> TextStream:
        ids = self.prompt_ids(request)
        prediction, max_new_tokens = request.prediction, request.max_new_tokens
        drafter: CausalLM | Drafter | None = self.draft
        if prediction is not None:
            drafter = self.prediction_drafter(prediction, parse_special=request.parse_special)
        k = request.k if request.k is not None else self.default_k(prediction is not None)
        policy: KPolicy
        if k is None:
            assert self.auto is not None
            policy = self.auto.policy()
        elif request.adaptive and k > 0:
            policy = capped_adaptive_k(k, max_new_tokens, self.target.n_ctx)
        else:
            policy = FixedK(k)
        plain = isinstance(policy, FixedK) and policy.k == 0  # no draft prefill either
        generation = generate_stream(
            self.target,
            None if plain else drafter,
            ids,
            max_new_tokens=max_new_tokens,
            k=policy,
            sampling=request.sampling,
            seed=request.seed,
            stop_on_eos=request.stop_on_eos,
            processor=self.row_processor(request, ids),
            logprobs=request.logprobs,
            prompt_logprobs=request.prompt_logprobs,
        )
        hidden = self.target.eos_token_ids if request.stop_on_eos else frozenset()
        decoder = IncrementalDecoder(self.target.tokenizer)
        return TextStream(generation, decoder, request.stops, hidden, on_end=self._busy.release)

    generate = drained(stream, "Completion", "stream")

    def compare(
        self,
        prompt: str | Sequence[int] | None = None,
        *,
        k: int | None = None,
        on_text: Callable[[str], None] | None = None,
        **options: Any,
    ) -> Comparison:
        """The same request (``stream``'s arguments) decoded plainly (k=0), then with ``k``
        (None: the pair's configuration): ``compare_request``."""
        return self.compare_request(make_request(prompt, k=k, **options), on_text=on_text)

    def compare_request(
        self, request: GenerationRequest, *, on_text: Callable[[str], None] | None = None
    ) -> Comparison:
        """A checked request decoded plainly (k=0), then as asked, after a short warm-up of
        both paths so that neither pays for one-time set-up; ``on_text`` gets the
        speculative run's text as it streams."""
        request = request.with_prompt_ids(self.prompt_ids(request))  # encoded once
        warm = dataclasses.replace(request, max_new_tokens=min(8, request.max_new_tokens))
        for k_warm in (0, request.k):
            self.stream_request(dataclasses.replace(warm, k=k_warm)).run()
        plain = self.stream_request(dataclasses.replace(request, k=0)).run()
        speculative = self.stream_request(request).run(on_text)
        return Comparison(plain, speculative, request.sampling.greedy)

    def speculates(self, k: int | None = None, prediction: object = None) -> bool:
        """Whether a request with this ``k`` (None: the configuration's) would draft at all."""
        if prediction is not None:
            return k != 0
        if k == 0 or self.draft is None:
            return False
        return k is not None or self.auto is None or self.auto.speculative


def load(
    target: str = DEFAULT_TARGET,
    draft: str | None = MACHINE_DEFAULT,
    *,
    target_backend: str = DEFAULT_TARGET_BACKEND,
    draft_backend: str = DEFAULT_DRAFT_BACKEND,
    device: str = "auto",
    dtype: str = "auto",
    draft_device: str | None = None,
    draft_dtype: str | None = None,
    n_ctx: int = 4096,
    n_threads: int | None = None,
    auto: bool = False,
    draft_window: int | None = None,
    exact: bool | None = None,
    prompt_tokens: int | None = None,
    new_tokens: int = 128,
    log: Callable[[str], None] = lambda _: None,
) -> Pair:
    """Load a target and a draft (models come from the verified store, a local GGUF file or a
    transformers directory) and check that they share one tokenizer.

    target:          store name (``specdec models list``), GGUF file or model directory.
    draft:           "default" (the default): what this machine's cached profile recommends,
                     else the cost-aware suffix drafter ("planned") on the target's own
                     backend; or a draft model (store name, GGUF file, model directory),
                     "hybrid:MODEL" (suffix drafts where they match, the model elsewhere),
                     "ngram[:MAX_N]", "suffix[:OPTS]", "planned[:OPTS]", or None / "none".
    target_backend, draft_backend: "llamacpp", "hf" (transformers), "mock" or "auto".
    device:          "auto" (cuda > mps > cpu), "cpu", "cuda" or "mps" (``draft_device``:
                     the draft's, when it differs).
    dtype:           transformers dtype: "auto", "float32", "bfloat16" or "float16"
                     (``draft_dtype``: the draft's, when it differs).
    n_ctx:           context window to allocate (prompt + output must fit).
    n_threads:       CPU threads (None: all cores).
    auto:            run what ``specdec profile`` recommends on this machine (profiled once,
                     then cached): the target's backend, the drafter or plain decoding, and K
                     adapted per round (reproducible). Left at their defaults, ``draft`` and
                     ``target_backend`` let the profile choose; other values narrow it.
    draft_window:    the draft model sees only the last ``draft_window`` tokens of the
                     context (an int >= 1, below ``n_ctx``): its prefill of a long prompt
                     shrinks to that many tokens, and the output stays the target's
                     (lossless). Needs a named draft model (not "default" or ``auto``).
    exact:           exact numerics for the target (llama.cpp; ``models.exact``): every
                     token's logits are the same whatever the number of tokens in its pass,
                     so the output is plain decoding's token for token (greedy) and sampled
                     output follows plain decoding's distribution exactly. Slower decode and
                     prefill on CPUs where llama.cpp's batched kernels are faster. None: what
                     ``specdec profile`` decided for this machine (exact where it costs at
                     most 3 %), else off.
    prompt_tokens, new_tokens: the size of the requests to come, when the profile chooses
                     (a prompt much longer than the probe's re-ranks its choices).
    log:             hears about a profile that ``auto`` runs first, and when the target's
                     costs are measured (for a planned drafter, or a request's prediction).
    """
    given = locals()  # the model keywords by name: ModelOptions' fields (a test keeps them one)
    options = ModelOptions(**{f.name: given[f.name] for f in dataclasses.fields(ModelOptions)})
    config = resolve(  # what to run, and why: the one place the profile decides
        target,
        draft,
        options,
        auto=auto,
        draft_window=draft_window,
        prompt_tokens=prompt_tokens,
        new_tokens=new_tokens,
        log=log,
    )
    from specdec.models.exact import NotExactError

    try:
        draft_model, target_model = load_pair(
            config.draft, config.target, costs=config.costs, draft_window=config.draft_window
        )
    except NotExactError as e:
        if exact is not None or not config.target.exact:
            raise  # asked for by the caller: its refusal is the answer
        # decided here, not asked for: a default never fails where plain numerics can run
        # (the self-check refuses when ggml's once-per-process switches were already read
        # by a model on default numerics, or on a build it finds not row-invariant)
        log(f"exact numerics refused their self-check, so llama.cpp's own numerics run: {e}")
        config = resolve(
            target,
            draft,
            dataclasses.replace(options, exact=False),
            auto=auto,
            draft_window=draft_window,
            prompt_tokens=prompt_tokens,
            new_tokens=new_tokens,
            log=log,
        )
        draft_model, target_model = load_pair(
            config.draft, config.target, costs=config.costs, draft_window=config.draft_window
        )
        note = "the default's exact numerics refused their self-check in this process"
        config = dataclasses.replace(config, numerics_note=note)
    return Pair(target_model, draft_model, config.choice, config=config, log=log)
